"""Security round 5 (issue 59 §4, §5), the data files: what a dataset names is a regular file of a bounded size, a data
YAML's values are typed where the file is read, `generate:` is bounded, two converts into one folder do not collide,
and a checkpoint's tensors hold their values. Each case ran into a hang, a traceback or gigabytes before; each is now
one line (exit status 2) from a fresh process, fast, with nothing written."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from format_sets import make_coco, make_voc
from shared_data import SHARED
from test_predict_hostile import tiny_checkpoint

SHAPES = SHARED / "datasets" / "shapes"
DATA_CAP = 3 * 2**30  # address space (ulimit -v) of a child that reads data files: far below what the inputs asked for
TORCH_CAP = 8 * 2**30  # of a child that loads a checkpoint: torch maps more at import


def run(*args: str, cwd: Path, timeout: float = 120, cap: int = DATA_CAP) -> subprocess.CompletedProcess:
    """A fresh process under an address-space cap; a hang ends as subprocess.TimeoutExpired (the test fails)."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HOME": str(cwd), "YOLO_CB_DATASETS": str(cwd / "datasets")}
    return subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                          env=env, preexec_fn=limit)


def yolo_cb(*argv: str, cwd: Path, timeout: float = 120, cap: int = DATA_CAP) -> subprocess.CompletedProcess:
    return run(sys.executable, "-m", "yolo_cb", *argv, cwd=cwd, timeout=timeout, cap=cap)


def one_line(done: subprocess.CompletedProcess, *needles: str) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert all(n in lines[0] for n in needles) and len(lines[0]) < 600, lines[0]
    return lines[0]


