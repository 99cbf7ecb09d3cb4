"""A wheel built from the repo works outside the checkout: `yolo-cb cfg` runs and shapes.yaml resolves."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


# the installed wheel's processes see no PYTHONPATH: one naming a checkout (as when the suite runs from a worktree) would
# import that checkout's yolo_cb instead of the wheel's
WHEEL_ENV = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


def run(cmd, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=WHEEL_ENV, **kw)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return proc


def source_copy(folder: Path) -> Path:
    """The project's files (tracked, or new and not ignored) copied to `folder`: building there leaves the checkout untouched."""
    listed = run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT).stdout.split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, folder / name)
    return folder


def test_wheel_install_runs_cfg_and_resolves_shapes(tmp_path):
    dist = tmp_path / "dist"
    source = source_copy(tmp_path / "source")  # setuptools writes build/ beside the sources
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(source)])
    wheel = next(dist.glob("yolo_cb-*.whl"))
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])  # this pip installs into it: no ensurepip (7-10 s)
    py = venv / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index", str(wheel)])
    # dependencies (torch & co.) come from this interpreter's site-packages, as --system-site-packages would
    site = Path(run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = run([str(venv / "bin" / "yolo-cb"), "cfg"], cwd=elsewhere).stdout
    assert "no_aug_epochs" in out and "epochs" in out
    code = ("from yolo_cb.data.resolve import check_data; d = check_data('shapes.yaml', datasets_dir='ds'); "
            "import yolo_cb.utils.paths as p; assert 'site-packages' in str(p.CFG_DIR), p.CFG_DIR; print(d['nc'], len(d['names']))")
    out = run([str(py), "-c", code], cwd=elsewhere).stdout
    assert out.split()[-2:] == ["4", "4"]
    every_module = ("import importlib, pkgutil, yolo_cb; mods = [m.name for m in pkgutil.walk_packages(yolo_cb.__path__, 'yolo_cb.')]; "
                    "[importlib.import_module(m) for m in mods if not m.endswith('__main__')]; print(len(mods))")
    assert int(run([str(py), "-c", every_module], cwd=elsewhere).stdout.split()[-1]) > 30
    assert any((elsewhere / "ds").rglob("*.jpg"))
