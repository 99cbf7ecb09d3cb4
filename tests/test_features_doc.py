"""docs/callbacks.md "Training features" examples run in one tiny training, and docs/cli.md's three feature commands
run as written (with the tiny data set and run folder put in); `yolo-cb cfg` lists every new setting."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from test_bad_input import cli

from yolo_cb import YOLO
from yolo_cb.checkpoints.checkpoint import load_checkpoint

DOCS = Path(__file__).resolve().parents[1] / "docs"
SETTINGS = ("unfreeze_epoch", "unfreeze_warmup", "per_class", "worst_batches", "worst_source", "average_best", "restore_best",
            "stop_close_mosaic")
QUICK = ["imgsz=64", "batch=8", "workers=0", "plots=false", "mlflow=false", "tensorboard=false", "onnx_check=false", "mosaic=0",
         "close_mosaic=0", "warmup_epochs=0", "optimizer=AdamW", "lr0=0.002", "fraction=0.5"]


def section(doc: str, title: str) -> str:
    text = (DOCS / doc).read_text()
    start = text.index(title)
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


@pytest.mark.slow
def test_the_training_features_examples_run(tiny, tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", section("callbacks.md", "## Training features"), re.S)
    assert len(blocks) == 4
    model, namespace = YOLO("yolox-nano.yaml"), {}
    namespace["model"] = model
    for code in blocks:
        exec(compile(code, "callbacks.md example", "exec"), namespace)  # noqa: S102 - the documented code, as a user runs it
    model.train(**{**tiny, "epochs": 2, **namespace["settings"]})
    run = tmp_path / "runs" / "exp"
    assert (run / "results_per_class.csv").is_file() and len(list((run / "worst").glob("epoch2_[0-9]*.jpg"))) == 2
    assert len(list((run / "worst").glob("epoch2_train*.jpg"))) == 2  # worst_source=both: the train batches too
    late = [g for g in model.trainer.optimizer.param_groups if "follows" in g]  # unfreeze_warmup: the layers' own groups
    assert late and all(g["ramp_iters"] == 2 for g in late)  # half of the 4 batches of an epoch
    entry = next(e for e in model.trainer.callbacks.entries("on_fit_epoch_end") if e.fn is namespace["print_weakest_class"])
    assert entry.calls == 2 and not entry.errors
    assert load_checkpoint(run / "weights" / "last.pt").train_args["unfreeze_epoch"] == 1


@pytest.mark.slow
def test_the_cli_feature_commands_run(tmp_path, shapes_small_yaml):
    block = next(b for b in re.findall(r"```\n(.*?)```", (DOCS / "cli.md").read_text(), re.S) if "unfreeze_epoch=1" in b)
    assert len(block.strip().splitlines()) == 3
    runs = tmp_path / "runs" / "detect"
    for line in block.strip().splitlines():
        words = [w.replace("runs/detect", str(runs)).replace("data=shapes.yaml", f"data={shapes_small_yaml}") for w in shlex.split(line)[1:]]
        if words[0] == "train" and not any(w.startswith("resume=") for w in words):
            words += [*QUICK, f"project={runs}", "name=train"]
        elif words[0] == "val":
            words += ["imgsz=64", "workers=0", "plots=false", f"project={tmp_path / 'val'}", "name=v"]
        result = cli(words, cwd=tmp_path)
        assert result.returncode == 0, (line, result.stderr[-3000:])
    last = load_checkpoint(runs / "train" / "weights" / "last.pt")
    assert last.epoch == 2 and last.train_args["epochs"] == 3
    assert (tmp_path / "val" / "v" / "results_per_class.csv").is_file()
    assert list((runs / "train" / "worst").glob("epoch1_train*.jpg"))  # worst_source=both


def test_yolo_cb_cfg_lists_the_settings(tmp_path):
    result = cli(["cfg"], cwd=tmp_path)
    assert result.returncode == 0
    listed = {line.split()[0] for line in result.stdout.splitlines() if line.strip()}
    assert set(SETTINGS) <= listed
