"""Official YOLOX weights by name: `YOLO("yolox-s.pt")`, `model=yolox-s.pt`, `pretrained=yolox-s.pt`.

A name (yolox-nano.pt ... yolox-x.pt; yolox_s.pth, Megvii's asset name, works too) that is not a file here resolves to
Megvii's published checkpoint in the weights folder (setting `weights_dir`, else $YOLO_CB_WEIGHTS_DIR, else
~/.cache/yolo_cb/weights, or $XDG_CACHE_HOME/yolo_cb/weights). On first use the file is downloaded to a temporary file
in that folder and verified before it gets its name: its SHA-256 (against the published hash where one is pinned, and
against the one recorded by an earlier download), then it must load with torch.load(weights_only=True) and every tensor's
key and shape must be that variant's. Only then it is kept as yolox_s.pth, its SHA-256 written beside it
(yolox_s.pth.sha256, `sha256sum -c` format), and converted once to a yolo-cb checkpoint, yolox-s.pt, reused afterwards.
A refused download is deleted; nothing half-written is left in the folder. See docs/pretrained.md.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from yolo_cb.checkpoints import megvii
from yolo_cb.checkpoints.checkpoint import save_checkpoint, serialize_checkpoint
from yolo_cb.errors import CheckpointError
from yolo_cb.utils.download import fetch
from yolo_cb.utils.files import atomic_write_bytes, write_error
from yolo_cb.utils.log import LOGGER

RELEASE = "https://github.com/Megvii-BaseDetection/YOLOX/releases/download/0.1.1rc0/"  # Megvii's README, "Benchmark"
ENV_DIR = "YOLO_CB_WEIGHTS_DIR"


@dataclass(frozen=True)
class Official:
    variant: str  # bundled model YAML name, e.g. yolox-s
    file: str  # Megvii's release asset, e.g. yolox_s.pth
    url: str
    sha256: str | None = None  # pinned where a hash of the release asset is known; else recorded on first download

    @property
    def converted(self) -> str:
        return f"{self.variant}.pt"


# SHA-256 of yolox_nano.pth: not published by Megvii; the same value is recorded by several independent projects that
# download this release asset (e.g. their setup scripts and READMEs). No hash was found for the other files.
OFFICIAL = {
    v: Official(v, f"yolox_{v.split('-', 1)[1]}.pth", f"{RELEASE}yolox_{v.split('-', 1)[1]}.pth", sha)
    for v, sha in (("yolox-nano", "cd28f55fbbc1829f99d9ac9b38a16d259a22889739c8728ea877610201feff7b"), ("yolox-tiny", None),
                   ("yolox-s", None), ("yolox-m", None), ("yolox-l", None), ("yolox-x", None))
}


def weights_dir(setting: Any = None) -> Path:
    """The weights folder: `setting` (weights_dir=), else $YOLO_CB_WEIGHTS_DIR, else <user cache>/yolo_cb/weights."""
    if setting not in (None, ""):
        return Path(str(setting)).expanduser()
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache).expanduser() / "yolo_cb" / "weights"


def official_variant(name: Any) -> str | None:
    """'yolox-s' for a bare weights name such as yolox-s.pt, yolox_s.pt or yolox_s.pth; None for anything else."""
    if not isinstance(name, (str, Path)):
        return None
    text = str(name)
    if "/" in text or "\\" in text or not text.lower().endswith((".pt", ".pth")):
        return None
    variant = text.lower().rsplit(".", 1)[0].replace("_", "-")
    return variant if variant in OFFICIAL else None


def is_weights_name(model: Any) -> bool:
    """Whether `model` names official weights to fetch: an official name that is not a file here."""
    return official_variant(model) is not None and not Path(str(model)).is_file()


# Ultralytics' weights names (yolov8n.pt, yolo11s-seg.pt, yolov5su.pt, ...): another architecture, never loadable here
ULTRALYTICS_WEIGHTS = re.compile(r"yolo(v\d+|\d+)[a-z]*(-[a-z0-9]+)?\.pt", re.IGNORECASE)


def refuse_ultralytics_weights(model: Any) -> None:
    """CheckpointError (one line) for an Ultralytics weights name that is no file here, naming the weights yolo-cb loads."""
    if isinstance(model, (str, Path)) and ULTRALYTICS_WEIGHTS.fullmatch(Path(str(model)).name) and not Path(str(model)).is_file():
        raise CheckpointError(f"'{model}' names Ultralytics weights, which yolo-cb cannot load (another architecture). Official "
                              f"weights it loads by name: {', '.join(f'{v}.pt' for v in OFFICIAL)}; or train from a model YAML "
                              f"(model=yolox-nano.yaml, yolocb-n.yaml)")


def resolve_weights(model: Any, folder: Any = None) -> Any:
    """`model` itself, unless it names official weights (see is_weights_name): then the path of the verified yolo-cb
    checkpoint in the weights folder, downloaded and converted on first use. Ultralytics' weights names are refused."""
    if not is_weights_name(model):
        refuse_ultralytics_weights(model)
        return model
    return fetch_official(official_variant(model), weights_dir(folder))


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _read_record(record: Path) -> str | None:
    try:
        text = record.read_text().split()
    except FileNotFoundError:
        return None
    if not text or len(text[0]) != 64:
        raise CheckpointError(f"{record} does not hold a SHA-256 (expected '<64 hex digits>  <file name>'); delete it to record a new one")
    return text[0].lower()


