"""train() resolves its settings (yolo_cb.settings.config.get_config) exactly once per call: a plain run, resume=auto starting a
fresh run, and resume=auto continuing an interrupted one. So is every other fact of a run's plan (issue 60): the cfg=
file is read once, `callbacks=` parsed once, the processes counted once, the weights resolved once, and on resume the
dataset's images listed once."""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field

import pytest
import yaml

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


@dataclass
class Facts:
    """The arguments of each call that computes one of a run's facts."""

    cfg_reads: list = field(default_factory=list)  # load_cfg_file: the cfg= file read
    parses: list = field(default_factory=list)  # registry.parse_specs entered from outside (callbacks= read)
    world_sizes: list = field(default_factory=list)  # world_size_for: the processes counted
    weights: list = field(default_factory=list)  # resolve_weights: a model or pretrained= value resolved
    listings: list = field(default_factory=list)  # the dataset's images listed for its fingerprint (resume's check, the checkpoint)

    def clear(self) -> None:
        for calls in vars(self).values():
            calls.clear()


def count_calls(monkeypatch, calls: list, name: str, home) -> None:
    """Every loaded yolo_cb module's `name` that is `home.name` counts its calls' first argument into `calls`."""
    original = getattr(home, name)

    def counted(*args, **kwargs):
        calls.append(args[0] if args else None)
        return original(*args, **kwargs)

    for module in [m for key, m in sys.modules.items() if key.startswith("yolo_cb") and m is not None]:
        if getattr(module, name, None) is original:
            monkeypatch.setattr(module, name, counted)


@pytest.fixture
def facts(monkeypatch) -> Facts:
    import yolo_cb.callbacks.spec_check
    import yolo_cb.checkpoints.weights

    found = Facts()
    count_calls(monkeypatch, found.cfg_reads, "load_cfg_file", yolo_cb.settings.config)
    monkeypatch.setattr(yolo_cb.callbacks.spec_check, "parse_specs", counting(found.parses, yolo_cb.callbacks.spec_check.parse_specs))
    count_calls(monkeypatch, found.world_sizes, "world_size_for", yolo_cb.training.plan)
    count_calls(monkeypatch, found.weights, "resolve_weights", yolo_cb.checkpoints.weights)
    monkeypatch.setattr(yolo_cb.training.resume, "list_image_files", counting(found.listings, yolo_cb.training.resume.list_image_files))
    return found


def counting(calls: list, fn):
    def counted(*args, **kwargs):
        calls.append(args[0] if args else None)
        return fn(*args, **kwargs)
    return counted


def once_each(calls: list) -> bool:
    """Each value computed once (and something computed)."""
    return bool(calls) and max(Counter(map(str, calls)).values()) == 1


class Interrupt(Exception):
    pass


def interrupt_after_first_epoch(trainer):
    if trainer.epoch == 0:
        raise Interrupt("stop here")


def test_train_resolves_the_settings_once(tmp_path, shapes_small_yaml, resolutions, facts, monkeypatch):
    monkeypatch.setenv("CBPKG_LOG", str(tmp_path / "cbpkg.log"))
    run = {**TINY, "data": str(shapes_small_yaml), "project": str(tmp_path / "runs"), "callbacks": "on_fit_epoch_end=cbpkg:log_epoch"}
    YOLO("yolox-nano.yaml").train(**run, epochs=1, name="plain")
    assert len(resolutions) == 1
    assert len(facts.parses) == 1 and len(facts.world_sizes) == 1 and facts.weights.count("yolox-nano.yaml") == 1
    assert facts.cfg_reads == [] and once_each(facts.listings)  # the fingerprint the checkpoints record: counted once

    resolutions.clear()
    facts.clear()
    cfg = tmp_path / "run.yaml"  # resume=auto finds its folder from the cfg= file, which the settings also read: once
    cfg.write_text(yaml.safe_dump({"name": "auto", "epochs": 2}))
    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_fit_epoch_end", interrupt_after_first_epoch)
    with pytest.raises(Exception, match="stop here"):
        model.train(**run, cfg=str(cfg), resume="auto")  # no last.pt yet: a fresh run in runs/auto
    assert len(resolutions) == 1 and len(facts.cfg_reads) == 1 and len(facts.parses) == 1 and len(facts.world_sizes) == 1
    assert (tmp_path / "runs" / "auto" / "weights" / "last.pt").is_file()

    resolutions.clear()
    facts.clear()
    YOLO("yolox-nano.yaml").train(**run, cfg=str(cfg), resume="auto")  # continues the interrupted run
    assert len(resolutions) == 1 and len(facts.cfg_reads) == 1 and len(facts.parses) == 1 and len(facts.world_sizes) == 1
    assert once_each(facts.listings)  # the plan's check of the dataset; the checkpoints record what it counted
    assert "yolox-nano.yaml" not in facts.weights  # a resume builds the checkpoint's model


