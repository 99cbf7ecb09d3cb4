"""Where the bundled configuration lives, in a source checkout and in an installed wheel."""

from __future__ import annotations

from pathlib import Path


def _find_cfg_dir() -> Path:
    # In a wheel, cfg/ is installed as the package data folder yolo_cb/cfg;
    # in a source checkout it sits beside the yolo_cb package.
    package_dir = Path(__file__).resolve().parents[1]  # yolo_cb/, this file being yolo_cb/utils/paths.py
    for candidate in (package_dir / "cfg", package_dir.parent / "cfg"):
        if (candidate / "default.yaml").is_file():
            return candidate
    raise FileNotFoundError(f"yolo-cb's cfg/ folder is missing (looked in {package_dir / 'cfg'} and {package_dir.parent / 'cfg'}); reinstall the package")


CFG_DIR = _find_cfg_dir()
DEFAULT_CFG = CFG_DIR / "default.yaml"
MODELS_DIR = CFG_DIR / "models"
DATASETS_CFG_DIR = CFG_DIR / "datasets"
DEFAULT_MODEL = "yolocb-n.yaml"  # the model YAML trained when none is named (the fastest learner from scratch, BENCHMARKS.md)


def _find_bundled(name: str, folder: Path, kind: str) -> Path:
    """Resolve `name` as a path, else as a bundled file in `folder` (with or without .yaml). A path that is there but is no
    folder (a FIFO, a device) is returned as it is, for its reader to refuse by name (read_bounded, yolo_cb/utils/files.py)."""
    try:
        path = Path(name).expanduser()
    except RuntimeError:  # ~nosuchuser
        raise FileNotFoundError(f"{kind} '{name[:200]}' not found: {name.split('/')[0][:100]!r} is the home folder of no user "
                                f"on this machine") from None
    if path.exists() and not path.is_dir():
        return path
    stem = path.name if path.suffix in (".yaml", ".yml") else path.name + ".yaml"
    bundled = folder / stem
    if bundled.is_file():
        return bundled
    known = sorted(p.name for p in folder.glob("*.yaml"))
    raise FileNotFoundError(f"{kind} '{name}' not found: not a file, and not bundled in {folder} (bundled: {', '.join(known)})")


def find_model_cfg(name: str) -> Path:
    """A model YAML path from a path or a bundled name such as 'yolox-nano' or 'yolox-s.yaml'."""
    return _find_bundled(str(name), MODELS_DIR, "model config")


def find_dataset_cfg(name: str) -> Path:
    """A dataset YAML path from a path or a bundled name such as 'shapes.yaml'."""
    return _find_bundled(str(name), DATASETS_CFG_DIR, "dataset config")
