"""Security issue #45, round 4: planted symbolic links in a run folder are never written through (the lock, args.yaml,
results.csv, results.png, export_check.csv, atomic writes' temp names); nproc is bounded by the usable CPU cores; imgsz
by MAX_IMGSZ, on the command line and in a checkpoint's saved settings; class names with terminal escapes are printed
escaped; a FIFO among labels, images or the label cache is skipped with one warning instead of hanging the check."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_resume_safety import SMALL, cli, kv, write_data

from yolo_cb.settings.config import ConfigError, coerce
from yolo_cb.settings.schema import MAX_IMGSZ, usable_cpus
from yolo_cb.utils import files
from yolo_cb.utils.files import atomic_write_text
from yolo_cb.utils.run_lock import lock_run_folder

OUTSIDE = b"precious bytes a run must never touch\n"
ESCAPES = ["\x1b[2J", "\x1b]0;evil\x07", "a\nforged line", "plain"]


def one_line_error(result: subprocess.CompletedProcess) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-3000:]
    assert lines and lines[-1].startswith("yolo-cb: error:") and "Traceback" not in result.stderr, result.stderr[-3000:]
    return lines[-1]


def plant(folder: Path, outside: Path, *names: str) -> dict[str, Path]:
    """In `folder`, a link for each name to its own file under `outside` (mode 0o600, OUTSIDE's bytes)."""
    folder.mkdir(parents=True, exist_ok=True)
    outside.mkdir(parents=True, exist_ok=True)
    targets = {}
    for name in names:
        target = outside / f"target{name}"
        target.write_bytes(OUTSIDE)
        target.chmod(0o600)
        (folder / name).symlink_to(target)
        targets[name] = target
    return targets


def new_file_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


# --- 1. no write through a planted link ------------------------------------------------------------------------------
def test_a_lock_link_is_refused_and_its_target_untouched(tmp_path):
    """The lock was opened with O_CREAT and no O_NOFOLLOW, then truncated: a .lock link emptied the file it named."""
    targets = plant(tmp_path / "run", tmp_path / "outside", ".lock")
    with pytest.raises(OSError, match=r"\.lock is a symbolic link") as refused:
        lock_run_folder(tmp_path / "run")
    assert len(str(refused.value).splitlines()) == 1
    assert targets[".lock"].read_bytes() == OUTSIDE


@pytest.mark.slow
def test_a_run_into_a_folder_with_a_lock_link_is_refused_in_one_line(tmp_path, shapes_dir):
    data = write_data(tmp_path / "data", shapes_dir)
    targets = plant(tmp_path / "runs" / "job", tmp_path / "outside", ".lock")
    line = one_line_error(cli(tmp_path, *kv({**SMALL, "data": data, "epochs": 1, "project": tmp_path / "runs", "name": "job",
                                             "exist_ok": True})))
    assert ".lock is a symbolic link" in line, line
    assert targets[".lock"].read_bytes() == OUTSIDE


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory, shapes_dir):
    """A one-epoch run (plots on) into a folder holding links named args.yaml, results.csv and results.png."""
    root = tmp_path_factory.mktemp("planted")
    data = write_data(root / "data", shapes_dir)
    targets = plant(root / "runs" / "job", root / "outside", "args.yaml", "results.csv", "results.png")
    done = cli(root, *kv({**SMALL, "data": data, "epochs": 1, "project": root / "runs", "name": "job", "exist_ok": True,
                          "plots": True}))
    return SimpleNamespace(result=done, folder=root / "runs" / "job", targets=targets, data=data, root=root)


@pytest.mark.slow
def test_a_run_replaces_planted_links_with_its_own_files(planted_run):
    assert planted_run.result.returncode == 0, planted_run.result.stderr[-3000:]
    for name, target in planted_run.targets.items():
        assert target.read_bytes() == OUTSIDE and stat.S_IMODE(target.stat().st_mode) == 0o600, name
        written = planted_run.folder / name
        assert not written.is_symlink() and written.is_file() and written.read_bytes() != OUTSIDE, name
        # the link's target is not followed even to read a mode: the new file gets the mode any new file gets
        assert stat.S_IMODE(written.stat().st_mode) == new_file_mode(), name