def data_yaml(folder: Path, text: str, name: str = "data.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
    return folder / name


SHAPES_YAML = f"path: {SHAPES}\ntrain: images/train\nval: images/val\nnames: [circle, rectangle, triangle, cross]\n"


# --- §4: files a dataset names are regular files of a bounded size ---------------------------------------------------
def test_a_fifo_data_yaml_is_refused_by_name(tmp_path):
    os.mkfifo(tmp_path / "data.yaml")
    one_line(yolo_cb("data", "check", "data=data.yaml", cwd=tmp_path, timeout=60), "data.yaml", "FIFO", "not a regular file")


def test_a_fifo_voc_list_is_one_line_not_a_hang(tmp_path):
    """A VOC image-set list that is a FIFO made the training wait for a writer forever (issue 59 §4)."""
    make_voc(tmp_path, SHAPES, n_train=2, n_val=2)
    listed = tmp_path / "VOC" / "ImageSets" / "Main" / "train.txt"
    listed.unlink()
    os.mkfifo(listed)
    data_yaml(tmp_path, f"path: {tmp_path}\ntrain: VOC/ImageSets/Main/train.txt\nval: VOC\nnames: [circle, rectangle, triangle, cross]\n")
    one_line(yolo_cb("data", "check", "data=data.yaml", cwd=tmp_path, timeout=60), str(listed), "FIFO")


def test_a_folder_named_as_a_list_is_named_as_a_folder(tmp_path):
    make_voc(tmp_path, SHAPES, n_train=2, n_val=2)
    listed = tmp_path / "VOC" / "ImageSets" / "Main" / "val.txt"
    listed.unlink()
    listed.mkdir()
    data_yaml(tmp_path, f"path: {tmp_path}\ntrain: VOC/ImageSets/Main/val.txt\nval: VOC/ImageSets/Main/val.txt\nnames: [a]\n")
    one_line(yolo_cb("data", "check", "data=data.yaml", cwd=tmp_path, timeout=60), str(listed), "not a regular file but a folder")


def test_a_list_over_the_bound_is_refused_unread(tmp_path):
    """A VOC image-set list of 4 GiB (sparse: no disk used) was read whole into memory; now its size refuses it."""
    make_voc(tmp_path, SHAPES, n_train=2, n_val=2)
    listed = tmp_path / "VOC" / "ImageSets" / "Main" / "train.txt"
    with open(listed, "r+b") as f:
        f.truncate(4 * 2**30)
    data_yaml(tmp_path, f"path: {tmp_path}\ntrain: VOC/ImageSets/Main/train.txt\nval: VOC\nnames: [circle, rectangle, triangle, cross]\n")
    one_line(yolo_cb("data", "check", "data=data.yaml", cwd=tmp_path, timeout=60), str(listed), "4.0 GiB", "at most 512.0 MiB")


def test_a_data_yaml_over_the_bound_is_refused_unread(tmp_path):
    """A 48 MB data YAML was still being parsed at 240 s (2.2 GB); a 4 GB one (sparse: no disk used) is now refused from
    its size, before a byte is read."""
    with open(tmp_path / "big.yaml", "wb") as f:
        f.write(SHAPES_YAML.encode())
        f.truncate(4 * 2**30)
    started = time.monotonic()
    one_line(yolo_cb("data", "check", "data=big.yaml", cwd=tmp_path, timeout=60), "big.yaml", "4.0 GiB", "at most 1.0 MiB")
    assert time.monotonic() - started < 60


def test_a_yaml_alias_bomb_under_a_key_nobody_reads_is_refused(tmp_path):
    bomb = "[" + ", ".join(["&l0 [" + ", ".join(["lol"] * 9) + "]"] + [f"&l{k} [" + ", ".join([f"*l{k - 1}"] * 9) + "]"
                                                                         for k in range(1, 9)]) + "]"
    data_yaml(tmp_path, SHAPES_YAML + f"roboflow: {bomb}\n")
    one_line(yolo_cb("data", "check", "data=data.yaml", cwd=tmp_path, timeout=60), "data.yaml", "alias")


@pytest.mark.parametrize("spec, said", [("{train: 100000000}", "'generate: train' is 100000000"),
                                        ("{train: 100000, val: 100000, max_size: 4096}", "free some space")])
def test_a_generate_beyond_the_bounds_is_one_line_before_any_image(tmp_path, spec, said):
    """`generate: {train: 100000000}` started a 900-hour generation that filled the disk."""
    if "free" in said and shutil.disk_usage(tmp_path).free > 200_000 * 4096 * 4096 * 2:
        pytest.skip("this disk has room for 200,000 images of 4096 x 4096")
    data_yaml(tmp_path, f"path: synthetic\ntrain: images/train\nval: images/val\nnames: [a, b, c, d]\ngenerate: {spec}\n")
    one_line(yolo_cb("data", "check", "data=data.yaml", cwd=tmp_path, timeout=60), "data.yaml", said)
    assert not list(tmp_path.rglob("*.jpg"))


# --- §5: a data YAML's values, typed where the file is read ---------------------------------------------------------
BAD_VALUES = {  # case: (what replaces or joins the valid YAML, a part of the one line)
    "nc_text": ("nc: abc", "'nc' is 'abc'"),
    "nc_list": ("nc: [4]", "'nc' is [4]"),
    "category_ids_text": ("category_ids: [a, b, c, d]", "'category_ids' is ['a', 'b', 'c', 'd']"),
    "category_ids_short": ("category_ids: [1, 2]", "it must list 4 ids"),
    "path_no_user": ("path: ~nosuchuser/x", "'path' is '~nosuchuser/x'"),
    "path_list": ("path: [a]", "'path' is ['a']"),
    "download_number": ("download: 5", "'download' is 5"),
    "generate_number": ("generate: 5", "'generate' is 5"),
    "generate_unknown_key": ("generate: {bogus: 1}", "'generate: bogus' is 1"),
    "generate_text_count": ("generate: {train: abc}", "'generate: train' is 'abc'"),
    "generate_min_over_max": ("generate: {min_size: 500}", "'generate: min_size' is 500"),
    "val_set_number": ("val: {day: 5}", "'val' is {'day': 5}"),
    "escape_in_value": ('nc: "\\e[2J\\nforged"', "'nc' is '\\x1b[2J\\nforged'"),
    "a_megabyte_value": ("train: " + "x" * 1_000_000, "'train' is 'xxx"),
    "a_megabyte_nc": ("nc: " + "x" * 1_000_000, "'nc' is 'xxx"),
}
TABLE = """
import contextlib, io, json, sys
from yolo_cb.cli import entrypoint
for name, argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            entrypoint(argv)
            rc = 0
        except SystemExit as stop:
            rc = stop.code
        except BaseException as error:
            rc = "traceback " + type(error).__name__
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    print(json.dumps({"name": name, "rc": rc, "lines": len(lines), "first": lines[0][:2000] if lines else "",
                      "length": len(err.getvalue())}))
"""


def bad_yaml(folder: Path, name: str, change: str) -> Path:
    """The valid shapes YAML with `change` replacing its key's line (or added); a YAML that may fetch points at a missing
    root under datasets_dir, so that the value is used."""
    key = change.split(":")[0]
    lines = [line for line in SHAPES_YAML.splitlines() if not line.startswith(f"{key}:")]
    if key in ("download", "generate"):
        lines = [line if not line.startswith("path:") else "path: missing" for line in lines]
    return data_yaml(folder, "\n".join([*lines, change]) + "\n", f"{name}.yaml")


def test_each_bad_data_yaml_value_is_one_short_line(tmp_path):
    """Each was a traceback (ValueError, TypeError, RuntimeError from int(), list(), expanduser(), generate_shapes(**)), or
    a line as long as the value; all run in one fresh process through the CLI's entrypoint, a table out."""
    cases = [(name, ["data", "check", f"data={bad_yaml(tmp_path, name, change)}"]) for name, (change, _) in BAD_VALUES.items()]
    done = run(sys.executable, "-c", TABLE, json.dumps(cases), cwd=tmp_path, timeout=300)
    rows = {row["name"]: row for row in (json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"name"'))}
    assert set(rows) == set(BAD_VALUES), done.stderr[-3000:]
    wrong = {name: row for name, row in rows.items() if not (row["rc"] == 2 and row["lines"] == 1 and row["length"] < 600
                                                              and f"{name}.yaml" in row["first"] and BAD_VALUES[name][1] in row["first"])}
    assert not wrong, json.dumps(wrong, indent=1)[:4000]
    assert not (tmp_path / "datasets").exists()  # nothing fetched or generated


def test_a_bad_value_through_the_installed_console_script(tmp_path):
    script = Path(sys.executable).parent / "yolo-cb"
    if not script.is_file():
        pytest.skip("no yolo-cb console script beside this Python")
    path = bad_yaml(tmp_path, "nc_text", "nc: abc")
    one_line(run(str(script), "data", "check", f"data={path}", cwd=tmp_path), str(path), "'nc' is 'abc'", "whole number >= 1")


# --- §5: two converts into one folder --------------------------------------------------------------------------------
def test_two_converts_into_one_folder_one_wins_the_other_is_one_line(tmp_path):
    make_coco(tmp_path, SHAPES, n_train=40, n_val=20)
    argv = [sys.executable, "-m", "yolo_cb", "convert", f"source={tmp_path / 'coco'}", "format=coco", f"out={tmp_path / 'out'}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    both = [subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in both]
    assert sorted(rc for rc, _ in results) == [0, 2], results
    loser = next(err for rc, err in results if rc == 2)
    lines = [line for line in loser.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in loser and f"out={tmp_path / 'out'}" in lines[0], loser[-3000:]
    assert (tmp_path / "out" / "data.yaml").is_file()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.tmp")]  # no temp folder left behind


# --- §5: checkpoint tensors that hold no values ----------------------------------------------------------------------
@pytest.mark.parametrize("kind, said", [("meta", "on the meta device"), ("stride0", "10,000,000,000 values")])
def test_a_checkpoint_tensor_without_its_values_is_one_line(tmp_path, kind, said):
    """A meta tensor was a NotImplementedError traceback; a stride-0 view of 10^10 values saved by torch.save keeps its one
    4-byte element, and the checksum's copy of it asked for 40 GB."""
    ckpt = torch.load(tiny_checkpoint(tmp_path / "good.pt"), weights_only=True)
    key = max(ckpt["ema"], key=lambda k: ckpt["ema"][k].numel())
    bad = torch.empty(ckpt["ema"][key].shape, device="meta") if kind == "meta" else torch.zeros(1).expand(10**10)
    torch.save({**ckpt, "ema": {**ckpt["ema"], key: bad}}, tmp_path / "bad.pt")  # its recorded checksum kept
    data = data_yaml(tmp_path, SHAPES_YAML.replace("names: [circle, rectangle, triangle, cross]", "names: [a, b]"))
    one_line(yolo_cb("val", "model=bad.pt", f"data={data}", "imgsz=64", cwd=tmp_path, cap=TORCH_CAP), "bad.pt", key, said)
