"""The YOLOX family: CSPDarknet + PAFPN backbone (`backbone`), decoupled head (`head`), SimOTA loss (`loss`), the detector
(`model`) and Megvii's official weights (`megvii`). No imports here: `yolo_cb.nn` re-exports YOLOX."""