def test_atomic_writes_never_open_a_link_at_the_temp_or_the_final_name(tmp_path, monkeypatch):
    targets = plant(tmp_path / "run", tmp_path / "outside", ".out.txt.dead.tmp", "out.txt")
    tokens = iter(["dead", "beef"])  # the first temp name is taken by a planted link: O_EXCL refuses it, the next is used
    monkeypatch.setattr(files.secrets, "token_hex", lambda n: next(tokens))
    atomic_write_text(tmp_path / "run" / "out.txt", "ours\n")
    assert all(t.read_bytes() == OUTSIDE for t in targets.values())
    written = tmp_path / "run" / "out.txt"
    assert not written.is_symlink() and written.read_text() == "ours\n"
    assert stat.S_IMODE(written.stat().st_mode) == new_file_mode()
    assert (tmp_path / "run" / ".out.txt.dead.tmp").is_symlink() and not (tmp_path / "run" / ".out.txt.beef.tmp").exists()


def test_an_export_temp_file_swapped_for_a_link_is_not_written_through(tmp_path):
    from yolo_cb.export.formats import StagedFile

    outside = tmp_path / "outside.bin"
    outside.write_bytes(OUTSIDE)
    with StagedFile(tmp_path / "best.onnx") as staged:
        staged.path.unlink()
        staged.path.symlink_to(outside)
        with pytest.raises(OSError):
            staged.write(b"model bytes")
    assert outside.read_bytes() == OUTSIDE


def test_export_check_csv_replaces_a_link(tmp_path):
    from yolo_cb.integrations.export_check import ExportCheck

    targets = plant(tmp_path / "run", tmp_path / "outside", "export_check.csv")
    check = ExportCheck()
    check.rows = [{"variant": "onnx", "file": "best.onnx", "mAP50-95": 0.5, "pytorch": 0.5, "drop": 0.0, "ok": True, "error": ""}]
    check._write(tmp_path / "run" / "export_check.csv")
    assert targets["export_check.csv"].read_bytes() == OUTSIDE
    assert "onnx" in (tmp_path / "run" / "export_check.csv").read_text()
    assert not (tmp_path / "run" / "export_check.csv").is_symlink()


# --- 2. nproc bounded by the usable cores ----------------------------------------------------------------------------
def test_nproc_above_the_usable_cores_is_refused_naming_the_maximum():
    cores = usable_cpus()
    assert coerce("nproc", str(cores)) == cores
    with pytest.raises(ConfigError) as refused:
        coerce("nproc", "1000" if cores < 1000 else str(cores + 1))
    message = str(refused.value)
    assert "'nproc'" in message and "1000" in message and f"to {cores}" in message and "CPU cores" in message, message


