"""check_data: bundled names, path resolution, download from a loopback server, shapes generation, errors."""

from __future__ import annotations

import functools
import hashlib
import http.server
import threading
import zipfile
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml
from shared_data import SHARED

from yolo_cb.data.download import safe_extract
from yolo_cb.data.resolve import DatasetConfigError, check_data
from yolo_cb.data.synthetic import generate_shapes
from yolo_cb.utils.paths import DATASETS_CFG_DIR


def write_yaml(path: Path, cfg: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def make_split(root: Path, split: str, n: int = 1):
    (root / "images" / split).mkdir(parents=True, exist_ok=True)
    (root / "labels" / split).mkdir(parents=True, exist_ok=True)
    for i in range(n):
        cv2.imwrite(str(root / "images" / split / f"{i}.jpg"), np.full((32, 48, 3), 100, np.uint8))
        (root / "labels" / split / f"{i}.txt").write_text("0 0.5 0.5 0.2 0.2\n")


@pytest.fixture
def server(tmp_path):
    """An http.server on 127.0.0.1 (free port) serving tmp_path/www."""
    www = tmp_path / "www"
    www.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(www))
    handler.log_message = lambda *a: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield www, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_bundled_yamls_are_valid():
    coco = yaml.safe_load((DATASETS_CFG_DIR / "coco8.yaml").read_text())
    assert coco["path"] == "coco8" and coco["train"] == "images/train" and coco["val"] == "images/val"
    assert len(coco["names"]) == 80 and coco["names"][0] == "person" and coco["names"][79] == "toothbrush"
    assert len(coco["category_ids"]) == 80 and coco["download"].endswith("coco8.zip")
    shapes = yaml.safe_load((DATASETS_CFG_DIR / "shapes.yaml").read_text())
    assert list(shapes["names"].values()) == ["circle", "rectangle", "triangle", "cross"]
    assert shapes["generate"]["kind"] == "shapes" and shapes["generate"]["seed"] == 0


def test_relative_path_found_next_to_yaml_then_under_datasets_dir(tmp_path, monkeypatch):
    make_split(tmp_path / "beside" / "ds", "train")
    make_split(tmp_path / "beside" / "ds", "val")
    cfg = {"path": "ds", "train": "images/train", "val": "images/val", "names": ["a", "b"]}
    out = check_data(write_yaml(tmp_path / "beside" / "data.yaml", cfg), datasets_dir=str(tmp_path / "unused"))
    assert out["path"] == str((tmp_path / "beside" / "ds").resolve()) and out["nc"] == 2 and out["names"] == {0: "a", 1: "b"}
    assert out["train"] == str((tmp_path / "beside" / "ds" / "images" / "train").resolve()) and out["test"] is None
    assert "category_ids" not in out

    make_split(tmp_path / "store" / "ds", "train")
    make_split(tmp_path / "store" / "ds", "val")
    other = write_yaml(tmp_path / "elsewhere" / "data.yaml", dict(cfg, names={0: "a", 1: "b"}, test=["images/val"]))
    monkeypatch.setenv("YOLO_CB_DATASETS", str(tmp_path / "store"))
    out = check_data(str(other))  # datasets_dir from the environment
    assert out["path"] == str((tmp_path / "store" / "ds").resolve()) and len(out["test"]) == 1

    no_path = write_yaml(tmp_path / "store" / "ds" / "data.yaml", {k: cfg[k] for k in ("train", "val", "names")})
    assert check_data(no_path)["path"] == str((tmp_path / "store" / "ds").resolve())


def test_bundled_coco8_resolves_against_shared_copy():
    shared = SHARED / "datasets"
    if not (shared / "coco8").is_dir():
        pytest.skip("shared coco8 not available")
    out = check_data("coco8.yaml", datasets_dir=str(shared))  # finds it: no download, nothing written
    assert out["nc"] == 80 and Path(out["val"]).is_dir() and out["category_ids"][:3] == [1, 2, 3]
    assert Path(out["yaml_file"]) == (DATASETS_CFG_DIR / "coco8.yaml").resolve()


def test_yaml_errors_name_the_file_and_key(tmp_path):
    base = {"train": "images/train", "val": "images/val", "names": ["a"]}
    for missing in ("val", "names", "train"):
        path = write_yaml(tmp_path / f"no_{missing}.yaml", {k: v for k, v in base.items() if k != missing})
        with pytest.raises(DatasetConfigError, match=rf"no_{missing}\.yaml.*'{missing}'"):
            check_data(path)
    with pytest.raises(DatasetConfigError, match="'nc' is 3"):
        check_data(write_yaml(tmp_path / "nc.yaml", dict(base, nc=3)))
    with pytest.raises(DatasetConfigError, match="without gaps"):
        check_data(write_yaml(tmp_path / "gap.yaml", dict(base, names={0: "a", 2: "c"})))
    with pytest.raises(FileNotFoundError, match="not found"):
        check_data(str(tmp_path / "absent.yaml"))


