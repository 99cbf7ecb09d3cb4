"""Data that must not hurt: downloads stay under datasets_dir, archives cannot escape, verification reads
images the way the loader does, labels with a BOM are fine, and written files follow the umask."""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import os
import stat
import subprocess
import sys
import tarfile
import threading
import types
import zipfile
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml

from yolo_cb import YOLO
from yolo_cb.data import verify
from yolo_cb.data.dataset import YOLODataset
from yolo_cb.data.download import safe_extract
from yolo_cb.data.loading.loader import build_dataloader
from yolo_cb.data.resolve import check_data
from yolo_cb.errors import UserError
from yolo_cb.utils.files import atomic_write_bytes, atomic_write_text
from yolo_cb.utils.paths import DEFAULT_CFG

TESTS = Path(__file__).resolve().parent


# --- a loopback server and a dataset archive ------------------------------------------------------
@pytest.fixture
def server(tmp_path):
    """An http.server on 127.0.0.1 serving tmp_path/www; yields (www, base url, list of requested paths)."""
    www = tmp_path / "www"
    www.mkdir()
    requests: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            requests.append(self.path)
            super().do_GET()

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(www)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield www, f"http://127.0.0.1:{httpd.server_address[1]}", requests
    httpd.shutdown()
    httpd.server_close()


def jpg_bytes(h=32, w=48, value=100) -> bytes:
    return cv2.imencode(".jpg", np.full((h, w, 3), value, np.uint8))[1].tobytes()


def dataset_zip(path: Path, top: str, extra: dict[str, bytes] | None = None) -> Path:
    """A zip holding top/images/{train,val}/0.jpg, their labels, and `extra` members (name -> bytes) as given."""
    with zipfile.ZipFile(path, "w") as zf:
        for split in ("train", "val"):
            zf.writestr(f"{top}/images/{split}/0.jpg", jpg_bytes())
            zf.writestr(f"{top}/labels/{split}/0.txt", "0 0.5 0.5 0.2 0.2\n")
        for name, data in (extra or {}).items():
            zf.writestr(zipfile.ZipInfo(name), data)  # ZipInfo keeps the name exactly (absolute, ..)
    return path


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under folder -> hash of its content (what 'nothing changed here' compares)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


def cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)]), "HOME": str(cwd), "YOLO_CB_DATASETS": str(cwd / "default_datasets"),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return subprocess.run([sys.executable, "-m", "yolo_cb", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


QUICK = ["imgsz=64", "batch=2", "epochs=1", "workers=0", "plots=false", "mlflow=false", "tensorboard=false", "onnx_check=false"]


def refusal(yaml_file: Path, store: Path, tmp_path: Path, via_cli: bool) -> str:
    """The one-line error of a training on `yaml_file` that must be refused: through the CLI (exit 2, one stderr line
    besides the download progress bar, no traceback), or through the same code in this process (a one-line UserError)."""
    if via_cli:
        proc = cli(["train", f"data={yaml_file}", f"datasets_dir={store}", f"project={tmp_path / 'runs'}", *QUICK], tmp_path)
        lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("downloading ")]
        assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr
        assert lines[0].startswith("yolo-cb: error: ") and proc.stderr.rstrip().endswith(lines[0]), proc.stderr
        return lines[0]
    with pytest.raises(UserError) as caught:
        YOLO("yolox-nano.yaml").train(data=str(yaml_file), datasets_dir=str(store), project=str(tmp_path / "runs"), imgsz=64, workers=0)
    assert "\n" not in str(caught.value)
    return str(caught.value)


# --- 1. downloads only under datasets_dir -----------------------------------------------------------
@pytest.mark.parametrize("where", ["absolute", "dotdot", "no_path"])
def test_download_never_writes_outside_datasets_dir(where, tmp_path, server):
    """A data YAML whose root lies outside datasets_dir and a download: URL is refused before any fetch; nothing
    outside datasets_dir changes (the archive would overwrite victim.txt there)."""
    www, url, requests = server
    outside = tmp_path / "outside"
    (outside / "ds").mkdir(parents=True)
    (outside / "victim.txt").write_text("precious\n")
    (outside / "ds" / "keep.txt").write_text("mine\n")
    dataset_zip(www / "ds.zip", "ds", {"victim.txt": b"overwritten\n", "ds/keep.txt": b"overwritten\n"})
    store = tmp_path / "store"
    cfg = {"train": "images/train", "val": "images/val", "names": ["a"], "download": f"{url}/ds.zip"}
    if where == "absolute":
        cfg["path"] = str(outside / "ds")
        yaml_file = tmp_path / "cfgs" / "data.yaml"
    elif where == "dotdot":
        cfg["path"] = "../outside/ds"  # next to the YAML: tmp/outside/ds; under datasets_dir: tmp/outside/ds too
        yaml_file = tmp_path / "cfgs" / "data.yaml"
    else:  # no path: the YAML's own folder is the root, so a download would land in its parent
        yaml_file = outside / "ds" / "data.yaml"
    yaml_file.parent.mkdir(parents=True, exist_ok=True)
    yaml_file.write_text(yaml.safe_dump(cfg))
    before = snapshot(outside)
    error = refusal(yaml_file, store, tmp_path, via_cli=where == "absolute")  # the CLI once; the other roots in this process
    assert snapshot(outside) == before
    assert requests == []  # refused before fetching anything
    assert str(outside / "ds") in error and str(store) in error and "datasets_dir" in error, error


def test_outside_root_is_used_when_the_images_are_there(tmp_path, server):
    www, url, requests = server
    root = tmp_path / "outside" / "ds"
    for split in ("train", "val"):
        (root / "images" / split).mkdir(parents=True)
        (root / "images" / split / "0.jpg").write_bytes(jpg_bytes())
    yaml_file = tmp_path / "data.yaml"
    yaml_file.write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/val", "names": ["a"],
                                         "download": f"{url}/ds.zip"}))
    assert check_data(yaml_file, datasets_dir=str(tmp_path / "store"))["path"] == str(root)
    assert requests == []


