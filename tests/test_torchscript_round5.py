"""A TorchScript file is a program (issue 59, section 1): the op check and the byte search for `__setstate__` let through a
`def\\t__setstate__`, a zip holding its code entry twice (Python's zipfile reads the last, torch the first), a forward
pre-hook and a script class held as an attribute; `yolo-cb predict` and `val` then wrote a file outside the model's
folder, exit 0. Now a TorchScript file loads only when yolo-cb wrote it for this user (a keyed digest recorded at export,
yolo_cb/prediction/model_trust.py) or with trust=True; the content checks stay, as defence in depth."""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from yolo_cb import YOLO
from yolo_cb.checkpoints.checkpoint import Checkpoint, save_checkpoint
from yolo_cb.errors import CheckpointError, ConfigError
from yolo_cb.nn import build_model
from yolo_cb.prediction.backend import load_backend
from yolo_cb.prediction.model_trust import KEY_NAME, RECORDS

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {0: "circle", 1: "rectangle", 2: "triangle", 3: "cross"}
META = json.dumps({"names": {str(k): v for k, v in SHAPES.items()}, "stride": 32, "imgsz": [64, 64], "batch": 1})


# --- crafted files: each writes `victim` (torch.from_file with shared=True creates it) -----------------------------------
class Benign(torch.nn.Module):
    """A detector's output for imgsz 64 and the 4 shapes classes: 84 anchors of 5 + 4 values."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(x.shape[0], 84, 9)


class OnLoad(Benign):
    def __init__(self, victim: str):
        super().__init__()
        self.victim = victim
        self.mark = torch.zeros(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(x.shape[0], 84, 9) + self.mark * 0

    @torch.jit.export
    def __getstate__(self) -> tuple[str, bool]:
        return self.victim, self.training

    @torch.jit.export
    def __setstate__(self, state: tuple[str, bool]) -> None:
        self.mark = torch.from_file(state[0], shared=True, size=9, dtype=torch.uint8).fill_(66)[:1].float()
        self.victim, self.training = state[0], state[1]


class Writer:  # scripted where used (scripted_bytes): a script class
    def __init__(self, path: str):
        self.path = path

    def write(self) -> torch.Tensor:
        return torch.from_file(self.path, shared=True, size=9, dtype=torch.uint8).fill_(67)[:1].float()


class WithScriptClass(torch.nn.Module):
    def __init__(self, victim: str):
        super().__init__()
        self.writer = Writer(victim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(x.shape[0], 84, 9) + self.writer.write() * 0


class Victimised(Benign):
    def __init__(self, victim: str):
        super().__init__()
        self.victim = victim


def writing_pre_hook(module: Victimised, inputs: tuple[torch.Tensor]) -> tuple[torch.Tensor]:
    written = torch.from_file(module.victim, shared=True, size=9, dtype=torch.uint8).fill_(68)
    return (inputs[0] + written[0].float() * 0,)


def scripted_bytes(module: torch.nn.Module) -> bytes:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit's deprecation notices
        torch.jit.script(Writer)  # a script class, held as an attribute by WithScriptClass
        torch.jit.save(torch.jit.script(module), buffer, _extra_files={"config.txt": META})
    return buffer.getvalue()


def rezipped(data: bytes, code: callable, twice: bool = False) -> bytes:
    """The archive with the code entry of __setstate__ changed by `code`; twice: the original entry first, the changed one
    after it."""
    source, out = zipfile.ZipFile(io.BytesIO(data)), io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # zipfile's "Duplicate name"
        for entry in source.infolist():
            text = source.read(entry)
            is_code = "/code/" in entry.filename and entry.filename.endswith(".py") and b"__setstate__" in text
            archive.writestr(zipfile.ZipInfo(entry.filename, entry.date_time), text if twice or not is_code else code(text))
            if twice and is_code:
                archive.writestr(zipfile.ZipInfo(entry.filename, entry.date_time), code(text))
    assert out.getvalue().count(code(b"def __setstate__")) == 1
    return out.getvalue()


def crafted(kind: str, victim: Path) -> bytes:
    if kind == "setstate_tab":
        return rezipped(scripted_bytes(OnLoad(str(victim))), lambda t: t.replace(b"def __setstate__", b"def\t__setstate__"))
    if kind == "setstate_twice":  # the last entry, the one zipfile reads, defines no __setstate__
        return rezipped(scripted_bytes(OnLoad(str(victim))), lambda t: t.replace(b"def __setstate__", b"def __setstatf__"), twice=True)
    if kind == "script_class":
        return scripted_bytes(WithScriptClass(str(victim)))
    module = Victimised(str(victim))
    module.register_forward_pre_hook(writing_pre_hook)
    return scripted_bytes(module)


# --- helpers ---------------------------------------------------------------------------------------------------------
def cli(*argv: str, cwd: Path, config: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "YOLO_CB_CONFIG_DIR": str(config)}
    return subprocess.run([sys.executable, "-m", "yolo_cb", *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)


def assert_refused(done: subprocess.CompletedProcess, model: Path) -> None:
    """Exit 2 and one line: the file, why (yolo-cb did not write it), and the setting that would load it."""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith(f"yolo-cb: error: refused to load '{model}': yolo-cb did not write this TorchScript file"), lines[0]
    assert "trust=True" in lines[0] and "docs/security.md" in lines[0], lines[0]


def shapes_checkpoint(path: Path) -> Path:
    """A random yolox-nano for the 4 shapes classes (no training: exports, predicts and validates, at mAP ~0)."""
    torch.manual_seed(0)
    model = build_model("yolox-nano", nc=4, verbose=False)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return save_checkpoint(Checkpoint(model=state, ema=state, model_cfg=dict(model.cfg), names=SHAPES, train_args={"imgsz": 64},
                                      epoch=0), path)


@pytest.fixture
def image(tmp_path) -> Path:
    path = tmp_path / "img.jpg"
    cv2.imwrite(str(path), np.full((64, 64, 3), 127, np.uint8))
    return path


@pytest.fixture(scope="module")
def own_export(tmp_path_factory) -> dict[str, Path]:
    """m.torchscript exported in-process under the config folder `config` (created by the export)."""
    from yolo_cb.export.exporter import Exporter

    folder = tmp_path_factory.mktemp("round5")
    config = folder / "config"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("YOLO_CB_CONFIG_DIR", str(config))
        exported = Path(Exporter({"format": "torchscript", "imgsz": 64})(str(shapes_checkpoint(folder / "m.pt"))))
    return {"folder": folder, "config": config, "file": exported}


# --- (a), (b): files that wrote outside their folder are refused before torch reads them -----------------------------
@pytest.mark.parametrize("kind", ["setstate_tab", "setstate_twice", "pre_hook", "script_class"])
def test_a_crafted_torchscript_is_refused_in_one_line_and_writes_nothing(tmp_path, image, shapes_small_yaml, kind):
    victim = tmp_path / "elsewhere" / "marker.bin"
    victim.parent.mkdir()
    model = tmp_path / "model" / "crafted.torchscript"
    model.parent.mkdir()
    model.write_bytes(crafted(kind, victim))
    for mode, extra in (("predict", f"source={image}"), ("val", f"data={shapes_small_yaml}")):
        done = cli(mode, f"model={model}", extra, "imgsz=64", f"project={tmp_path / 'runs'}", cwd=tmp_path, config=tmp_path / "config")
        assert not victim.exists(), f"{mode} ran the file's code: {done.stderr[-2000:]}"
        assert_refused(done, model)


@pytest.mark.parametrize("kind", ["setstate_tab", "setstate_twice", "pre_hook", "script_class"])
def test_the_content_checks_refuse_them_too_when_trusted(tmp_path, kind):
    """Defence in depth: trust=True is no licence for a file whose code writes files; nothing of it has run."""
    victim = tmp_path / "marker.bin"
    model = tmp_path / "crafted.torchscript"
    model.write_bytes(crafted(kind, victim))
    said = {"setstate_tab": "defines __setstate__", "setstate_twice": "more than once", "pre_hook": "calls aten::from_file",
            "script_class": "a method of a script class"}[kind]
    with pytest.raises(CheckpointError, match=f"refused to run '{model}': .*{said}"):
        load_backend(model, trust=True)
    assert not victim.exists()


# --- (c) our own export, (d) trust=True, (e) another user's key ---------------------------------------------------------
def test_our_own_export_predicts_and_validates_without_trust(tmp_path, image, shapes_small_yaml):
    """`yolo-cb export` creates this user's key (0600, atomically, in YOLO_CB_CONFIG_DIR) and records the file."""
    config = tmp_path / "no" / "such" / "config"
    weights = shapes_checkpoint(tmp_path / "m.pt")
    done = cli("export", f"model={weights}", "format=torchscript", "imgsz=64", cwd=tmp_path, config=config)
    assert done.returncode == 0, done.stderr[-3000:]
    exported = tmp_path / "m.torchscript"
    key = config / KEY_NAME
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(key.read_bytes()) == 32
    records = list((config / RECORDS).iterdir())
    assert len(records) == 1 and json.loads(records[0].read_text())["file"] == str(exported)
    assert sorted(p.name for p in config.iterdir()) == [KEY_NAME, RECORDS]  # no temp file left
    predicted = cli("predict", f"model={exported}", f"source={image}", "imgsz=64", f"project={tmp_path / 'runs'}", cwd=tmp_path,
                    config=config)
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    validated = cli("val", f"model={exported}", f"data={shapes_small_yaml}", "imgsz=64", f"project={tmp_path / 'runs'}",
                    cwd=tmp_path, config=config)
    assert validated.returncode == 0 and "all" in validated.stdout + validated.stderr, validated.stderr[-3000:]


