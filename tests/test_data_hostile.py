"""Hostile or damaged data: torn cache files, YAML alias bombs, odd numbers, odd file names, archive bombs.

Each test builds the bad input for real (a killed writer, a full tmpfs, a real archive served over loopback
http) and checks that yolo-cb either works or stops with one line naming the culprit.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml
from shared_data import SHARED

from yolo_cb.data.dataset import YOLODataset
from yolo_cb.data.npy_cache import npy_valid
from yolo_cb.utils.paths import DEFAULT_CFG

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
SHAPES = SHARED / "datasets" / "shapes"
NAMES = ["circle", "rectangle", "triangle", "cross"]


def hyp(**overrides) -> types.SimpleNamespace:
    cfg = yaml.safe_load(DEFAULT_CFG.read_text())
    cfg.update(overrides)
    return types.SimpleNamespace(**cfg)


def copy_shapes(dest: Path, n: int = 4, split: str = "train") -> Path:
    """The first n shared shapes images + labels copied into dest/images/<split> (shared/ is never written)."""
    if not SHAPES.is_dir():
        pytest.skip(f"shared shapes dataset not found at {SHAPES}")
    for kind, suffix in (("images", ".jpg"), ("labels", ".txt")):
        (dest / kind / split).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            name = f"{split}_{i:05d}{suffix}"
            shutil.copyfile(SHAPES / kind / split / name, dest / kind / split / name)
    return dest / "images" / split


def child_env() -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)]), "OMP_NUM_THREADS": "1"}


# --- 1. cache=disk: torn .npy files ----------------------------------------------------------------
def test_torn_npy_caches_are_rebuilt(tmp_path):
    images = copy_shapes(tmp_path, n=4)
    plain = YOLODataset(str(images), 160, NAMES, False, hyp())
    expected = [plain[i]["img"] for i in range(len(plain))]
    files = sorted(images.glob("*.jpg"))
    good = np.zeros((4, 4, 3), np.uint8)
    with open(files[2].with_suffix(".npy"), "wb") as f:
        np.save(f, good)  # a complete .npy of another image size: not this image's cache
    full = cv2.imread(str(files[3]))
    np.save(files[3].with_suffix(".npy"), full)
    torn = files[3].with_suffix(".npy").read_bytes()
    files[0].with_suffix(".npy").write_bytes(b"")  # what a full disk leaves
    files[1].with_suffix(".npy").write_bytes(torn[: len(torn) // 2])  # truncated mid-write
    files[3].with_suffix(".npy").write_bytes(torn[:100])  # the header and a little data
    disk = YOLODataset(str(images), 160, NAMES, False, hyp(), cache="disk")
    for i, rec in enumerate(disk.labels):
        assert npy_valid(Path(rec["im_file"]).with_suffix(".npy"), rec["im_file"], rec["shape"]), rec["im_file"]
        assert np.array_equal(disk[i]["img"], expected[i])


KILLED_WRITER = """
import sys, types, yaml
from yolo_cb.data.dataset import YOLODataset
from yolo_cb.utils.paths import DEFAULT_CFG
YOLODataset(sys.argv[1], 160, ["a"], False, types.SimpleNamespace(**yaml.safe_load(DEFAULT_CFG.read_text())), cache="disk")
"""


def big_images(folder: Path, n: int, size: int = 1600) -> list[Path]:
    """n large, cheaply compressed jpgs (a gradient), so that each .npy takes a while to write."""
    folder.mkdir(parents=True)
    ramp = np.linspace(0, 255, size, dtype=np.uint8)
    out = []
    for i in range(n):
        img = np.dstack([np.tile(ramp, (size, 1)), np.tile(ramp[:, None], (1, size)), np.full((size, size), 40 * i, np.uint8)])
        cv2.imwrite(str(folder / f"{i}.jpg"), img)
        out.append(folder / f"{i}.jpg")
    return out


def test_kill_9_while_writing_the_disk_cache_leaves_no_torn_npy(tmp_path):
    images = tmp_path / "images"
    files = big_images(images, 6)
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(images)], env=child_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60  # only a hung child reaches this
    try:
        while child.poll() is None and time.monotonic() < deadline and not any(f.with_suffix(".npy").exists() for f in files):
            time.sleep(0.0005)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL, "the child finished before it was killed: make the images bigger"
    shape = (1600, 1600)
    present = [f for f in files if f.with_suffix(".npy").exists()]
    assert present and all(npy_valid(f.with_suffix(".npy"), str(f), shape) for f in present), [
        (f.name, f.with_suffix(".npy").stat().st_size) for f in present]
    later = YOLODataset(str(images), 160, ["a"], False, hyp(), cache="disk")
    assert all(npy_valid(f.with_suffix(".npy"), str(f), shape) for f in files) and len(later[0]["img"].shape) == 3


FULL_DISK = """
import json, shutil, sys, types, logging, yaml
import cv2
from pathlib import Path
import numpy as np
from yolo_cb.data.dataset import YOLODataset
from yolo_cb.data.npy_cache import npy_valid
from yolo_cb.utils.paths import DEFAULT_CFG
mount, source = Path(sys.argv[1]), Path(sys.argv[2])
hyp = types.SimpleNamespace(**yaml.safe_load(DEFAULT_CFG.read_text()))
shutil.copytree(source, mount / "d")
images = mount / "d" / "images" / "train"
free = shutil.disk_usage(mount).free
with open(mount / "filler", "wb") as f:  # leave room for about two of the eight .npy files
    f.write(b"\\0" * max(0, free - 2 * 400 * 1024))
