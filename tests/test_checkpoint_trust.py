"""A checkpoint names no code and no place to write (issue 26.1): crafted `train_args` in a file that loads with
weights_only=True never import or run anything, and never decide where a resumed run writes. Real CLI subprocesses."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import yaml
from test_resume_safety import SMALL, cli

from yolo_cb import YOLO
from yolo_cb.checkpoints.checkpoint import load_checkpoint

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory, trained_copy) -> tuple[Path, Path]:
    """(last.pt of a finished one-epoch yolocb-n run on 8 / 4 images (the CLI default model), its data YAML), trained once per test run (conftest)."""
    run = trained_copy(tmp_path_factory.mktemp("trust"), n_train=8, n_val=4, **SMALL, model="yolocb-n.yaml", epochs=1, name="base")
    return run / "weights" / "last.pt", Path(yaml.safe_load((run / "args.yaml").read_text())["data"])


def craft(trained: Path, folder: Path, **train_args) -> Path:
    """A copy of `trained` that a resume would continue (unfinished, epochs=2), with `train_args` written into it,
    saved where the run never was (so its own run folder is not beside it)."""
    ckpt = torch.load(trained, weights_only=True)
    ckpt["finished"] = False
    ckpt["train_args"].update(epochs=2, **train_args)
    ckpt["epochs"] = 2
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(ckpt, folder / "evil.pt")
    return folder / "evil.pt"


def evil_module(folder: Path, marker: Path) -> Path:
    """A module that creates `marker` when it is imported (what a crafted import path would run)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "evilmod.py").write_text(f"open({str(marker)!r}, 'w').close()\ndef fn(obj):\n    pass\n")
    return folder


def one_line_error(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-3000:]
    assert lines and lines[-1].startswith("yolo-cb: error:") and "Traceback" not in result.stderr, result.stderr[-3000:]
    return lines[-1]


def test_callbacks_recorded_in_a_checkpoint_never_run(tmp_path, trained):
    marker = tmp_path / "PWNED"
    evil = craft(trained[0], tmp_path / "loose", callbacks=[{"subprocess:Popen": {"args": ["touch", str(marker)]}}])
    line = one_line_error(cli(tmp_path, f"resume={evil}"))
    assert not marker.exists()
    assert "callbacks=" in line and "give callbacks= again" in line and len(line) < 400, line


def test_lr_scheduler_naming_code_in_a_checkpoint_is_never_imported(tmp_path, trained):
    marker = tmp_path / "PWNED"
    modules = evil_module(tmp_path / "mods", marker)
    evil = craft(trained[0], tmp_path / "loose", lr_scheduler="evilmod:fn")
    line = one_line_error(cli(tmp_path, f"resume={evil}", env={"PYTHONPATH": f"{modules}"}))
    assert not marker.exists()
    assert "lr_scheduler=" in line, line


def test_a_resume_takes_no_settings_file_and_no_place_from_the_checkpoint(tmp_path, trained):
    """The crafted file names a cfg= declaring an importing callback, a project, a datasets_dir and a weights_dir: the
    resume runs none of it, and writes only into the project= the user gives."""
    marker = tmp_path / "PWNED"
    modules = evil_module(tmp_path / "mods", marker)
    settings = tmp_path / "evil_cfg.yaml"
    settings.write_text(yaml.safe_dump({"callbacks": ["on_train_start=evilmod:fn"]}))
    places = {key: tmp_path / key for key in ("project", "datasets_dir", "weights_dir")}
    evil = craft(trained[0], tmp_path / "loose", cfg=str(settings), name="evil_name", **{k: str(v) for k, v in places.items()})
    done = cli(tmp_path, f"resume={evil}", f"project={tmp_path / 'mine'}", env={"PYTHONPATH": f"{modules}"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert not marker.exists()
    assert not any(path.exists() for path in places.values()), [p for p in places.values() if p.exists()]
    resumed = [p.parent.parent for p in (tmp_path / "mine").glob("*/weights/last.pt")]
    assert [p.name for p in resumed] == ["train"], resumed  # the default name, not the checkpoint's
    assert load_checkpoint(resumed[0] / "weights" / "last.pt").epoch == 1
    assert sorted(p.name for p in (tmp_path / "loose").iterdir()) == ["evil.pt"]  # nothing written beside the file


def test_code_given_again_on_resume_is_the_users_own(tmp_path, trained):
    """Giving the setting again (here: empty, to resume without it) is what a resume of such a checkpoint needs."""
    evil = craft(trained[0], tmp_path / "loose", callbacks=["on_train_start=cbpkg:log_epoch"])
    done = cli(tmp_path, f"resume={evil}", "callbacks=", f"project={tmp_path / 'mine'}")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert load_checkpoint(tmp_path / "mine" / "train" / "weights" / "last.pt").epoch == 1


def test_a_checkpoint_as_the_model_names_no_datasets_dir(tmp_path, trained, monkeypatch):
    evil = craft(trained[0], tmp_path / "loose", datasets_dir=str(tmp_path / "evil_datasets"))
    monkeypatch.chdir(tmp_path)
    model = YOLO(str(evil))
    assert "datasets_dir" not in model.overrides
    model.val(data=str(trained[1]), imgsz=64, batch=4, workers=0, plots=False, project=str(tmp_path / "val"))
    assert not (tmp_path / "evil_datasets").exists()
    shutil.rmtree(tmp_path / "val")
