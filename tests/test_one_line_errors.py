"""Tracebacks where one line was due (security round 4): a .txt source list that lists itself (a RecursionError), and a
project= longer than the OS allows for a name (an OSError from the error handler itself). Each is now one line naming
the value, exit status 2, as a new process runs them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_predict_hostile import tiny_checkpoint


def yolo_cb(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yolo_cb", *argv], cwd=cwd, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)


def one_line(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    return lines[0]


def test_a_source_list_that_lists_itself_is_one_line(tmp_path):
    weights = tiny_checkpoint(tmp_path / "m.pt")
    (tmp_path / "a.txt").write_text("b.txt\n")
    (tmp_path / "b.txt").write_text(f"{tmp_path / 'a.txt'}\n")  # a -> b -> a
    line = one_line(yolo_cb("predict", f"model={weights}", "source=a.txt", "imgsz=64", cwd=tmp_path))
    assert "source list" in line and "lists itself" in line and "a.txt" in line


def test_a_project_longer_than_the_os_allows_is_one_line(tmp_path, shapes_small_yaml):
    project = tmp_path / ("p" * 300)
    line = one_line(yolo_cb("train", f"data={shapes_small_yaml}", "model=yolox-nano.yaml", "epochs=1", "imgsz=64",
                            f"project={project}", cwd=tmp_path))
    assert line.startswith(f"yolo-cb: error: project={project}: cannot create the run folder") and "too long" in line.lower()


BAD_FIELDS = {  # field -> (crafted value, what the line says)
    "model_cfg": ("oops", "'model_cfg' is str 'oops'"),
    "names": ([1, 2], "'names' is list [1, 2]"),
    "tensors_crc32": ("zz", "'tensors_crc32' is str 'zz'; it must be an integer"),
    "epoch": ("x", "'epoch' is str 'x'; it must be an integer"),
    "train_args": ([1], "'train_args' is list [1]; it must be a mapping"),
    "optimizer": ({"state": 5, "param_groups": "x"}, "'optimizer' is not an optimizer state"),
}


@pytest.mark.parametrize("field", sorted(BAD_FIELDS))
def test_a_checkpoint_field_of_the_wrong_form_is_one_line_on_val_and_resume(tmp_path, shapes_small_yaml, field):
    """Each ended in an AttributeError / ValueError / TypeError traceback (some only at resume)."""
    import torch

    value, said = BAD_FIELDS[field]
    good = torch.load(tiny_checkpoint(tmp_path / "m.pt"), weights_only=True)
    torch.save({**good, field: value}, tmp_path / "bad.pt")
    for argv in (["val", "model=bad.pt", f"data={shapes_small_yaml}", "imgsz=64"], ["train", "resume=bad.pt", "epochs=2"]):
        line = one_line(yolo_cb(*argv, cwd=tmp_path))
        assert f"checkpoint '{Path('bad.pt')}' is damaged or was not written by yolo-cb: {said}" in line, line


@pytest.mark.parametrize("text, said", [
    ("depth: x\nwidth: 0.25", "depth='x' is not a number in (0, 4]"), ("depth: 0.33\nwidth: null", "width=None is not a number"),
    ("depth: 0.33\nwidth: 0.25\nact: foo", "act='foo' is not one of silu, relu, lrelu"),
    ("family: bar\ndepth: 0.33\nwidth: 0.25", "unknown family 'bar'"),
    ("depth: 0.33\nwidth: 0.25\ndepthwise: maybe", "depthwise='maybe' is not true or false"),  # was taken as true
    ("family: yolocb\ndepth: 0.33\nwidth: 0.25\nmax_channels: -5", "max_channels=-5 is not an integer >= 8"),
    ("family: yolocb\ndepth: 0.33\nwidth: 0.25\nreg_max: 0", "reg_max=0 is not an integer >= 2"),
    ("width: 0.25", "the config lacks depth")])
def test_a_bad_model_yaml_value_is_one_line(tmp_path, text, said):
    """Each was a ValueError, TypeError, KeyError or RuntimeError traceback from inside the build (or silently taken)."""
    from yolo_cb.errors import ConfigError
    from yolo_cb.nn import build_model

    (tmp_path / "bad.yaml").write_text(text + "\n")
    with pytest.raises(ConfigError, match=re.escape(said)):
        build_model(str(tmp_path / "bad.yaml"), nc=2, verbose=False)


def test_a_bad_model_yaml_value_on_the_cli_is_one_line(tmp_path, shapes_small_yaml):
    (tmp_path / "bad.yaml").write_text("depth: 0.33\nwidth: 0.25\nact: foo\n")
    line = one_line(yolo_cb("train", "model=bad.yaml", f"data={shapes_small_yaml}", "epochs=1", "imgsz=64", cwd=tmp_path))
    assert line == "yolo-cb: error: model bad: act='foo' is not one of silu, relu, lrelu"


def test_a_checkpoints_recorded_data_never_starts_a_download(tmp_path):
    """A checkpoint's saved data=coco8.yaml made `val` create ./datasets and start a download (round 3's last case)."""
    import os

    import torch

    good = torch.load(tiny_checkpoint(tmp_path / "m.pt"), weights_only=True)
    torch.save({**good, "train_args": {**good["train_args"], "data": "coco8.yaml"}}, tmp_path / "recorded.pt")
    env = {**os.environ, "YOLO_CB_DATASETS": str(tmp_path / "datasets")}  # coco8 is nowhere there
    done = subprocess.run([sys.executable, "-m", "yolo_cb", "val", "model=recorded.pt", "imgsz=64"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    line = one_line(done)
    assert "records data=coco8.yaml, which is not on this machine" in line and "pass data=" in line
    assert not (tmp_path / "datasets").exists()