def test_not_found_lists_every_place_and_the_fix(tmp_path):
    path = write_yaml(tmp_path / "cfgs" / "data.yaml", {"path": "mine", "train": "images/train", "val": "images/val", "names": ["a"]})
    with pytest.raises(FileNotFoundError) as err:
        check_data(path, datasets_dir=str(tmp_path / "store"))
    msg = str(err.value)
    assert str(tmp_path / "cfgs" / "mine") in msg and str(tmp_path / "store" / "mine") in msg
    assert "datasets_dir" in msg and "path:" in msg and "data.yaml" in msg


def test_download_from_loopback_server(tmp_path, server):
    www, url = server
    src = tmp_path / "src"
    make_split(src / "mini", "train", 2)
    make_split(src / "mini", "val", 1)
    with zipfile.ZipFile(www / "mini.zip", "w") as zf:
        for f in sorted(src.rglob("*")):
            zf.write(f, f.relative_to(src))
    cfg = {"path": "mini", "train": "images/train", "val": "images/val", "names": ["a"], "download": f"{url}/mini.zip"}
    yaml_path = write_yaml(tmp_path / "cfgs" / "mini.yaml", cfg)
    store = tmp_path / "store"
    out = check_data(yaml_path, datasets_dir=str(store))
    assert out["path"] == str((store / "mini").resolve())
    assert len(list((store / "mini" / "images" / "train").glob("*.jpg"))) == 2
    assert not (store / "mini.zip").exists()  # archive removed after extraction

    bad = write_yaml(tmp_path / "cfgs" / "bad.yaml", dict(cfg, path="gone", download=f"{url}/gone.zip"))
    with pytest.raises(FileNotFoundError, match="download from .*gone.zip failed"):
        check_data(bad, datasets_dir=str(store))


def test_unsafe_archives_are_refused(tmp_path):
    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("../escaped.txt", "x")
    with pytest.raises(ValueError, match="unsafe"):
        safe_extract(archive, tmp_path / "out")
    assert not (tmp_path / "escaped.txt").exists()


def test_shapes_generated_when_missing(tmp_path):
    cfg = yaml.safe_load((DATASETS_CFG_DIR / "shapes.yaml").read_text())
    cfg["generate"].update(train=4, val=2, min_size=64, max_size=96)
    path = write_yaml(tmp_path / "cfgs" / "shapes.yaml", cfg)
    store = tmp_path / "store"
    out = check_data(path, datasets_dir=str(store))
    root = store / "shapes"
    assert out["path"] == str(root.resolve()) and out["nc"] == 4
    assert len(list((root / "images" / "train").glob("*.jpg"))) == 4 and len(list((root / "labels" / "val").glob("*.txt"))) == 2
    stamp = (root / "images" / "train" / "train_00000.jpg").stat().st_mtime_ns
    check_data(path, datasets_dir=str(store))  # found now: not generated again
    assert (root / "images" / "train" / "train_00000.jpg").stat().st_mtime_ns == stamp
    assert not [p for p in store.iterdir() if p.name.startswith(".")]  # no temporary folder left


def digest(root: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(f.relative_to(root).as_posix().encode() + f.read_bytes())
    return h.hexdigest()


def test_generate_shapes_is_deterministic_with_tight_labels(tmp_path):
    a = generate_shapes(tmp_path / "a", 3, 1, seed=5, min_size=64, max_size=128).parent
    b = generate_shapes(tmp_path / "b", 3, 1, seed=5, min_size=64, max_size=128).parent
    c = generate_shapes(tmp_path / "c", 3, 1, seed=6, min_size=64, max_size=128).parent
    assert digest(a) == digest(b) != digest(c)
    meta = yaml.safe_load((a / "data.yaml").read_text())
    assert meta["train"] == "images/train" and meta["names"] == {0: "circle", 1: "rectangle", 2: "triangle", 3: "cross"}
    rows = [line.split() for f in (a / "labels").rglob("*.txt") for line in f.read_text().splitlines()]
    assert rows and all(len(r) == 5 and 0 <= int(r[0]) < 4 for r in rows)
    assert all(0 <= float(v) <= 1 for r in rows for v in r[1:])