def test_a_foreign_torchscript_loads_with_trust(tmp_path, image, shapes_small_yaml):
    model = tmp_path / "foreign.torchscript"
    model.write_bytes(scripted_bytes(Benign()))
    config = tmp_path / "config"
    assert_refused(cli("predict", f"model={model}", f"source={image}", "imgsz=64", cwd=tmp_path, config=config), model)
    done = cli("predict", f"model={model}", f"source={image}", "imgsz=64", "trust=True", f"project={tmp_path / 'runs'}", cwd=tmp_path,
               config=config)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not config.exists()  # loading writes no key
    results = YOLO(str(model)).predict(str(image), imgsz=64, trust=True)
    assert len(results) == 1 and len(results[0].boxes) == 0
    metrics = YOLO(str(model)).val(data=str(shapes_small_yaml), imgsz=64, trust=True, plots=False, project=str(tmp_path / "val"))
    assert metrics["metrics/mAP50-95(B)"] == 0.0
    with pytest.raises(CheckpointError, match="trust=True"):
        YOLO(str(model)).predict(str(image), imgsz=64)


def test_our_export_under_another_users_key_is_refused(own_export, tmp_path, monkeypatch):
    from yolo_cb.prediction.model_trust import user_key

    copy = tmp_path / "copy.torchscript"
    shutil.copy(own_export["file"], copy)
    monkeypatch.setenv("YOLO_CB_CONFIG_DIR", str(own_export["config"]))
    assert load_backend(copy).names == SHAPES  # moved or copied by its own user: still ours (its bytes are recorded)
    monkeypatch.setenv("YOLO_CB_CONFIG_DIR", str(tmp_path / "other_user"))
    for has_key in (False, True):  # another user who never exported, then one with a key of their own
        if has_key:
            user_key()
        with pytest.raises(CheckpointError, match=f"refused to load '{copy}': yolo-cb did not write this TorchScript file"):
            load_backend(copy)


