"""`load_model_cfg` and `build_model`: a model YAML, a bundled name or a dict -> its family's architecture dict, and a YOLOX
or a YOLOCB built from it (each family lives in its own package, `yolo_cb.nn.yolox` and `yolo_cb.nn.yolocb`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml

from ..errors import ConfigError, short_repr
from ..utils.memory import available_memory
from ..utils.paths import MODELS_DIR, find_model_cfg
from ..utils.suggest import did_you_mean
from ..utils.yaml_safe import load_yaml
from .blocks import ACTIVATIONS
from .detector import Detector
from .summary import log_summary
from .yolocb.head import CLS_BRANCHES
from .yolocb.model import BODIES, YOLOCB, parse_yolocb_cfg
from .yolocb.model import FAMILY as YOLOCB_FAMILY
from .yolox.model import FAMILY as YOLOX_FAMILY
from .yolox.model import YOLOX, parse_yolox_cfg

DETECTORS: dict[str, type[Detector]] = {cls.family: cls for cls in (YOLOX, YOLOCB)}  # `family:` value -> its detector
FAMILIES = {family: cls.__name__ for family, cls in DETECTORS.items()}  # `family:` value -> display-name prefix
MAX_MULTIPLIER = 4.0  # the largest depth / width a model config may give (YOLOX-x: 1.33 / 1.25; 3x that is tens of GB)
NAMED_STATES = ("model", "ema", "grads")  # the checkpoint entries keyed by module names (state dicts, accumulated gradients)


def load_model_cfg(cfg: str | Path | dict) -> tuple[dict, str]:
    """The architecture dict and a display name (e.g. 'YOLOX-nano', 'YOLOCB-n') from a YAML path, a bundled name or a dict.

    The `family:` key picks the detector: yolox (the default when absent) or yolocb.
    """
    if isinstance(cfg, dict):
        data = dict(cfg)
        path = next((p for p in sorted(MODELS_DIR.glob("*.yaml")) if _same_arch(yaml.safe_load(p.read_text()) or {}, data)), None)
    else:
        path = find_model_cfg(str(cfg))
        if path.suffix.lower() not in (".yaml", ".yml"):
            raise ConfigError(f"model={cfg}: {path} is neither a yolo-cb checkpoint (.pt) nor a model YAML (.yaml, e.g. yolox-nano.yaml)")
        data = load_yaml(path, ConfigError, "model YAML")
        if not isinstance(data, dict):
            raise ConfigError(f"model={cfg}: {path} holds a {type(data).__name__}, not a mapping of model settings (depth, width, ...)")
    family = _family(data)
    if family not in FAMILIES:
        raise ConfigError(f"model config {short_repr(cfg)}: unknown family '{family}' (expected {' or '.join(FAMILIES)})")
    if path is None:
        name = str(data.get("name", FAMILIES[family]))
    elif path.stem.lower().startswith(family + "-"):
        name = FAMILIES[family] + "-" + path.stem.split("-", 1)[1]
    else:
        name = path.stem
    check_values(data, name)
    arch = parse_yolocb_cfg(data) if family == YOLOCB_FAMILY else parse_yolox_cfg(data, cfg)
    if not isinstance(cfg, dict):  # a YAML file: a key its family does not read would build a model silently without it
        refuse_unread_keys(data, {"family", "nc", *arch}, family, name)
    return arch, name


def refuse_unread_keys(data: dict, read: set[str], family: str, name: str) -> None:
    """ConfigError, one line, for a model YAML key that the `family` detector does not read (`depthwise:` in a yolocb
    YAML, `cls_branch:` in a yolox one, a misspelt `reg_maxx:`), naming the keys it does read."""
    unread = [str(key) for key in data if key not in read]
    if unread:
        raise ConfigError(f"model {name}: unknown key '{unread[0]}' for a {family} model (it would be ignored).{did_you_mean(unread[0], read)} "
                          f"A {family} model YAML takes: {', '.join(sorted(read))}")


def with_current_names(ckpt: dict) -> dict:
    """The checkpoint dict with its state dicts keyed as this version names the modules of its family (a YOLOCB written
    before its layers were one list: backbone.stem.* -> model.0.*); the same dict when nothing is renamed."""
    detector = DETECTORS.get(_family(ckpt.get("model_cfg") or {}))
    if detector is None:
        return ckpt
    renamed = {key: {detector.current_name(name): value for name, value in ckpt[key].items()}
               for key in NAMED_STATES if isinstance(ckpt.get(key), dict)}
    return {**ckpt, **renamed} if any(renamed[k].keys() != ckpt[k].keys() for k in renamed) else ckpt


def _family(data: dict) -> str:
    """The detector family a config dict names (`family:`), yolox when absent."""
    return str(data.get("family") or YOLOX_FAMILY).lower()


def _same_arch(a: dict, b: dict) -> bool:
    """Whether two config dicts describe the same architecture (so a stored cfg dict gets its bundled name back)."""
    try:
        if _family(a) != _family(b):
            return False
        if _family(a) == YOLOCB_FAMILY:
            a, b = parse_yolocb_cfg(a), parse_yolocb_cfg(b)
            return all(a[k] == b[k] for k in ("max_channels", "reg_max", "act", "cls_branch", "body")) and all(abs(a[k] - b[k]) < 1e-9 for k in ("depth", "width"))
        return all(str(a.get(k)) == str(b.get(k)) for k in ("depthwise", "act")) and all(
            abs(float(a[k]) - float(b[k])) < 1e-9 for k in ("depth", "width")
        )
    except (KeyError, TypeError, ValueError):
        return False


def build_model(cfg: str | Path | dict, nc: int, verbose: bool = True, imgsz: int = 640) -> Detector:
    """A freshly initialised detector from `cfg` (path, bundled name like 'yolox-nano' or 'yolocb-n', or dict), with `nc`
    classes: a YOLOX, or a YOLOCB when the config says `family: yolocb`.

    When verbose, logs one summary line (layers, parameters, GFLOPs at `imgsz`) to the 'yolo_cb' logger.
    """
    arch, name = load_model_cfg(cfg)
    arch.pop("nc", None)
    detector = DETECTORS[arch.pop("family", YOLOX_FAMILY)]  # a YOLOX arch has no family key
    check_size(detector, arch, nc, name)
    model = detector(nc=nc, name=name, **arch)
    if verbose:
        log_summary(model, imgsz)
    return model


def _number(low: float, high: float) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and low < v <= high


def _integer(low: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low


VALUE_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {  # a model config's key -> (its check, what it must be)
    "depth": (_number(0, MAX_MULTIPLIER), f"a number in (0, {MAX_MULTIPLIER:g}] (yolox-x has 1.33)"),
    "width": (_number(0, MAX_MULTIPLIER), f"a number in (0, {MAX_MULTIPLIER:g}] (yolox-x has 1.25)"),
    "depthwise": (lambda v: isinstance(v, bool), "true or false"),
    "act": (lambda v: v in ACTIVATIONS, f"one of {', '.join(ACTIVATIONS)}"),
    "nc": (_integer(1), "an integer >= 1 (the dataset's class count replaces it in training)"),
    "max_channels": (_integer(8), "an integer >= 8"),
    "reg_max": (_integer(2), "an integer >= 2"),
    "cls_branch": (lambda v: v in CLS_BRANCHES, f"one of {', '.join(CLS_BRANCHES)}"),
    "body": (lambda v: v in BODIES, f"one of {', '.join(BODIES)}"),
}


def check_values(data: dict, name: str) -> None:
    """ConfigError, one line naming the model, the key and its value, for a missing depth/width or a value its rule
    refuses (each was a traceback from deep in the build, or silently taken: `depthwise: maybe`)."""
    missing = [k for k in ("depth", "width") if k not in data]
    if missing:
        raise ConfigError(f"model {name}: the config lacks {' and '.join(missing)} (multipliers of the layers' depth and width)")
    for key, (fits, what) in VALUE_RULES.items():
        if key in data and not fits(data[key]):
            raise ConfigError(f"model {name}: {key}={short_repr(data[key])} is not {what}")


_PARAMETER_COUNTS: dict[tuple[type, str, int], int] = {}  # (detector, repr of its arch, nc) -> parameters, per process


def parameter_count(detector: type[Detector], arch: dict, nc: int) -> int:
    """The parameters of `detector` built from `arch` with `nc` classes, counted on the meta device (which allocates
    nothing), once per architecture in a process: a build under the meta device's dispatch mode takes as long as a real
    build (0.4 s for YOLOX-nano), and one process builds the same architecture again and again (the model of a run, the
    best.pt it validates at the end, each YOLO(path) of the same file)."""
    key = (detector, repr(sorted(arch.items())), nc)
    if key not in _PARAMETER_COUNTS:
        with torch.device("meta"):
            _PARAMETER_COUNTS[key] = sum(p.numel() for p in detector(nc=nc, **arch).parameters())
    return _PARAMETER_COUNTS[key]


def check_size(detector: type[Detector], arch: dict, nc: int, name: str) -> None:
    """ConfigError in one line before anything is allocated: a model whose fp32 weights (counted on the meta device,
    which allocates nothing) need more than half the memory this process may take (a checkpoint's or a YAML's few bytes
    once asked for tens of GB; depth and width are bounded by check_values first)."""
    parameters = parameter_count(detector, arch, nc)
    room = available_memory()
    if room is not None and 8 * parameters > room:
        raise ConfigError(f"model {name} with {nc} classes has {parameters / 1e6:,.0f}M parameters ({4 * parameters / 2**30:.1f} GiB "
                          f"of fp32 weights), more than half the {room / 2**30:.1f} GiB this process may take: use a smaller "
                          f"depth / width or fewer classes")
