"""Shared fixtures: paths to ../shared datasets and tiny data YAMLs pointing at them in place."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # for the test callback package `cbpkg`

from shared_data import SHARED  # noqa: E402


def pytest_configure(config):
    """One compute thread per test process, and per process a test starts (OMP_NUM_THREADS is inherited), unless the
    caller sets it. The suite's models are tiny: on a quiet 2-core machine one thread is as fast as two, and on a busy
    one two threads wait on each other at every parallel region (measured: tests/test_training_control.py and
    tests/test_lr_schedule.py beside two busy processes, 130 s with two threads, 57 s with one)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Byte-code is cached for every process of the suite (these machines set PYTHONDONTWRITEBYTECODE=1, and `make venv`
    # installs torch without compiling it): without the cache each test process compiled the modules it imports again,
    # 8.3 CPU-s for `import yolo_cb.model, torchvision` against 3.5 s with it (measured on a busy AMD EPYC, Zen 4), and
    # more for the processes that import mlflow, OpenVINO or optuna. The .pyc files land in .venv and __pycache__/.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
    # comet_ml, once imported (tests/test_integration_trackers.py), patches mlflow for the rest of the process and writes
    # .cometml-runs/ into the working directory whenever a later test logs to MLflow (yolo_cb's Comet integration does
    # the same for users, see integrations/comet.py: import_comet)
    os.environ.setdefault("COMET_DISABLE_AUTO_LOGGING", "1")
    # The user's own settings file (`yolo-cb settings`, yolo_cb/settings/user.py) never reaches the suite: its folder is
    # one that does not exist (tests of the file point YOLO_CB_CONFIG_DIR at their tmp_path).
    import tempfile

    os.environ["YOLO_CB_CONFIG_DIR"] = os.path.join(tempfile.gettempdir(), f"yolo-cb-no-user-settings-{os.getpid()}")
    # A suite started in the background of a non-interactive shell (`make test &`, `bash -c '... &'`: how CI logs are
    # often made) starts with SIGINT ignored, and every process a test starts inherits that through exec: Ctrl-C tests
    # then see a child that cannot be interrupted. The suite runs as from a terminal: SIGINT raises KeyboardInterrupt.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _checkout_files() -> set[str]:
    """Files in the checkout, git-ignored ones included, except the venv and Python's own byte-code caches."""
    import subprocess

    try:
        out = subprocess.run(["git", "status", "--porcelain", "--ignored", "--untracked-files=all"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return set()
    return {line for line in out.splitlines() if not any(part in line for part in (".venv/", "__pycache__", ".egg-info/"))}


@pytest.fixture(scope="session", autouse=True)
def suite_writes_nothing_into_the_checkout():
    """Tests write under tmp_path only: the checkout (runs/, datasets/, logs, caches) is the same after the suite."""
    before = _checkout_files()
    yield
    added = sorted(_checkout_files() - before)
    assert not added, f"the test suite wrote into the checkout {ROOT}: {added[:10]}"


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} is missing (../shared datasets)")
    return path


@pytest.fixture(scope="session")
def shapes_dir() -> Path:
    return _need(SHARED / "datasets" / "shapes")


@pytest.fixture(scope="session")
def coco8_dir() -> Path:
    return _need(SHARED / "datasets" / "coco8")


@pytest.fixture(scope="session")
def shapes_yaml(tmp_path_factory, shapes_dir) -> Path:
    """A data YAML using ../shared/datasets/shapes in place (its own data.yaml has no path:)."""
    path = tmp_path_factory.mktemp("data") / "shapes.yaml"
    path.write_text(f"path: {shapes_dir}\ntrain: images/train\nval: images/val\nnames: [circle, rectangle, triangle, cross]\n")
    return path


@pytest.fixture(scope="session")
def shapes_small_yaml(tmp_path_factory, shapes_dir) -> Path:
    """A small subset of shapes (32 train / 16 val images via .txt lists) for fast trainings."""
    return _small_shapes_yaml(tmp_path_factory.mktemp("shapes_small"), shapes_dir)


@pytest.fixture(scope="session")
def coco8_yaml(tmp_path_factory, coco8_dir) -> Path:
    import yaml

    names = yaml.safe_load((ROOT / "cfg" / "datasets" / "coco8.yaml").read_text())["names"]
    path = tmp_path_factory.mktemp("data") / "coco8.yaml"
    path.write_text(yaml.safe_dump({"path": str(coco8_dir), "train": "images/train", "val": "images/val", "names": names}))
    return path


# Settings for tiny, fast trainings on 2 CPU cores: no integrations unless a test turns one on.
TINY = dict(model="yolox-nano.yaml", imgsz=64, batch=8, epochs=1, workers=0, mosaic=0.0, mlflow=False, tensorboard=False,
            onnx_check=False, plots=False, no_aug_epochs=0, warmup_epochs=0.0, optimizer="AdamW", lr0=0.002, exist_ok=False)


@pytest.fixture
def yolocb_yaml(tmp_path):
    """yolocb_yaml(key=value, ...): the path of a copy of the bundled yolocb-n.yaml with those keys set."""
    import yaml

    from yolo_cb.utils.paths import find_model_cfg

    def write(**keys) -> Path:
        data = {**yaml.safe_load(find_model_cfg("yolocb-n.yaml").read_text()), **keys}
        path = tmp_path / f"yolocb-n-{'-'.join(str(v) for v in keys.values())}.yaml"
        path.write_text(yaml.safe_dump(data))
        return path

    return write


def _shared_root(tmp_path_factory, worker_id: str) -> Path:
    """A folder every process of this test run sees (pytest-xdist's workers share the parent of their base temp)."""
    base = tmp_path_factory.getbasetemp()
    return (base if worker_id == "master" else base.parent) / "shared_trainings"


@pytest.fixture(scope="session")
def trained_copy(tmp_path_factory, shapes_dir, worker_id):
    """trained_copy(dest, n_train=32, n_val=16, **settings) -> dest/<run>: a copy of the run folder of a tiny training
    (TINY on the first n_train / n_val shapes images, with `settings` over it; its data YAML is args.yaml's data), trained once per test run whichever process asks first, under a file lock, in a
    folder keyed by the settings. For tests that need *a* trained model (to validate, predict, export, resume or
    craft); a test about how a model is trained keeps its own training. Each caller gets its own copy to write into."""
    import hashlib
    import json
    import shutil

    from filelock import FileLock

    root = _shared_root(tmp_path_factory, worker_id)
    root.mkdir(parents=True, exist_ok=True)

    def get(dest: Path, n_train: int = 32, n_val: int = 16, **settings) -> Path:
        run = {**TINY, "name": "run", **settings}
        key = hashlib.sha256(json.dumps([run, n_train, n_val], sort_keys=True, default=str).encode()).hexdigest()[:16]
        folder = root / key
        with FileLock(str(root / f"{key}.lock")):
            if not (folder / "done").is_file():
                shutil.rmtree(folder, ignore_errors=True)
                data = _small_shapes_yaml(folder / "data", shapes_dir, n_train, n_val)
                from yolo_cb import YOLO

                YOLO(run.pop("model")).train(**run, data=str(data), project=str(folder / "runs"))
                (folder / "done").write_text(json.dumps(settings, default=str))
        target = Path(dest) / run["name"]
        shutil.copytree(folder / "runs" / run["name"], target)
        return target

    return get


def _small_shapes_yaml(folder: Path, shapes_dir: Path, n_train: int = 32, n_val: int = 16) -> Path:
    """The first n_train / n_val shapes images listed in place (32 / 16: the shapes_small_yaml subset), and the data YAML
    naming them."""
    folder.mkdir(parents=True, exist_ok=True)
    train = sorted((shapes_dir / "images" / "train").glob("*.jpg"))[:n_train]
    val = sorted((shapes_dir / "images" / "val").glob("*.jpg"))[:n_val]
    (folder / "train.txt").write_text("\n".join(map(str, train)) + "\n")
    (folder / "val.txt").write_text("\n".join(map(str, val)) + "\n")
    path = folder / "shapes_small.yaml"
    path.write_text(f"path: {folder}\ntrain: train.txt\nval: val.txt\nnames: [circle, rectangle, triangle, cross]\n")
    return path


@pytest.fixture
def tiny(tmp_path, shapes_small_yaml):
    """Keyword arguments for a tiny training run in tmp_path."""
    return {**TINY, "data": str(shapes_small_yaml), "project": str(tmp_path / "runs"), "name": "exp"}


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL server on loopback for the whole session (tests/pg_server.py); `postgres.database(name)` -> URL."""
    from pg_server import PostgresServer

    server = PostgresServer().start()
    yield server
    server.stop()


def pytest_unconfigure(config):
    """The suite's own config folder (pytest_configure) goes with the run: an in-process TorchScript export writes its
    key and records there (yolo_cb/prediction/model_trust.py)."""
    import shutil

    folder = os.environ.get("YOLO_CB_CONFIG_DIR", "")
    if "yolo-cb-no-user-settings-" in folder:
        shutil.rmtree(folder, ignore_errors=True)


def wait_with_peak_rss(child: subprocess.Popen, limit_s: float) -> tuple[int, int]:
    """(exit status, peak RSS in KiB of the child and everything it waited for); a child still running at limit_s is killed."""
    timer = threading.Timer(limit_s, child.kill)
    timer.start()
    try:
        _, status, usage = os.wait4(child.pid, 0)
    finally:
        timer.cancel()
    child.returncode = os.waitstatus_to_exitcode(status)
    return child.returncode, usage.ru_maxrss
