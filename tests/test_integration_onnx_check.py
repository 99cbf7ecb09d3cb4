"""ONNX check: real export, onnx.checker and onnxruntime; a faithful model passes, a broken one is reported."""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

import pytest
import torch

import yolo_cb.nn
from yolo_cb import YOLO
from yolo_cb.callbacks.dispatch import CallbackError
from yolo_cb.export.checks import onnx_roundtrip
from yolo_cb.integrations.onnx_check import OnnxCheck


def not_exportable(module, inputs, output):
    """Adds 0 * bessel_j0(output) to the eval output: the same numbers in PyTorch, but ONNX has no such operator."""
    return output + torch.special.bessel_j0(output) * 0 if isinstance(output, torch.Tensor) else output


def differs_when_traced(module, inputs, output):
    """Adds 0.5 to the eval output except while being traced (i.e. exported): the ONNX graph lacks it."""
    if isinstance(output, torch.Tensor) and not torch.jit.is_tracing():
        return output + 0.5
    return output


def with_hook(monkeypatch, hook):
    """Make the trainer's (and model_from_checkpoint's) models carry `hook` on their forward."""
    real = yolo_cb.nn.build_model

    def build(*args, **kwargs):
        model = real(*args, **kwargs)
        model.register_forward_hook(hook)
        return model

    for name, module in list(sys.modules.items()):  # every module that imported it, under any name (training/build: `build`)
        if name.startswith("yolo_cb"):
            for attr in [a for a, value in vars(module).items() if value is real]:
                monkeypatch.setattr(module, attr, build)