def cli_mode(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yolo_cb", *args], cwd=tmp_path, capture_output=True, text=True, timeout=300)


def test_nproc_1000_on_the_command_line_is_one_line_exit_2(tmp_path):
    line = one_line_error(cli_mode(tmp_path, "train", "nproc=1000", f"data={tmp_path / 'none.yaml'}"))
    assert "nproc" in line and "1000" in line and f"to {usable_cpus()}" in line, line


# --- 3. imgsz bounded ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["32768", "1e9"])
def test_a_huge_imgsz_on_the_command_line_is_one_line_exit_2(tmp_path, value):
    line = one_line_error(cli_mode(tmp_path, "train", f"imgsz={value}", f"data={tmp_path / 'none.yaml'}"))
    assert "'imgsz'" in line and str(MAX_IMGSZ) in line, line


@pytest.mark.slow
def test_a_checkpoints_huge_imgsz_does_not_become_vals_default(planted_run, tmp_path, caplog):
    from yolo_cb import YOLO

    assert planted_run.result.returncode == 0, planted_run.result.stderr[-3000:]
    ckpt = torch.load(planted_run.folder / "weights" / "last.pt", weights_only=True)
    ckpt["train_args"]["imgsz"] = 32768
    torch.save(ckpt, tmp_path / "crafted.pt")
    with caplog.at_level(logging.WARNING, logger="yolo_cb"):
        model = YOLO(str(tmp_path / "crafted.pt"))
    assert "imgsz" not in model.overrides and model.overrides["data"] == str(planted_run.data.resolve())
    warnings = [r.getMessage() for r in caplog.records if "imgsz" in r.getMessage()]
    assert len(warnings) == 1 and "crafted.pt" in warnings[0] and "32768" in warnings[0] and "\n" not in warnings[0], warnings


# --- 4. class names printed escaped ----------------------------------------------------------------------------------
def test_the_per_class_table_prints_names_escaped_and_keeps_them(caplog):
    from yolo_cb.evaluation.validator import Validator

    rows = [{"name": n, "images": 1, "instances": 1, "precision": 0.5, "recall": 0.5, "mAP50": 0.5, "mAP50-95": 0.5} for n in ESCAPES]
    fake = SimpleNamespace(det_metrics=SimpleNamespace(nt=np.array([4]), mp=0.5, mr=0.5, map50=0.5, map=0.5), seen=4, nc=4,
                           training=False, plot=False, args=SimpleNamespace(verbose=False), per_class=rows, speed={})
    with caplog.at_level(logging.INFO, logger="yolo_cb"):
        Validator.print_results(fake)
    table = next(r.getMessage() for r in caplog.records if "mAP50-95" in r.getMessage())
    assert "\x1b" not in table and "\x07" not in table and len(table.splitlines()) == 2 + len(ESCAPES), table
    assert "\\x1b[2J" in table and "\\x1b]0;evil\\x07" in table and "a\\nforged line" in table
    assert [r["name"] for r in rows] == ESCAPES  # what the metrics, per_class.csv and checkpoints keep is unchanged


def test_predict_and_resume_messages_print_names_escaped():
    from yolo_cb.prediction.results import Results
    from yolo_cb.training.resume import describe_dataset

    names = dict(enumerate(ESCAPES))
    result = Results(np.zeros((8, 8, 3), np.uint8), "a.jpg", names, boxes=torch.tensor([[0, 0, 4, 4, 0.9, 0], [1, 1, 5, 5, 0.8, 1]]))
    line = result.verbose() + describe_dataset({"yaml": "d.yaml", "train_images": 1, "val_images": 1, "names": ESCAPES})
    assert "\x1b" not in line and "\n" not in line and "\\x1b[2J" in line, line
    assert result.names == names


# --- 5. a FIFO never hangs the checks --------------------------------------------------------------------------------
CHECK = textwrap.dedent("""
    import logging, sys
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from yolo_cb.data.verify import list_image_files, load_labels
    records, report = load_labels(list_image_files(sys.argv[1]), nc=4, cache=True)
    print("RECORDS", len(records), report["corrupt"])
""")


def test_fifos_among_labels_images_and_the_cache_are_skipped_with_a_warning(tmp_path, shapes_dir):
    images, labels = tmp_path / "images" / "train", tmp_path / "labels" / "train"
    images.mkdir(parents=True)
    labels.mkdir(parents=True)
    for name in ("good.jpg", "fifo_label.jpg"):
        shutil.copy(next((shapes_dir / "images" / "train").glob("*.jpg")), images / name)
    (labels / "good.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    os.mkfifo(labels / "fifo_label.txt")
    os.mkfifo(images / "fifo_image.jpg")
    os.mkfifo(tmp_path / "labels" / "train.yolo_cb.cache")
    try:
        done = subprocess.run([sys.executable, "-c", CHECK, str(images)], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])})
    except subprocess.TimeoutExpired:
        pytest.fail("the label check hung on a FIFO")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "RECORDS 1 1" in done.stdout, output[-3000:]
    assert "fifo_label.txt is not a regular file" in output and "fifo_image.jpg" in output, output[-3000:]
    assert not stat.S_ISFIFO((tmp_path / "labels" / "train.yolo_cb.cache").stat().st_mode)  # the cache was rebuilt in its place
