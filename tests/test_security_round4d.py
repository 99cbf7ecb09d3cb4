"""Security issue #45, round 4 (fourth part): a data YAML does not decide where caches are written. The label cache and
`cache=disk` .npy files of data outside datasets_dir go to yolo-cb's own cache folder ($XDG_CACHE_HOME/yolo_cb/data),
never into the data's folder (a `path:` linked to `/`, a folder nobody meant yolo-cb to write into)."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml
from test_data_safety import snapshot

from yolo_cb.data.loading.loader import build_yolo_dataset
from yolo_cb.data.resolve import check_data
from yolo_cb.settings.config import get_config


def small_dataset(folder: Path, shapes_dir: Path) -> None:
    for split in ("train", "val"):
        (folder / "images" / split).mkdir(parents=True)
        (folder / "labels" / split).mkdir(parents=True)
        for image in sorted((shapes_dir / "images" / split).glob("*.jpg"))[:2]:
            shutil.copy(image, folder / "images" / split / image.name)
            label = shapes_dir / "labels" / split / f"{image.stem}.txt"
            if label.is_file():
                shutil.copy(label, folder / "labels" / split / label.name)


def build(yaml_file: Path, store: Path) -> None:
    args = get_config({"cache": "disk", "datasets_dir": str(store), "imgsz": 64, "workers": 0})
    data = check_data(yaml_file, str(store))
    dataset = build_yolo_dataset(args, data["train"], mode="train", names=data["names"])
    dataset.cache_images()


def test_caches_of_data_outside_datasets_dir_go_to_our_own_cache_folder(tmp_path, shapes_dir, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    real = tmp_path / "elsewhere" / "data"
    small_dataset(real, shapes_dir)
    root = tmp_path / "root_link"
    root.symlink_to("/")  # as `path: /` would: the split paths are relative to the root of the filesystem
    yaml_file = tmp_path / "d.yaml"
    relative = str(real.relative_to("/"))
    yaml_file.write_text(yaml.safe_dump({"path": str(root), "train": f"{relative}/images/train", "val": f"{relative}/images/val",
                                         "names": ["circle", "rectangle", "triangle", "cross"]}))
    before = snapshot(tmp_path / "elsewhere")
    build(yaml_file, tmp_path / "store")
    assert snapshot(tmp_path / "elsewhere") == before  # no label cache, no .npy written into the data's folders
    cached = sorted(p.name for p in (tmp_path / "cache" / "yolo_cb" / "data").rglob("*") if p.is_file())
    assert "train.yolo_cb.cache" in cached and len([n for n in cached if n.endswith(".npy")]) == 2, cached


def test_caches_of_data_inside_datasets_dir_stay_beside_it(tmp_path, shapes_dir, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    store = tmp_path / "store"
    small_dataset(store / "ds", shapes_dir)
    yaml_file = tmp_path / "d.yaml"
    yaml_file.write_text(yaml.safe_dump({"path": "ds", "train": "images/train", "val": "images/val", "names": ["a", "b", "c", "d"]}))
    build(yaml_file, store)
    assert (store / "ds" / "labels" / "train.yolo_cb.cache").is_file() and len(list((store / "ds" / "images" / "train").glob("*.npy"))) == 2
    assert not (tmp_path / "cache").exists()
