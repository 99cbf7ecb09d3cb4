"""Issue 59, section 3: files we open in run folders we did not make. A `.lock` that is a hard link to a file elsewhere
is refused and that file keeps its bytes; a `.lock` that is a FIFO or a folder is one line and exit 2, never a hang or a
traceback. A process forked by a callback that outlives the run does not keep the folder locked; a process that does
hold the lock (its descriptor passed on) is the one the refusal names, not the run that has ended. Beside the lock: a
link planted at weights/ is not written through, and a worst_batches image name that is a hard link keeps the other
file's bytes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_resume_safety import SMALL, cli, kv, write_data
from test_security_round4 import OUTSIDE, one_line_error

from yolo_cb.errors import UserError
from yolo_cb.utils.run_lock import RunFolderInUse, lock_run_folder

FORKER = """import os, time
def fork_a_helper(trainer):
    pid = os.fork()
    if pid == 0:  # a helper process: detached from the run's output, alive past the run's end
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not os.path.exists(os.environ["FORK_DIR"] + "/stop"):
            time.sleep(0.1)
        os._exit(0)
    with open(os.environ["FORK_DIR"] + "/child.pid", "w") as f:
        f.write(str(pid))
"""

# locks `folder`, starts a sleeper that inherits the lock's descriptor (pass_fds), prints its PID and ends
PASS_ON = """import os, subprocess, sys
from pathlib import Path
from yolo_cb.utils.run_lock import lock_run_folder
folder = Path(sys.argv[1])
lock = lock_run_folder(folder)
ours = os.stat(folder / ".lock")
fd = next(n for n in map(int, os.listdir("/proc/self/fd")) if (lambda s: (s.st_dev, s.st_ino))(os.fstat(n)) == (ours.st_dev, ours.st_ino))
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], pass_fds=(fd,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(child.pid, flush=True)
"""


def run_settings(tmp_path: Path, shapes_dir: Path, **extra) -> list[str]:
    data = write_data(tmp_path / "data", shapes_dir)
    return kv({**SMALL, "data": data, "epochs": 1, "project": tmp_path / "runs", "name": "job", "exist_ok": True, **extra})


def hard_linked_lock(tmp_path: Path) -> Path:
    """runs/job/.lock as a second name of outside/target (OUTSIDE's bytes); returns the target."""
    (tmp_path / "runs" / "job").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    target = tmp_path / "outside" / "target"
    target.write_bytes(OUTSIDE)
    os.link(target, tmp_path / "runs" / "job" / ".lock")
    return target


def kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_a_hard_linked_lock_is_refused_and_the_other_file_keeps_its_bytes(tmp_path):
    """The lock was opened without O_TRUNC but truncated after the flock: the file of the lock's other name was emptied."""
    target = hard_linked_lock(tmp_path)
    with pytest.raises(UserError) as refused:
        lock_run_folder(tmp_path / "runs" / "job")
    message = str(refused.value)
    assert len(message.splitlines()) == 1 and ".lock" in message and "hard link" in message, message
    assert target.read_bytes() == OUTSIDE


@pytest.mark.slow
def test_a_run_into_a_folder_with_a_hard_linked_lock_is_one_line_and_the_other_file_intact(tmp_path, shapes_dir):
    target = hard_linked_lock(tmp_path)
    line = one_line_error(cli(tmp_path, *run_settings(tmp_path, shapes_dir), timeout=300))
    assert ".lock" in line and "hard link" in line, line
    assert target.read_bytes() == OUTSIDE


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_lock_that_is_a_fifo_or_a_folder_is_one_line_exit_2(tmp_path, shapes_dir, kind):
    """A FIFO's ftruncate and a folder's open raised OSErrors no one mapped: a traceback, exit 1."""
    lock = tmp_path / "runs" / "job" / ".lock"
    lock.parent.mkdir(parents=True)
    os.mkfifo(lock) if kind == "fifo" else lock.mkdir()
    line = one_line_error(cli(tmp_path, *run_settings(tmp_path, shapes_dir), timeout=300))  # a hang fails as a timeout
    said = {"fifo": "named pipe", "folder": "folder"}[kind]
    assert str(lock) in line and said in line, line


@pytest.mark.slow
def test_a_helper_forked_by_a_callback_does_not_keep_the_folder_locked(tmp_path, shapes_dir):
    """The flock belonged to the open file, and a fork shares it: the helper kept the folder locked after the run ended,
    and the next run was refused 'in use by PID <the run's PID>', a process that no longer existed."""
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "forker.py").write_text(FORKER)
    settings = run_settings(tmp_path, shapes_dir)
    env = {"FORK_DIR": str(tmp_path), "PYTHONPATH": os.pathsep.join([str(tmp_path / "mods"), os.environ.get("PYTHONPATH", "")])}
    child = None
    try:
        first = cli(tmp_path, *settings, "callbacks=on_train_start=forker:fork_a_helper", env=env, timeout=300)
        assert first.returncode == 0, first.stderr[-3000:]
        child = int((tmp_path / "child.pid").read_text())
        os.kill(child, 0)  # the helper is alive: the run ended before it
        second = cli(tmp_path, *settings, "seed=1", timeout=300)
        assert second.returncode == 0, second.stderr[-3000:]
    finally:
        (tmp_path / "stop").touch()
        if child is not None:
            kill(child)


def test_a_process_given_the_locks_descriptor_is_the_holder_named(tmp_path):
    """A process that took the lock's descriptor with it (pass_fds) holds the lock after the locking process ended: the
    refusal named the ended process's PID (from the file) instead of the live one."""
    holder = subprocess.run([sys.executable, "-c", PASS_ON, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert holder.returncode == 0, holder.stderr[-3000:]
    child = int(holder.stdout.split()[-1])
    try:
        with pytest.raises(RunFolderInUse) as refused:
            lock_run_folder(tmp_path)
        message = str(refused.value)
        assert f"PID {child}" in message and len(message.splitlines()) == 1, message
    finally:
        kill(child)
    deadline = time.monotonic() + 30
    while True:  # once the holder has ended (killed, then reaped by init), the folder is free
        try:
            lock_run_folder(tmp_path).release()
            break
        except RunFolderInUse:
            assert time.monotonic() < deadline, "the lock stayed held after its holder was killed"
            time.sleep(0.1)


@pytest.fixture(scope="module")
def planted_folders(tmp_path_factory, shapes_dir):
    """A one-epoch run (worst_batches=1 on the training batches) into a folder whose weights/ is a link to a folder
    elsewhere (holding a last.pt and a name like a killed write's temp file) and whose worst/ image name is a hard link."""
    root = tmp_path_factory.mktemp("folders")
    outside = root / "outside"
    outside.mkdir()
    for name in ("last.pt", ".last.pt.dead.tmp", "image.jpg"):
        (outside / name).write_bytes(OUTSIDE)
    job = root / "runs" / "job"
    (job / "worst").mkdir(parents=True)
    (job / "weights").symlink_to(outside)
    os.link(outside / "image.jpg", job / "worst" / "epoch1_train0_batch0.jpg")
    done = cli(root, *run_settings(root, shapes_dir, worst_batches=1, worst_source="train"), timeout=300)
    return done, job, outside


@pytest.mark.slow
def test_a_weights_link_in_a_reused_run_folder_is_not_written_through(planted_folders):
    """weights/ was made with mkdir(exist_ok=True), which accepts a link: last.pt went into the folder it named, and the
    stale-temp cleanup deleted a file there."""
    done, job, outside = planted_folders
    assert done.returncode == 0, done.stderr[-3000:]
    assert {p.name: p.read_bytes() for p in outside.iterdir()} == dict.fromkeys(["last.pt", ".last.pt.dead.tmp", "image.jpg"], OUTSIDE)
    assert not (job / "weights").is_symlink() and (job / "weights" / "last.pt").is_file()


@pytest.mark.slow
def test_a_worst_image_name_that_is_a_hard_link_keeps_the_other_files_bytes(planted_folders):
    """The worst images were written by cv2.imwrite, which truncates the file at the name: a hard link's other file."""
    done, job, outside = planted_folders
    assert done.returncode == 0, done.stderr[-3000:]
    assert (outside / "image.jpg").read_bytes() == OUTSIDE
    assert (job / "worst" / "epoch1_train0_batch0.jpg").read_bytes()[:2] == b"\xff\xd8"  # the run's own JPEG