logging.basicConfig(level=logging.WARNING, stream=sys.stdout)
result = {}
try:
    YOLODataset(str(images), 160, ["a", "b", "c", "d"], False, hyp, cache="disk")
    result["first"] = "ok"
except Exception as e:
    result["first"] = f"{type(e).__name__}: {e}"
result["torn_after_full"] = [p.name for p in images.glob("*.npy")
                           if not npy_valid(p, str(p.with_suffix(".jpg")), cv2.imread(str(p.with_suffix(".jpg"))).shape[:2])]
result["leftovers"] = [p.name for p in images.iterdir() if p.suffix not in (".jpg", ".npy")]
(mount / "filler").unlink()
try:
    ds = YOLODataset(str(images), 160, ["a", "b", "c", "d"], False, hyp, cache="disk")
    ds[0]
    result["second"] = "ok"
    result["valid_after"] = all(npy_valid(Path(r["im_file"]).with_suffix(".npy"), r["im_file"], r["shape"]) for r in ds.labels)
except Exception as e:
    result["second"] = f"{type(e).__name__}: {e}"
print("RESULT " + json.dumps(result))
"""


def test_full_disk_during_cache_disk_then_freed(tmp_path):
    from test_bad_input import namespace_with_tmpfs

    source = copy_shapes(tmp_path / "src", n=8).parents[1]
    mount = tmp_path / "mnt"
    wrap = namespace_with_tmpfs(mount, "size=4m")
    out = subprocess.run([*wrap, sys.executable, "-c", FULL_DISK, str(mount), str(source)], capture_output=True, text=True,
                         env=child_env(), timeout=120)
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, out.stdout + out.stderr
    result = json.loads(line[7:])
    assert result["first"] == "ok" and "cache=disk: cannot write" in out.stdout and "no space left on device" in out.stdout.lower(), out.stdout
    assert result["torn_after_full"] == [] and result["leftovers"] == [], result
    assert result["second"] == "ok" and result["valid_after"], result


# --- 2. YAML alias bombs ---------------------------------------------------------------------------
QUICK = ["imgsz=64", "batch=2", "epochs=1", "workers=0", "plots=false", "mlflow=false", "tensorboard=false", "onnx_check=false"]
MEMORY_CAP = int(1.5 * 2**30)  # RLIMIT_DATA (heap and private mappings): torch imports under it, a bomb does not expand


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """'Billion laughs' as one YAML flow list: level k lists level k-1 `width` times, so the last stands for width**levels values."""
    parts = ["&l0 [" + ", ".join(["lol"] * width) + "]"]
    parts += [f"&l{k} [" + ", ".join([f"*l{k - 1}"] * width) + "]" for k in range(1, levels)]
    return "[" + ", ".join(parts) + "]"


def capped_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """The real CLI under a 1.5 GB memory cap, killed after 60 s (only a bomb that expands gets near either: a run that
    refuses it takes about 5 s on a quiet 2-core machine; 60 s leaves room for a busy one)."""
    import resource

    def cap():
        resource.setrlimit(resource.RLIMIT_DATA, (MEMORY_CAP, MEMORY_CAP))

    env = {**child_env(), "HOME": str(cwd), "YOLO_CB_DATASETS": str(cwd / "datasets")}
    return subprocess.run([sys.executable, "-m", "yolo_cb", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=60, preexec_fn=cap)


def one_error_line(out: subprocess.CompletedProcess, *needles: str) -> str:
    lines = [x for x in out.stderr.splitlines() if x.startswith("yolo-cb: error:")]
    assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert all(n in lines[0] for n in needles) and len(lines[0]) < 600, lines[0]
    return lines[0]


@pytest.mark.parametrize("where", ["data_names", "data_train", "cfg_file", "model_yaml"])
def test_yaml_alias_bomb_is_refused_before_it_expands(where, tmp_path, shapes_small_yaml):
    bomb = alias_bomb()
    assert len(bomb) < 600
    data = yaml.safe_load(shapes_small_yaml.read_text())
    data["path"] = str(shapes_small_yaml.parent)
    data_file, args = tmp_path / "data.yaml", ["train", f"project={tmp_path / 'runs'}", *QUICK]
    text = "".join(f"{k}: {v}\n" for k, v in data.items() if k != "names") + "names: [circle, rectangle, triangle, cross]\n"
    if where == "data_names":
        text = text.replace("names: [circle, rectangle, triangle, cross]", f"names: {bomb}")
    elif where == "data_train":
        text = text.replace(f"train: {data['train']}", f"train: {bomb}")
    data_file.write_text(text)
    culprit = data_file
    args.append(f"data={data_file}")
    if where == "cfg_file":
        culprit = tmp_path / "settings.yaml"
        culprit.write_text(f"classes: {bomb}\n")
        args.append(f"cfg={culprit}")
    elif where == "model_yaml":
        culprit = tmp_path / "bomb-model.yaml"
        culprit.write_text(f"depth: 0.33\nwidth: 0.25\nact: {bomb}\n")
        args.append(f"model={culprit}")
    one_error_line(capped_cli(args, tmp_path), str(culprit), "alias")


def test_recursive_alias_and_deep_nesting_are_one_line(tmp_path):
    from yolo_cb.errors import ConfigError
    from yolo_cb.settings.config import get_config

    for text, needle in (("classes: &a [*a]\n", "contains it"), ("classes: " + "[" * 5000 + "\n", "nested too deeply")):
        (tmp_path / "c.yaml").write_text(text)
        with pytest.raises(ConfigError, match=needle):
            get_config({"cfg": str(tmp_path / "c.yaml")})


def test_a_few_aliases_still_load(tmp_path):
    from yolo_cb.utils.yaml_safe import load_yaml

    (tmp_path / "ok.yaml").write_text("base: &b {lr0: 0.01, epochs: 3}\nrun: {<<: *b, epochs: 5}\nlist: [*b, *b]\n")
    assert load_yaml(tmp_path / "ok.yaml") == {"base": {"lr0": 0.01, "epochs": 3}, "run": {"lr0": 0.01, "epochs": 5},
                                               "list": [{"lr0": 0.01, "epochs": 3}] * 2}


def test_invalid_value_messages_do_not_repr_the_whole_value():
    from yolo_cb.errors import ConfigError
    from yolo_cb.settings.config import get_config

    with pytest.raises(ConfigError) as caught:
        get_config({"lr0": "x" * 100_000})
    assert len(str(caught.value)) < 300 and "lr0" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        get_config({"lr0": [list(range(1000))] * 1000})
    assert len(str(caught.value)) < 300


# --- 3. numbers Python accepts -----------------------------------------------------------------------
def test_floats_without_a_dot_are_numbers(tmp_path):
    from yolo_cb.errors import ConfigError
    from yolo_cb.settings.config import get_config

    (tmp_path / "s.yaml").write_text("lr0: 1e-3\nwarmup_bias_lr: 5E-2\n")  # YAML 1.1 reads these two as text
    cfg = get_config({"cfg": str(tmp_path / "s.yaml"), "time": "1e-4", "conf": "1E-3", "epochs": "1e1", "iou": " 7e-1 "})
    assert (cfg.lr0, cfg.warmup_bias_lr, cfg.time, cfg.conf, cfg.epochs, cfg.iou) == (1e-3, 5e-2, 1e-4, 1e-3, 10, 0.7)
    for key, value in (("lr0", "nan"), ("lr0", "-1e-3"), ("epochs", "1.5e0"), ("conf", "2e0")):
        with pytest.raises(ConfigError, match=key):
            get_config({key: value})


def test_cli_takes_exponent_floats(tmp_path):
    out = capped_cli(["val", "lr0=1e-3", "time=1e-4", "conf=1E-3", f"model={tmp_path / 'missing.pt'}"], tmp_path)
    line = one_error_line(out, "missing.pt")  # it got past the settings to the model
    assert "lr0" not in line and "time" not in line and "conf" not in line


# --- 4. file names that are not UTF-8 ----------------------------------------------------------------
def test_non_utf8_image_name_is_skipped_with_one_warning(tmp_path, caplog):
    import logging

    images = copy_shapes(tmp_path, n=3)
    shutil.copyfile(images / "train_00000.jpg", os.fsencode(images) + b"/\xff.jpg")
    shutil.copyfile(tmp_path / "labels" / "train" / "train_00000.txt", os.fsencode(tmp_path / "labels" / "train") + b"/\xff.txt")
    logger = logging.getLogger("yolo_cb")
    attach = not logger.propagate  # caplog sees a propagating logger already
    if attach:
        logger.addHandler(caplog.handler)
    try:
        caplog.set_level(logging.WARNING, logger="yolo_cb")
        ds = YOLODataset(str(images), 64, NAMES, False, hyp())
        again = YOLODataset(str(images), 64, NAMES, False, hyp())  # from the label cache written by the first
    finally:
        if attach:
            logger.removeHandler(caplog.handler)
    assert len(ds) == len(again) == 3 and again.report["from_cache"] and ds[0]["img"].shape[0] == 3
    warnings = [r.getMessage() for r in caplog.records if "not valid UTF-8" in r.getMessage()]
    assert len(warnings) == 2 and "\\xff.jpg" in warnings[0] and "\n" not in warnings[0], warnings


# --- 5. archive bombs and archives that fail half-way --------------------------------------------------
from test_data_safety import dataset_zip, server  # noqa: E402, F401 - the loopback http server fixture and a dataset zip

BOMB_MIB = 70  # over the 64 MiB any archive may expand to; about 70 KiB compressed


def add_zeros(zf, name: str, mib: int) -> None:
    """A member of `mib` MiB of zeros, written in 1 MiB blocks (deflate turns it into a few KiB per MiB)."""
    import zipfile

    info = zipfile.ZipInfo(name)
    info.compress_type = zipfile.ZIP_DEFLATED
    block = bytes(2**20)
    with zf.open(info, "w", force_zip64=True) as f:
        for _ in range(mib):
            f.write(block)


def data_yaml_downloading(tmp_path: Path, url: str) -> Path:
    yaml_file = tmp_path / "data.yaml"
    yaml_file.write_text(yaml.safe_dump({"path": "ds", "train": "images/train", "val": "images/val", "names": ["a"], "download": url}))
    return yaml_file


def test_zip_bomb_download_is_refused_before_writing(tmp_path, server):  # noqa: F811
    import zipfile

    from yolo_cb.data.resolve import check_data
    from yolo_cb.errors import DataError

    www, url, _ = server
    dataset_zip(www / "bomb.zip", "ds")
    with zipfile.ZipFile(www / "bomb.zip", "a") as zf:
        add_zeros(zf, "ds/padding.bin", BOMB_MIB)
    assert (www / "bomb.zip").stat().st_size < 2**20
    store = tmp_path / "store"
    with pytest.raises(DataError, match="zip bomb") as caught:
        check_data(data_yaml_downloading(tmp_path, f"{url}/bomb.zip"), datasets_dir=str(store))
    assert "bomb.zip" in str(caught.value) and "\n" not in str(caught.value)
    assert list(store.iterdir()) == []  # no tree, no temp archive, no staging folder


def test_tar_gz_bomb_is_refused_before_writing(tmp_path):
    import io
    import tarfile

    from yolo_cb.data.download import safe_extract
    from yolo_cb.errors import DataError

    archive = tmp_path / "bomb.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        info = tarfile.TarInfo("ds/padding.bin")
        info.size = BOMB_MIB * 2**20
        tf.addfile(info, io.BytesIO(bytes(info.size)))
    (tmp_path / "out").mkdir()
    with pytest.raises(DataError, match="zip bomb"):
        safe_extract(archive, tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []


def test_a_corrupt_member_half_way_leaves_nothing(tmp_path, server):  # noqa: F811
    import zipfile

    from yolo_cb.data.resolve import check_data
    from yolo_cb.errors import DataError

    www, url, _ = server
    dataset_zip(www / "torn.zip", "ds")
    payload = b"A" * 4096
    with zipfile.ZipFile(www / "torn.zip", "a") as zf:
        zf.writestr(zipfile.ZipInfo("ds/zz_last.bin"), payload)  # stored: its bytes appear as they are
    raw = (www / "torn.zip").read_bytes()
    (www / "torn.zip").write_bytes(raw.replace(payload, b"B" * 4096))  # the CRC no longer matches: found only on reading it
    store = tmp_path / "store"
    with pytest.raises(DataError, match="corrupt"):
        check_data(data_yaml_downloading(tmp_path, f"{url}/torn.zip"), datasets_dir=str(store))
    assert list(store.iterdir()) == []  # the members extracted before the bad one are gone too


# --- 6. loops, missing splits, fractional class ids, shared label files ----------------------------------
def test_symlink_loop_in_path_or_datasets_dir_is_one_line(tmp_path, shapes_small_yaml):
    from yolo_cb.data.resolve import check_data
    from yolo_cb.errors import DataError

    (tmp_path / "loop").symlink_to("loop")
    looped = tmp_path / "looped.yaml"
    looped.write_text(f"path: {tmp_path / 'loop' / 'ds'}\ntrain: images/train\nval: images/val\nnames: [a]\n")
    line = one_error_line(capped_cli(["train", f"data={looped}", f"project={tmp_path / 'runs'}", *QUICK], tmp_path), "'path: ")
    assert str(looped) in line and "link" in line
    relative = tmp_path / "relative.yaml"
    relative.write_text("path: ds\ntrain: images/train\nval: images/val\nnames: [a]\n")
    with pytest.raises(DataError, match="datasets_dir=.*link") as caught:  # the same DataError, which the CLI prints as one line
        check_data(relative, datasets_dir=str(tmp_path / "loop"))
    assert "\n" not in str(caught.value)


def test_split_without_its_key_names_the_yaml_and_its_keys(tmp_path, shapes_small_yaml):
    from yolo_cb.errors import DataError
    from yolo_cb.evaluation.validator import Validator
    from yolo_cb.nn import build_model
    from yolo_cb.settings.config import get_config

    args = get_config({"data": str(shapes_small_yaml), "imgsz": 64, "batch": 2, "workers": 0, "split": "test", "plots": False,
                       "project": str(tmp_path / "runs"), "name": "val"})
    with pytest.raises(DataError) as caught:
        Validator(args)(model=build_model("yolox-nano.yaml", nc=4, verbose=False).eval())
    message = str(caught.value)
    assert str(shapes_small_yaml) in message and "'test'" in message and "path, train, val, names" in message, message


@pytest.mark.parametrize("key", ["1.5", "true", "x"])
def test_names_key_that_is_not_a_whole_class_id_is_refused(key, tmp_path, shapes_small_yaml):
    from yolo_cb.data.resolve import check_data
    from yolo_cb.errors import DataError

    data = tmp_path / "data.yaml"
    data.write_text(f"path: {shapes_small_yaml.parent}\ntrain: train.txt\nval: val.txt\nnames: {{0: circle, {key}: square}}\n")
    with pytest.raises(DataError, match="integer class ids") as caught:
        check_data(data)
    assert str(data) in str(caught.value) and "\n" not in str(caught.value)


def test_images_sharing_a_label_file_are_named_once(tmp_path, caplog):
    import logging

    images = copy_shapes(tmp_path, n=2)
    cv2.imwrite(str(images / "train_00000.png"), cv2.imread(str(images / "train_00000.jpg")))
    logger = logging.getLogger("yolo_cb")
    attach = not logger.propagate
    if attach:
        logger.addHandler(caplog.handler)
    try:
        caplog.set_level(logging.WARNING, logger="yolo_cb")
        ds = YOLODataset(str(images), 64, NAMES, False, hyp())
    finally:
        if attach:
            logger.removeHandler(caplog.handler)
    assert len(ds) == 3
    shared = [r.getMessage() for r in caplog.records if "is the label file of" in r.getMessage()]
    assert len(shared) == 1 and "train_00000.jpg" in shared[0] and "train_00000.png" in shared[0] and "train_00000.txt" in shared[0]