def test_relative_path_downloads_under_datasets_dir(tmp_path, server):
    www, url, requests = server
    dataset_zip(www / "ds.zip", "ds")
    yaml_file = tmp_path / "cfgs" / "data.yaml"
    yaml_file.parent.mkdir()
    yaml_file.write_text(yaml.safe_dump({"path": "ds", "train": "images/train", "val": "images/val", "names": ["a"], "download": f"{url}/ds.zip"}))
    store = tmp_path / "store"
    (store / "ds.zip").parent.mkdir()
    (store / "ds.zip").write_bytes(b"the user's own file that happens to share the archive's name")
    out = check_data(yaml_file, datasets_dir=str(store))
    assert out["path"] == str(store / "ds") and (store / "ds" / "images" / "train" / "0.jpg").is_file()
    assert requests == ["/ds.zip"]
    assert (store / "ds.zip").read_bytes().startswith(b"the user's own file")  # not overwritten, not deleted
    assert sorted(p.name for p in store.iterdir()) == ["ds", "ds.zip"]  # no temp files left


def test_archive_members_cannot_escape(tmp_path, server):
    """Zip slip through the CLI: members with '..' or an absolute path are refused and nothing is extracted."""
    www, url, requests = server
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("precious\n")
    for i, evil in enumerate(["../outside/victim.txt", str(outside / "victim.txt"), "ds/../../outside/victim.txt"]):
        dataset_zip(www / f"evil{i}.zip", "ds", {evil: b"overwritten\n"})
        store = tmp_path / f"store{i}"
        yaml_file = tmp_path / f"evil{i}.yaml"
        yaml_file.write_text(yaml.safe_dump({"path": "ds", "train": "images/train", "val": "images/val", "names": ["a"],
                                             "download": f"{url}/evil{i}.zip"}))
        before = snapshot(outside)
        error = refusal(yaml_file, store, tmp_path, via_cli=i == 0)  # the CLI once; the other members in this process
        assert snapshot(outside) == before
        assert "unsafe" in error and evil in error and f"evil{i}.zip" in error, error
        assert not (store / "ds").exists()  # refused before extracting anything
        assert [p.name for p in store.iterdir()] == [] if store.exists() else True


def test_tar_links_and_absolute_members_are_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    for kind in ("symlink", "hardlink", "absolute", "dotdot"):
        archive = tmp_path / f"{kind}.tar"
        with tarfile.open(archive, "w") as tf:
            info = tarfile.TarInfo("ds/x")
            if kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, str(outside)
            elif kind == "hardlink":
                info.type, info.linkname = tarfile.LNKTYPE, str(outside / "victim.txt")
            else:
                info.name = str(outside / "x") if kind == "absolute" else "../outside/x"
                info.size = 1
            tf.addfile(info, io.BytesIO(b"x") if info.isfile() else None)
        with pytest.raises(ValueError, match="unsafe"):
            safe_extract(archive, tmp_path / "out")
        assert list(outside.iterdir()) == []


# --- 2. verification reads images the way the loader does ----------------------------------------
def hyp(**overrides):
    cfg = yaml.safe_load(DEFAULT_CFG.read_text())
    cfg.update(overrides)
    return types.SimpleNamespace(**cfg)


