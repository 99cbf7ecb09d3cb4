"""train() resolves its settings (yolo_cb.settings.config.get_config) exactly once per call: a plain run, resume=auto starting a
fresh run, and resume=auto continuing an interrupted one."""

from __future__ import annotations

import pytest

import yolo_cb.cli
import yolo_cb.model
import yolo_cb.settings.config
import yolo_cb.settings.resume
import yolo_cb.training.plan
import yolo_cb.training.resume
from yolo_cb import YOLO

pytestmark = pytest.mark.slow
# imgsz 64: at 32 the model summary (GFLOPs, yolo_cb/nn/summary.py) runs BatchNorm on a 1x1 map of batch 1 and fails
TINY = dict(imgsz=64, batch=8, workers=0, mosaic=0.0, mlflow=False, tensorboard=False, onnx_check=False, plots=False,
            no_aug_epochs=0, warmup_epochs=0.0, optimizer="AdamW", lr0=0.002, val=False)


@pytest.fixture
def resolutions(monkeypatch):
    """The number of get_config calls so far, wherever it is imported from."""
    calls = []
    original = yolo_cb.settings.config.get_config

    def counted(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    for module in (yolo_cb.settings.config, yolo_cb.settings.resume, yolo_cb.model, yolo_cb.training.plan, yolo_cb.training.resume,
                   yolo_cb.cli):
        monkeypatch.setattr(module, "get_config", counted)
    return calls


class Interrupt(Exception):
    pass


def interrupt_after_first_epoch(trainer):
    if trainer.epoch == 0:
        raise Interrupt("stop here")


def test_train_resolves_the_settings_once(tmp_path, shapes_small_yaml, resolutions):
    run = {**TINY, "data": str(shapes_small_yaml), "project": str(tmp_path / "runs")}
    YOLO("yolox-nano.yaml").train(**run, epochs=1, name="plain")
    assert len(resolutions) == 1

    resolutions.clear()
    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_fit_epoch_end", interrupt_after_first_epoch)
    with pytest.raises(Exception, match="stop here"):
        model.train(**run, epochs=2, name="auto", resume="auto")  # no last.pt yet: a fresh run in runs/auto
    assert len(resolutions) == 1
    assert (tmp_path / "runs" / "auto" / "weights" / "last.pt").is_file()

    resolutions.clear()
    YOLO("yolox-nano.yaml").train(**run, epochs=2, name="auto", resume="auto")  # continues the interrupted run
    assert len(resolutions) == 1


def test_cli_train_resolves_the_settings_once(tmp_path, shapes_small_yaml, resolutions):
    """`yolo-cb train ...` checks its settings before torch loads and trains with that very resolution."""
    run = {**TINY, "data": str(shapes_small_yaml), "project": str(tmp_path / "runs"), "epochs": 1, "name": "cli"}
    yolo_cb.cli.run(["train", "model=yolox-nano.yaml", *(f"{k}={v}" for k, v in run.items())])
    assert len(resolutions) == 1
    assert (tmp_path / "runs" / "cli" / "weights" / "last.pt").is_file()


def test_cli_resume_resolves_the_settings_once(tmp_path, shapes_small_yaml, resolutions):
    """`yolo-cb train resume=last.pt` (and resume=auto) checks the given settings before torch loads, then resolves the
    run's settings once: the checkpoint's, under those given (it resolved them twice: cli.py, then the resume's plan)."""
    run = {**TINY, "data": str(shapes_small_yaml), "project": str(tmp_path / "runs"), "name": "clires"}
    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_fit_epoch_end", interrupt_after_first_epoch)
    with pytest.raises(Exception, match="stop here"):
        model.train(**run, epochs=2)
    last = tmp_path / "runs" / "clires" / "weights" / "last.pt"

    resolutions.clear()
    yolo_cb.cli.run(["train", f"resume={last}"])
    assert len(resolutions) == 1

    resolutions.clear()  # resume=auto of the now finished run: its folder, no training, one resolution
    yolo_cb.cli.run(["train", "model=yolox-nano.yaml", "resume=auto", *(f"{k}={v}" for k, v in {**run, "epochs": 2}.items())])
    assert len(resolutions) == 1


def test_cli_resume_still_refuses_a_bad_setting_in_one_line_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        yolo_cb.cli.entrypoint(["train", "resume=missing.pt", "epochs=-3"])
    assert exit_.value.code == 2 and "epochs" in capsys.readouterr().err
