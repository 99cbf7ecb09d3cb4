"""Ultralytics' setting names, so that a key yolo-cb lacks is refused as what it is, from the CLI and from Python alike.

    unknown_key_message("augment", load_defaults())  # "'augment' is an Ultralytics setting yolo-cb does not have ..."
    unknown_key_message("epoch", load_defaults())    # "'epoch' is not a valid yolo-cb argument. Did you mean 'epochs'? ..."
"""

from __future__ import annotations

from collections.abc import Iterable

from yolo_cb.utils.suggest import did_you_mean

# Ultralytics 8.4's settings (its default.yaml); those yolo-cb lacks get "an Ultralytics setting yolo-cb does not have"
ULTRALYTICS_KEYS = frozenset(
    "task mode model data epochs time patience batch imgsz save save_period cache device workers project name exist_ok pretrained "
    "optimizer verbose seed deterministic single_cls rect cos_lr close_mosaic resume amp fraction profile freeze multi_scale compile "
    "overlap_mask mask_ratio dropout val split save_json conf iou max_det half dnn plots source vid_stride stream_buffer visualize "
    "augment agnostic_nms classes retina_masks embed show save_frames save_txt save_conf save_crop show_labels show_conf show_boxes "
    "line_width format keras optimize int8 dynamic simplify opset workspace nms lr0 lrf momentum weight_decay warmup_epochs "
    "warmup_momentum warmup_bias_lr box cls dfl pose kobj nbs hsv_h hsv_s hsv_v degrees translate scale shear perspective flipud "
    "fliplr bgr mosaic mixup cutmix copy_paste copy_paste_mode auto_augment erasing cfg tracker".split())


def unknown_key_message(key: str, valid: Iterable[str], where: str = "") -> str:
    """The one line for a key that is no yolo-cb setting: an Ultralytics setting yolo-cb lacks says just that (a "did you
    mean" would name an unrelated setting); any other key gets the closest settings. `where`: " in <file>" or ""."""
    if key in ULTRALYTICS_KEYS:
        return (f"'{key}'{where} is an Ultralytics setting yolo-cb does not have (docs/ultralytics.md says what differs); drop it. "
                f"See all settings with `yolo-cb cfg`.")
    return f"'{key}'{where} is not a valid yolo-cb argument.{did_you_mean(key, valid)} See all with `yolo-cb cfg`."