def two_tone(h=20, w=40) -> np.ndarray:
    """BGR: left half red, right half blue, so a rotation is visible."""
    img = np.zeros((h, w, 3), np.uint8)
    img[:, : w // 2] = (0, 0, 255)
    img[:, w // 2 :] = (255, 0, 0)
    return img


def save_with_orientation(path: Path, orientation: int, **kwargs) -> None:
    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(two_tone()[..., ::-1]).save(path, exif=exif, **kwargs)


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_tiff_with_exif_orientation_verifier_and_loader_agree(orientation, tmp_path, log_records):
    pytest.importorskip("PIL")
    images, labels = tmp_path / "images" / "train", tmp_path / "labels" / "train"
    images.mkdir(parents=True)
    labels.mkdir(parents=True)
    cv2.imwrite(str(images / "plain.jpg"), two_tone())
    save_with_orientation(images / "rot.tif", orientation)
    save_with_orientation(images / "rot_deflate.tiff", orientation, compression="tiff_deflate")
    save_with_orientation(images / "rot.jpg", orientation, quality=100)  # the reference: OpenCV applies EXIF orientation to JPEGs
    for name in ("plain", "rot", "rot_deflate"):
        (labels / f"{name}.txt").write_text("0 0.25 0.5 0.5 1.0\n")
    ds = YOLODataset(str(images), 64, ["a"], False, hyp(), prefix="train: ")
    assert ds.report["corrupt"] == 0 and len(ds) == 4
    reference = cv2.imread(str(images / "rot.jpg"))
    for i, record in enumerate(ds.labels):
        img = ds._read(i)
        assert img is not None and img.shape[:2] == tuple(record["shape"]), record["im_file"]
        if Path(record["im_file"]).suffix in (".tif", ".tiff"):
            assert img.shape == reference.shape
            assert np.abs(img.astype(int) - reference.astype(int)).mean() < 8  # same orientation as OpenCV gives the JPEG
    batches = list(build_dataloader(ds, 2, 0, shuffle=False))  # the loader reads every image
    assert sum(len(b["im_files"]) for b in batches) == 4


def test_verification_uses_the_loaders_decoder(tmp_path, monkeypatch):
    """An image the loader's decoder cannot read is reported by verification, not met later by the loader."""
    images = tmp_path / "images" / "train"
    images.mkdir(parents=True)
    cv2.imwrite(str(images / "a.png"), two_tone())
    cv2.imwrite(str(images / "b.png"), two_tone())
    real = cv2.imread
    monkeypatch.setattr(cv2, "imread", lambda f, *a: None if str(f).endswith("b.png") else real(f, *a))
    monkeypatch.setattr(verify, "_pil_decode", lambda f: None, raising=False)
    ds = YOLODataset(str(images), 64, ["a"], False, hyp(), prefix="train: ")
    assert ds.report["corrupt"] == 1 and [Path(f).name for f in ds.im_files] == ["a.png"]


@pytest.fixture
def log_records(caplog):
    import logging

    caplog.set_level(logging.INFO, logger="yolo_cb")
    return caplog


# --- 3. labels with a UTF-8 byte order mark ---------------------------------------------------------
def test_label_with_utf8_bom_is_read(tmp_path):
    lb = tmp_path / "a.txt"
    lb.write_bytes("\ufeff0 0.5 0.5 0.2 0.2\n1 0.3 0.3 0.1 0.1\r\n".encode("utf-8"))
    out = verify.verify_label(str(lb), nc=2)
    assert out["corrupt"] is None and out["labels"].shape == (2, 5) and out["labels"][0, 0] == 0
    images = tmp_path / "images"
    images.mkdir()
    cv2.imwrite(str(images / "a.jpg"), two_tone())
    (tmp_path / "labels").mkdir()
    (tmp_path / "labels" / "a.txt").write_bytes(lb.read_bytes())
    ds = YOLODataset(str(images), 64, ["a", "b"], False, hyp(), prefix="train: ")
    assert ds.report["corrupt"] == 0 and len(ds.labels[0]["cls"]) == 2


# --- 4. written files follow the umask --------------------------------------------------------------
@pytest.fixture
def umask():
    old = os.umask(0o022)
    os.umask(old)

    def set_mask(mask: int) -> None:
        os.umask(mask)

    yield set_mask
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077])
def test_atomic_writes_follow_the_umask(mask, tmp_path, umask):
    umask(mask)
    atomic_write_bytes(tmp_path / "a.bin", b"x")
    atomic_write_text(tmp_path / "sub" / "b.txt", "y")
    assert mode(tmp_path / "a.bin") == mode(tmp_path / "sub" / "b.txt") == 0o666 & ~mask
    images = tmp_path / "ds" / "images"
    images.mkdir(parents=True)
    cv2.imwrite(str(images / "a.jpg"), two_tone())
    (tmp_path / "ds" / "labels").mkdir()
    (tmp_path / "ds" / "labels" / "a.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    ds = YOLODataset(str(images), 64, ["a"], False, hyp(), prefix="train: ")
    cache = Path(ds.report["cache_file"])
    assert cache.is_file() and mode(cache) == 0o666 & ~mask


def test_atomic_write_keeps_the_mode_of_the_file_it_replaces(tmp_path, umask):
    umask(0o022)
    path = tmp_path / "private.yaml"
    path.write_text("old")
    path.chmod(0o640)
    atomic_write_text(path, "new")
    assert path.read_text() == "new" and mode(path) == 0o640


def test_training_outputs_follow_the_umask(tiny, tmp_path, umask):
    from yolo_cb import YOLO

    umask(0o022)
    model = YOLO(tiny["model"])
    model.train(**tiny)
    run = tmp_path / "runs" / "exp"
    for name in ("args.yaml", "results.csv", "weights/last.pt", "weights/best.pt"):
        assert (run / name).is_file() and mode(run / name) == 0o644, (name, oct(mode(run / name)))
