"""The YOLOX family: CSPDarknet + PAFPN backbone (`backbone`), decoupled head (`head`), SimOTA loss (`loss`) and the detector
(`model`); Megvii's official weight files are read by yolo_cb/checkpoints/megvii.py. No imports here: `yolo_cb.nn` re-exports YOLOX."""
