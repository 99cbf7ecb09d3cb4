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
    "fliplr bgr mosaic mixup cutmix copy_paste copy_paste_mode auto_augment erasing cfg tracker".split()) | frozenset(
    "cls_remap quantize distill_model dis cls_pw rle angle dlog dgrad dlam".split())

# The settings of Ultralytics 8.4.190's default.yaml (what `yolo copy-cfg` writes) that yolo-cb does not have, with the
# value that file gives each: a cfg= file holding one at that value asks for nothing yolo-cb lacks, so it is accepted
# (and said); at any other value it is refused.
ULTRALYTICS_DEFAULTS: dict[str, object] = {
    "cls_remap": True, "profile": False, "multi_scale": 0.0, "overlap_mask": True, "mask_ratio": 4, "dropout": 0.0, "quantize": None,
    "dnn": False, "stream_buffer": False, "visualize": False, "retina_masks": False, "save_frames": False,
    "show_boxes": True, "optimize": False, "workspace": None, "distill_model": None, "dis": 6.0, "cls": 0.5, "cls_pw": 0.0, "dfl": 1.5,
    "pose": 12.0, "kobj": 1.0, "rle": 1.0, "angle": 1.0, "dlog": 1.0, "dgrad": 0.5, "dlam": 1.0, "bgr": 0.0,
    "cutmix": 0.0, "copy_paste": 0.0, "copy_paste_mode": "flip", "auto_augment": "randaugment", "erasing": 0.4}
NULL_IS_DEFAULT = ("opset", "channels_last", "nms")  # Ultralytics' file has `opset:` (null) for "the default": so it is here


def split_cfg_keys(loaded: dict, valid: Iterable[str]) -> tuple[list[str], list[str], list[str]]:
    """(refused, left out, null = default) keys of a cfg= file: refused are keys yolo-cb does not have, other than an
    Ultralytics setting at Ultralytics' default (left out); null are NULL_IS_DEFAULT keys left empty."""
    valid = set(valid)
    unknown = [k for k in loaded if k not in valid]
    left_out = [k for k in unknown if k in ULTRALYTICS_DEFAULTS and _same(loaded[k], ULTRALYTICS_DEFAULTS[k])]
    nulls = [k for k in loaded if k in NULL_IS_DEFAULT and loaded[k] is None]
    return [k for k in unknown if k not in left_out], left_out, nulls


def _same(value: object, default: object) -> bool:
    """value is `default` as YAML gives it: 4 and 4.0 alike, but False is not 0 and "false" is not False."""
    if isinstance(default, (bool, str)) or default is None or isinstance(value, bool):
        return type(value) is type(default) and value == default
    return isinstance(value, (int, float)) and value == default


def refused_keys_message(loaded: dict, refused: list[str], valid: Iterable[str], path: str) -> str:
    """One message for every refused key of the cfg= file `path`, each with its reason."""
    valid = list(valid)
    if len(refused) == 1 and refused[0] not in ULTRALYTICS_DEFAULTS:
        return unknown_key_message(refused[0], valid, f" in {path}")
    where = f"cfg={path}"
    reasons = []
    for key in refused:
        if key in ULTRALYTICS_DEFAULTS:
            reasons.append(f"'{key}: {loaded[key]}' (an Ultralytics setting yolo-cb does not have; only Ultralytics' default "
                           f"{ULTRALYTICS_DEFAULTS[key]!r} is accepted, as asking for nothing)")
        elif key in ULTRALYTICS_KEYS:
            reasons.append(f"'{key}' (an Ultralytics setting yolo-cb does not have)")
        else:
            reasons.append(f"'{key}' (not a yolo-cb setting.{did_you_mean(key, valid)})")
    return (f"{where}: {len(refused)} setting{'s' if len(refused) > 1 else ''} yolo-cb cannot use: {'; '.join(reasons)}. Drop "
            f"{'them' if len(refused) > 1 else 'it'} (docs/ultralytics.md says what differs; all settings: `yolo-cb cfg`)")


def unknown_key_message(key: str, valid: Iterable[str], where: str = "") -> str:
    """The one line for a key that is no yolo-cb setting: an Ultralytics setting yolo-cb lacks says just that (a "did you
    mean" would name an unrelated setting); any other key gets the closest settings. `where`: " in <file>" or ""."""
    if key in ULTRALYTICS_KEYS:
        return (f"'{key}'{where} is an Ultralytics setting yolo-cb does not have (docs/ultralytics.md says what differs); drop it. "
                f"See all settings with `yolo-cb cfg`.")
    return f"'{key}'{where} is not a valid yolo-cb argument.{did_you_mean(key, valid)} See all with `yolo-cb cfg`."