def test_cli_train_resolves_the_settings_once(tmp_path, shapes_small_yaml, resolutions, facts, monkeypatch):
    """`yolo-cb train ...` checks its settings before torch loads and trains with that very resolution."""
    monkeypatch.setenv("CBPKG_LOG", str(tmp_path / "cbpkg.log"))
    run = {**TINY, "data": str(shapes_small_yaml), "project": str(tmp_path / "runs"), "epochs": 1, "name": "cli",
           "callbacks": "on_fit_epoch_end=cbpkg:log_epoch"}
    yolo_cb.cli.run(["train", "model=yolox-nano.yaml", *(f"{k}={v}" for k, v in run.items())])
    assert len(resolutions) == 1
    assert len(facts.parses) == 1 and len(facts.world_sizes) == 1 and facts.weights.count("yolox-nano.yaml") == 1
    assert (tmp_path / "runs" / "cli" / "weights" / "last.pt").is_file()


def test_cli_resume_resolves_the_settings_once(tmp_path, shapes_small_yaml, resolutions, facts):
    """`yolo-cb train resume=last.pt` (and resume=auto) checks the given settings before torch loads, then resolves the
    run's settings once: the checkpoint's, under those given (it resolved them twice: cli.py, then the resume's plan)."""
    run = {**TINY, "data": str(shapes_small_yaml), "project": str(tmp_path / "runs"), "name": "clires"}
    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_fit_epoch_end", interrupt_after_first_epoch)
    with pytest.raises(Exception, match="stop here"):
        model.train(**run, epochs=2)
    last = tmp_path / "runs" / "clires" / "weights" / "last.pt"

    resolutions.clear()
    facts.clear()
    yolo_cb.cli.run(["train", f"resume={last}"])
    assert len(resolutions) == 1
    assert len(facts.world_sizes) == 1 and once_each(facts.listings) and facts.weights == []

    resolutions.clear()  # resume=auto of the now finished run: its folder, no training, one resolution
    yolo_cb.cli.run(["train", "model=yolox-nano.yaml", "resume=auto", *(f"{k}={v}" for k, v in {**run, "epochs": 2}.items())])
    assert len(resolutions) == 1


def test_cli_resume_still_refuses_a_bad_setting_in_one_line_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        yolo_cb.cli.entrypoint(["train", "resume=missing.pt", "epochs=-3"])
    assert exit_.value.code == 2 and "epochs" in capsys.readouterr().err


def test_a_ddp_launch_counts_its_processes_and_reads_its_callbacks_once(tmp_path, shapes_small_yaml, facts, monkeypatch):
    """The launcher's plan counts the processes (launch_ddp takes them from the plan) and reads callbacks= once; each
    worker plans its own run in its own process."""
    monkeypatch.setenv("CBPKG_LOG", str(tmp_path / "cbpkg.log"))
    run = {**TINY, "data": str(shapes_small_yaml), "project": str(tmp_path / "runs"), "name": "ddp", "epochs": 1, "nproc": 2,
           "device": "cpu", "callbacks": "on_fit_epoch_end=cbpkg:log_epoch"}
    YOLO("yolox-nano.yaml").train(**run)
    assert len(facts.world_sizes) == 1 and len(facts.parses) == 1 and facts.weights.count("yolox-nano.yaml") == 1
    assert (tmp_path / "runs" / "ddp" / "weights" / "last.pt").is_file()