@pytest.fixture(autouse=True)
def private_tempdir(tmp_path, monkeypatch):
    """Temp files of this test only, so other processes' checks cannot look like our leftovers."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))


def leftovers() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("yolo_cb_onnx_check_*")}


def warnings_with(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and text in r.getMessage()]


def test_roundtrip_figures():
    image = torch.rand(1, 3, 64, 64)
    ok = yolo_cb.nn.build_model("yolox-nano.yaml", nc=3, verbose=False)
    result = onnx_roundtrip(ok, image, simplify=False)
    assert result["max_abs"] < 1e-4
    bad = yolo_cb.nn.build_model("yolox-nano.yaml", nc=3, verbose=False)
    bad.register_forward_hook(differs_when_traced)
    assert onnx_roundtrip(bad, image, simplify=False)["max_abs"] == pytest.approx(0.5, abs=1e-3)
    broken = yolo_cb.nn.build_model("yolox-nano.yaml", nc=3, verbose=False)
    broken.register_forward_hook(not_exportable)
    before = leftovers()
    with pytest.raises(Exception, match="bessel_j0"):
        onnx_roundtrip(broken, image, simplify=False)
    assert leftovers() <= before  # the temp folder is removed on failure too


@pytest.mark.slow
def test_passes_on_the_real_model(tiny, caplog, monkeypatch):
    import onnxslim

    slimmed = []  # the real onnxslim, counted: only best.pt's check simplifies (as `yolo-cb export`)
    real_slim = onnxslim.slim
    monkeypatch.setattr(onnxslim, "slim", lambda *a, **k: slimmed.append(1) or real_slim(*a, **k))
    caplog.set_level("INFO", logger="yolo_cb")
    before = leftovers()
    # the check image: scaled down to 64 px; best.pt checked too
    YOLO("yolox-nano.yaml").train(**{**tiny, "imgsz": 128, "onnx_check": True, "onnx_check_best": True})
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ONNX check")]
    assert [line.split(":")[0] for line in lines] == ["ONNX check (pretrain)", "ONNX check (best.pt)"]
    for line, how in zip(lines, ("64x64 image, not simplified", "64x64 image, simplified"), strict=True):
        match = re.fullmatch(r"ONNX check \(.+\): difference (\S+) \(max abs (\S+)\) vs PyTorch — OK \((.+)\)", line)
        assert match, line
        assert float(match.group(1)) <= tiny.get("onnx_check_tol", 1e-3)
        assert match.group(3) == how
    assert len(slimmed) == 1
    assert leftovers() <= before


@pytest.mark.slow
def test_checks_once_by_default(tiny, caplog, monkeypatch):
    """Before training only (what it catches is in the architecture): no export of best.pt at the end."""
    exported = []
    real = OnnxCheck.check
    monkeypatch.setattr(OnnxCheck, "check", lambda self, trainer, model, stage, **kw: exported.append(stage) or real(self, trainer, model, stage, **kw))
    caplog.set_level("INFO", logger="yolo_cb")
    YOLO("yolox-nano.yaml").train(**{**tiny, "fraction": 0.25, "onnx_check": True})
    assert exported == ["pretrain"]
    assert [r.getMessage().split(":")[0] for r in caplog.records if r.getMessage().startswith("ONNX check")] == ["ONNX check (pretrain)"]


def test_check_image_is_scaled_down_to_onnx_check_imgsz():
    from yolo_cb.integrations.onnx_check import scaled_down

    image = torch.rand(1, 3, 256, 320)
    assert scaled_down(image, 64).shape[-2:] == (64, 64)  # 51.2 -> 64 (a multiple of 32), 64
    assert scaled_down(image, 128).shape[-2:] == (96, 128)
    assert scaled_down(image, 0) is image and scaled_down(image, 640) is image
    small = scaled_down(image, 64)
    assert 0 <= float(small.min()) and float(small.max()) <= 1


@pytest.mark.slow
@pytest.mark.parametrize("hook, pattern", [
    (differs_when_traced, r"ONNX check \((pretrain|best\.pt)\): difference 0\.5\d* \(max abs \S+\) vs PyTorch — above "
                          r"onnx_check_tol=0\.01: the ONNX model does NOT match PyTorch on a 64x64 image"),
    (not_exportable, r"ONNX check \((pretrain|best\.pt)\): the model cannot be exported to ONNX \(UnsupportedOperatorError: .*bessel_j0"),
], ids=["mismatch", "not-exportable"])
def test_failed_check_warns_and_training_goes_on(tiny, caplog, monkeypatch, hook, pattern):
    with_hook(monkeypatch, hook)
    fast = {"fraction": 0.25, "simplify": False}  # one batch; the check exports without onnxslim (not what is tested here)
    metrics = YOLO("yolox-nano.yaml").train(**{**tiny, **fast, "onnx_check": True, "onnx_check_tol": 0.01, "onnx_check_best": True})
    assert "fitness" in metrics  # training went on
    found = warnings_with(caplog, "ONNX check")
    assert len(found) == 2, found  # pretrain and best.pt, one warning each
    for text in found:
        assert re.search(pattern, text), text
        assert "onnx_check=strict" in text
    assert not warnings_with(caplog, "switched off")  # reported by the check itself, not by the engine's error policy


@pytest.mark.slow
def test_strict_fails_training_on_a_non_exportable_model(tiny, monkeypatch):
    with_hook(monkeypatch, not_exportable)
    model = YOLO("yolox-nano.yaml")
    model.add_callbacks(OnnxCheck(strict=True), on_error="raise")
    with pytest.raises(CallbackError, match=r"ONNX check \(pretrain\): the model cannot be exported to ONNX .*bessel_j0"):
        model.train(**{**tiny, "epochs": 1})
    assert model.trainer.epoch == 0 and model.trainer.tloss is None  # failed before the first batch


def test_strict_setting_registers_the_check_to_raise():
    """onnx_check=strict must make a failed check fail training: it is registered with on_error='raise'."""
    from yolo_cb.assembly.assemble import build_trainer_callbacks
    from yolo_cb.settings.config import get_config

    callbacks = build_trainer_callbacks(get_config({"onnx_check": "strict", "mlflow": False, "tensorboard": False}))
    assert {e.on_error for e in callbacks.entries() if e.name == "onnx_check"} == {"raise"}
    relaxed = build_trainer_callbacks(get_config({"onnx_check": True, "mlflow": False, "tensorboard": False}))
    assert {e.on_error for e in relaxed.entries() if e.name == "onnx_check"} == {"disable"}