def _check_hash(digest: str, spec: Official, recorded: str | None, record: Path, label: str, removed: bool) -> None:
    """Refuse a file whose SHA-256 is not the pinned one, or not the one recorded by an earlier download."""
    fate = "; the download was deleted" if removed else ""
    if spec.sha256 and digest != spec.sha256:
        raise CheckpointError(f"refused {label}: its SHA-256 {digest} is not the known hash of Megvii's {spec.file} ({spec.sha256}){fate}. "
                              f"Get the file from {spec.url}")
    if recorded and digest != recorded:
        raise CheckpointError(f"refused {label}: its SHA-256 {digest} differs from {recorded}, recorded in {record} when {spec.file} was "
                              f"first verified{fate}. If the new file is the one you want, delete {record} and try again")


def _verify(path: Path, spec: Official, label: str) -> dict:
    """The yolo-cb checkpoint converted from Megvii's file at `path`, once it loads with weights_only=True and has every key
    and shape of `spec`'s variant with 80 classes; CheckpointError naming what does not match otherwise."""
    import pickle

    import torch

    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise CheckpointError(f"refused {label}: it does not load with torch.load(weights_only=True) (truncated, or pickled objects beyond "
                              f"tensors and plain data): {str(error).splitlines()[0] if str(error) else type(error).__name__}") from None
    except (RuntimeError, EOFError, ValueError, OSError) as error:
        raise CheckpointError(f"refused {label}: not a readable torch file (truncated?): "
                              f"{str(error).splitlines()[0] if str(error) else type(error).__name__}") from None
    if not megvii.is_megvii_checkpoint(obj):
        raise CheckpointError(f"refused {label}: it {megvii.describe_format_mismatch(obj)}")
    arch = {**megvii.bundled_variants()[spec.variant], "nc": 80}
    problem = megvii.describe_mismatch(obj["model"], megvii.expected_shapes(arch))
    if problem:
        try:
            _, found = megvii.infer_arch(obj["model"])
        except CheckpointError:
            found = None
        looks = f" (it looks like {found})" if found and found != spec.variant else ""
        raise CheckpointError(f"refused {label}: its tensors are not {spec.variant}'s with 80 classes{looks}: {problem}")
    return megvii.convert(obj, path)


def _converted_hash(path: Path) -> str | None:
    """The SHA-256 of the Megvii file a converted checkpoint was made from (None if unreadable or not recorded)."""
    import torch

    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return str(ckpt["source"]["sha256"])
    except Exception:
        return None


def fetch_official(variant: str, folder: Path) -> Path:
    """The verified yolo-cb checkpoint for an official variant in `folder`: reused, converted from a Megvii file already
    there (downloaded earlier or put there by hand), or downloaded, verified and converted (see the module docstring)."""
    spec = OFFICIAL[variant]
    folder = Path(folder)
    raw, converted = folder / spec.file, folder / spec.converted
    record = raw.with_name(raw.name + ".sha256")
    recorded = _read_record(record)
    if raw.is_file():
        digest = sha256_file(raw)
        _check_hash(digest, spec, recorded, record, str(raw), removed=False)
        if converted.is_file() and _converted_hash(converted) == digest:
            return converted
        ckpt = _verify(raw, spec, str(raw))
    elif converted.is_file() and recorded and _converted_hash(converted) == recorded:
        return converted  # the Megvii file was deleted after conversion: the converted copy of the verified file stands
    else:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise write_error(error, folder, "the weights folder (weights_dir)") from None
        raw_tmp = _download(spec, folder, raw)
        try:
            digest = sha256_file(raw_tmp)
            _check_hash(digest, spec, recorded, record, f"the download of {spec.url}", removed=True)
            ckpt = _verify(raw_tmp, spec, f"the download of {spec.url}")
            os.replace(raw_tmp, raw)
        except BaseException:
            raw_tmp.unlink(missing_ok=True)
            raise
        LOGGER.info(f"downloaded and verified {spec.url} -> {raw} (SHA-256 {digest})")
    if recorded is None:
        atomic_write_bytes(record, f"{digest}  {spec.file}\n".encode())
    ckpt["source"].update({"sha256": digest, "url": spec.url, "file": str(raw)})
    save_checkpoint(serialize_checkpoint(ckpt), converted)  # the converted dict as it is (megvii.convert)
    LOGGER.info(f"converted {raw} to {converted} ({variant}, 80 COCO classes, input RGB in [0, 1])")
    return converted


def _download(spec: Official, folder: Path, raw: Path) -> Path:
    """Megvii's file fetched into a new temp file in `folder` (removed on failure); an offline error says what to do."""
    from http.client import HTTPException

    LOGGER.info(f"{spec.variant}: downloading Megvii's official weights {spec.url} into {folder}")
    try:
        return fetch(spec.url, folder, spec.file)
    except (OSError, HTTPException) as error:  # URLError, HTTPError, timeouts, an incomplete transfer
        reason = getattr(error, "reason", None) or error
        raise CheckpointError(f"cannot download the {spec.variant} weights from {spec.url} ({reason}). Offline? Download that file "
                              f"elsewhere and put it at {raw}: it is verified and converted on first use. Or pass the file itself: "
                              f"model=/path/to/{spec.file}") from None