def test_an_edited_export_or_a_lost_key_is_refused(own_export, tmp_path, monkeypatch):
    monkeypatch.setenv("YOLO_CB_CONFIG_DIR", str(own_export["config"]))
    edited = tmp_path / "edited.torchscript"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit's deprecation notices
        torch.jit.save(torch.jit.load(str(own_export["file"])), str(edited), _extra_files={"config.txt": META})  # other metadata
    with pytest.raises(CheckpointError, match="did not write this TorchScript file"):
        load_backend(edited)
    keyless = tmp_path / "keyless"
    shutil.copytree(own_export["config"], keyless)
    (keyless / KEY_NAME).unlink()
    monkeypatch.setenv("YOLO_CB_CONFIG_DIR", str(keyless))
    with pytest.raises(CheckpointError, match="did not write this TorchScript file"):  # its record alone proves nothing
        load_backend(own_export["file"])


def test_a_key_others_may_read_is_refused(own_export, tmp_path, monkeypatch):
    config = tmp_path / "config"
    shutil.copytree(own_export["config"], config)
    (config / KEY_NAME).chmod(0o644)
    monkeypatch.setenv("YOLO_CB_CONFIG_DIR", str(config))
    with pytest.raises(ConfigError, match="mode 0644: other users may read it"):
        load_backend(own_export["file"])


def test_a_checkpoint_never_grants_trust(tmp_path):
    """trust is the user's word: a resume never takes it from a checkpoint's saved settings."""
    from yolo_cb.settings.resume import resumable_settings

    assert "trust" not in resumable_settings({"trust": True, "epochs": 3}, {}, tmp_path / "last.pt")
