"""Real data as a switching Ultralytics user brings it (issue 61, section 1): the layouts the big exporters write
convert and train with their true boxes, and a path named in a file still never reads outside the dataset root.

Each layout is built in tmp_path from the real images of ../shared/datasets/coco8, with their true boxes turned into
that format's annotations: COCO 2017 (annotations/ beside train2017/), Ultralytics' coco/ (images/train2017/),
Roboflow's COCO export (<split>/_annotations.coco.json beside the images), a Label Studio export whose image names
keep the upload prefix. The labels we write are compared with the boxes put in (normalised, to TOL). Also: polygon
rows in a YOLO label file are boxed, and a data YAML with nc and no names names the classes."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import pytest

from yolo_cb.data.convert import convert
from yolo_cb.data.resolve import DatasetConfigError, check_data
from yolo_cb.data.verify import img2label_path, list_image_files, load_labels
from yolo_cb.errors import DataError

TOL = 1e-4  # normalised: the labels are written with 6 decimals, the boxes went through pixels or percent
NC = 80  # coco8's classes: category id c + 1 is class c
TRAIN_STEMS = ["000000000009", "000000000025", "000000000030", "000000000034"]


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yolo_cb", *args], capture_output=True, text=True, cwd=cwd, timeout=300,
                          stdin=subprocess.DEVNULL)


def truth(coco8_dir: Path, split: str) -> dict[str, tuple[Path, list[list[float]]]]:
    """{stem: (image, rows cls cx cy w h)} of coco8's split: the boxes every layout is made from and checked against."""
    out = {}
    for image in sorted((coco8_dir / "images" / split).glob("*.jpg")):
        label = coco8_dir / "labels" / split / f"{image.stem}.txt"
        out[image.stem] = (image, [[float(v) for v in line.split()] for line in label.read_text().splitlines() if line.strip()])
    return out


def size(image: Path) -> tuple[int, int]:
    h, w = cv2.imread(str(image)).shape[:2]
    return w, h


def pixel_box(row: list[float], w: int, h: int) -> list[float]:
    """COCO's [x, y, width, height] in pixels of a YOLO row."""
    _, cx, cy, bw, bh = row
    return [(cx - bw / 2) * w, (cy - bh / 2) * h, bw * w, bh * h]


def coco_doc(items: dict[str, tuple[Path, list]], file_name=lambda image: image.name) -> dict:
    """A COCO instances document of `items`, each image's file_name given by `file_name`."""
    images, anns = [], []
    for k, (image, rows) in enumerate(items.values()):
        w, h = size(image)
        images.append({"id": k + 1, "file_name": file_name(image), "width": w, "height": h})
        anns += [{"id": len(anns) + 1, "image_id": k + 1, "category_id": int(row[0]) + 1, "bbox": pixel_box(row, w, h),
                  "area": 1.0, "iscrowd": 0} for row in rows]
    return {"images": images, "annotations": anns, "categories": [{"id": c + 1, "name": f"cls{c}"} for c in range(NC)]}


def write_json(path: Path, doc) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def copy_images(items: dict, folder: Path, name=lambda image: image.name) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for image, _ in items.values():
        shutil.copy(image, folder / name(image))


def coco2017(root: Path, coco8_dir: Path, images_under: str = "") -> Path:
    """COCO 2017's layout at `root`: annotations/instances_{train,val}2017.json beside <images_under>{train,val}2017/
    (images_under "images/": Ultralytics' coco/)."""
    for split in ("train", "val"):
        items = truth(coco8_dir, split)
        copy_images(items, root / f"{images_under}{split}2017")
        write_json(root / "annotations" / f"instances_{split}2017.json", coco_doc(items))
    return root


def read_rows(labels_dir: Path) -> dict[str, list[list[float]]]:
    """{stem: rows} of the YOLO label files written in `labels_dir`."""
    return {f.stem: [[float(v) for v in line.split()] for line in f.read_text().splitlines() if line.strip()]
            for f in labels_dir.glob("*.txt")}


def assert_rows(got: dict[str, list], want: dict[str, tuple[Path, list]]) -> None:
    """The same images (by stem), each with the same boxes to TOL."""
    assert sorted(got) == sorted(want)
    for stem, (_, rows) in want.items():
        assert len(got[stem]) == len(rows), stem
        for a, b in zip(sorted(got[stem]), sorted(rows), strict=True):
            assert a[0] == b[0] and max(abs(x - y) for x, y in zip(a[1:], b[1:], strict=True)) <= TOL, (stem, a, b)


def split_rows(images: str) -> dict[str, list]:
    """{stem: rows} of a resolved split as training reads it: its image list and their label files."""
    files = list_image_files(images)
    return {Path(f).stem: [[float(v) for v in line.split()] for line in Path(img2label_path(f)).read_text().splitlines()]
            for f in files}


def test_coco2017_layout_converts_from_the_json_and_from_its_folder(tmp_path, coco8_dir, caplog):
    root = coco2017(tmp_path / "coco2017", coco8_dir)
    write_json(root / "annotations" / "captions_train2017.json", {"images": [], "annotations": []})  # no categories
    proc = cli("convert", f"source={root / 'annotations' / 'instances_train2017.json'}", "format=coco", "out=one", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert_rows(read_rows(tmp_path / "one" / "labels" / "train2017"), truth(coco8_dir, "train"))
    caplog.set_level(logging.INFO, logger="yolo_cb")
    convert(root, "coco", tmp_path / "all")  # the folder: its instances_*.json, one split each; captions left out, said
    assert "left out" in caplog.text and "captions_train2017.json" in caplog.text
    for split in ("train", "val"):
        assert_rows(read_rows(tmp_path / "all" / "labels" / f"{split}2017"), truth(coco8_dir, split))
    assert "val: images/val2017" in (tmp_path / "all" / "data.yaml").read_text()


def test_coco_images_found_nowhere_are_one_line_naming_the_folders_exit_2(tmp_path, coco8_dir):
    root = coco2017(tmp_path / "coco2017", coco8_dir)
    shutil.rmtree(root / "train2017")
    proc = cli("convert", f"source={root / 'annotations' / 'instances_train2017.json'}", "format=coco", "out=none", cwd=tmp_path)
    assert proc.returncode == 2 and not (tmp_path / "none").exists(), proc.stderr
    error = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(error) == 1 and "0 images" in error[0], proc.stderr
    for folder in (root / "annotations", root / "train2017", root / "images" / "train2017", root / "images"):
        assert str(folder) in error[0], (folder, error[0])


def test_coco2017_layout_trains_from_a_data_yaml_naming_the_jsons(tmp_path, coco8_dir):
    from yolo_cb import YOLO

    root = coco2017(tmp_path / "coco2017", coco8_dir)
    data = tmp_path / "coco.yaml"
    data.write_text(f"path: {root}\ntrain: annotations/instances_train2017.json\nval: annotations/instances_val2017.json\n")
    resolved = check_data(data, datasets_dir=str(tmp_path / "dd"))
    assert resolved["names"] == {c: f"cls{c}" for c in range(NC)}  # the categories
    for split in ("train", "val"):
        assert_rows(split_rows(resolved[split]), truth(coco8_dir, split))
    model = YOLO("yolox-nano.yaml")
    model.train(data=str(data), datasets_dir=str(tmp_path / "dd"), imgsz=64, batch=4, epochs=1, workers=0, mosaic=0.0,
                plots=False, mlflow=False, tensorboard=False, onnx_check=False, project=str(tmp_path / "runs"), name="exp")
    assert (tmp_path / "runs" / "exp" / "weights" / "last.pt").is_file()
    assert len(model.trainer.train_loader.dataset) == len(TRAIN_STEMS)


def test_ultralytics_coco_layout_from_a_data_yaml(tmp_path, coco8_dir):
    root = coco2017(tmp_path / "coco", coco8_dir, images_under="images/")
    data = tmp_path / "coco.yaml"
    data.write_text(f"path: {root}\ntrain: annotations/instances_train2017.json\nval: annotations/instances_val2017.json\n")
    resolved = check_data(data, datasets_dir=str(tmp_path / "dd"))
    for split in ("train", "val"):
        assert_rows(split_rows(resolved[split]), truth(coco8_dir, split))


def test_roboflow_coco_export_converts_each_split_folder(tmp_path, coco8_dir):
    export = tmp_path / "roboflow"
    for split, ours in (("train", "train"), ("valid", "val")):
        items = truth(coco8_dir, ours)
        copy_images(items, export / split, lambda image: f"{image.stem}_jpg.rf.0a1b2c.jpg")
        write_json(export / split / "_annotations.coco.json", coco_doc(items, lambda image: f"{image.stem}_jpg.rf.0a1b2c.jpg"))
    convert(export, "coco", tmp_path / "yolo")
    for split, ours in (("train", "train"), ("valid", "val")):
        got = {stem.removesuffix("_jpg.rf.0a1b2c"): rows for stem, rows in read_rows(tmp_path / "yolo" / "labels" / split).items()}
        assert_rows(got, truth(coco8_dir, ours))
    text = (tmp_path / "yolo" / "data.yaml").read_text()
    assert "train: images/train" in text and "val: images/valid" in text


def label_studio_task(k: int, upload_name: str, image: Path, rows: list) -> dict:
    w, h = size(image)
    results = [{"type": "rectanglelabels", "original_width": w, "original_height": h, "value": {
        "x": (r[1] - r[3] / 2) * 100, "y": (r[2] - r[4] / 2) * 100, "width": r[3] * 100, "height": r[4] * 100,
        "rotation": 0, "rectanglelabels": [f"cls{int(r[0])}"]}} for r in rows]
    return {"id": k, "data": {"image": f"/data/upload/1/{upload_name}"}, "annotations": [{"result": results}]}


def test_label_studio_upload_prefixes_match_the_original_files(tmp_path, coco8_dir, caplog):
    items = truth(coco8_dir, "train")
    prefixes = ["3f2a9c1e", "0b7d44aa", "c0ffee12", "9e8d7c6b"]
    tasks = [label_studio_task(k, f"{p}-{image.name}", image, rows) for k, (p, (image, rows)) in enumerate(zip(prefixes, items.values(), strict=True))]
    tasks.append(label_studio_task(9, "deadbeef-gone.jpg", items[TRAIN_STEMS[0]][0], []))  # neither name exists
    export = write_json(tmp_path / "ls" / "project-1.json", tasks)
    copy_images(items, tmp_path / "ls")  # the user's own files, without the prefix
    caplog.set_level(logging.INFO, logger="yolo_cb")
    convert(export, "labelstudio", tmp_path / "yolo", names=",".join(f"cls{c}" for c in range(NC)))
    assert_rows(read_rows(tmp_path / "yolo" / "labels" / "train"), items)  # named as the user's files
    assert "1 images whose file is missing skipped" in caplog.text and "'deadbeef-gone.jpg' (or 'gone.jpg'" in caplog.text
    write_json(tmp_path / "none" / "project-2.json", tasks)  # no image beside it: 0 images, one line
    with pytest.raises(DataError, match="0 images.*looked for '3f2a9c1e-000000000009.jpg'"):
        convert(tmp_path / "none" / "project-2.json", "labelstudio", tmp_path / "yolo2")
    assert not (tmp_path / "yolo2").exists()


def yolo_folder(root: Path, coco8_dir: Path, labels: dict[str, str]) -> Path:
    """root/images/train (links to coco8's train images) with the label text given per stem; root/data.yaml."""
    for stem, text in labels.items():
        (root / "images" / "train").mkdir(parents=True, exist_ok=True)
        (root / "labels" / "train").mkdir(parents=True, exist_ok=True)
        os.symlink(coco8_dir / "images" / "train" / f"{stem}.jpg", root / "images" / "train" / f"{stem}.jpg")
        (root / "labels" / "train" / f"{stem}.txt").write_text(text)
    return root


def test_polygon_rows_are_trained_as_their_bounding_box(tmp_path, coco8_dir, caplog):
    polygon = [0.2, 0.3, 0.6, 0.25, 0.7, 0.8, 0.25, 0.9]  # 4 points: x from 0.2 to 0.7, y from 0.25 to 0.9
    rows = {TRAIN_STEMS[0]: f"3 {' '.join(map(str, polygon))}\n1 0.5 0.5 0.2 0.2\n",  # a polygon row, then a box row
            TRAIN_STEMS[1]: "2 0.1 0.1 0.3 0.1 0.2 0.4\n",  # a triangle: 7 columns
            TRAIN_STEMS[2]: "0 0.1 0.1 0.3 0.1 0.2 0.4 0.5\n"}  # 8 columns: no box, no polygon: the image is skipped
    root = yolo_folder(tmp_path / "seg", coco8_dir, rows)
    data = root / "data.yaml"
    data.write_text("train: images/train\nval: images/train\nnames: [a, b, c, d]\n")
    resolved = check_data(data, datasets_dir=str(tmp_path / "dd"))
    caplog.set_level(logging.INFO, logger="yolo_cb")
    records, report = load_labels(list_image_files(resolved["train"]), resolved["nc"], "train: ", cache=False)
    boxes = {Path(r["im_file"]).stem: [[int(c), *b] for c, b in zip(r["cls"], r["bboxes"].tolist(), strict=True)] for r in records}
    want = {TRAIN_STEMS[0]: [[3, 0.45, 0.575, 0.5, 0.65], [1, 0.5, 0.5, 0.2, 0.2]], TRAIN_STEMS[1]: [[2, 0.2, 0.25, 0.2, 0.3]]}
    assert_rows(boxes, {stem: (None, r) for stem, r in want.items()})
    assert report["polygons"] == 2 and report["corrupt"] == 1
    assert caplog.text.count("2 polygon rows boxed") == 1, caplog.text  # once for the split
    assert "line 1 has 8 columns" in caplog.text
    from yolo_cb.data.check import check_dataset

    _, _, found = check_dataset(str(data), str(tmp_path / "dd"))  # yolo-cb data check says it too
    assert [w for w in found if w.startswith("train: 2 polygon rows boxed")], found


def test_nc_without_names_names_the_classes(tmp_path, coco8_dir, caplog):
    root = yolo_folder(tmp_path / "ds", coco8_dir, {TRAIN_STEMS[0]: "3 0.5 0.5 0.2 0.2\n"})
    data = root / "data.yaml"
    data.write_text("train: images/train\nval: images/train\nnc: 4\n")
    caplog.set_level(logging.INFO, logger="yolo_cb")
    resolved = check_data(data, datasets_dir=str(tmp_path / "dd"))
    assert resolved["names"] == {0: "class_0", 1: "class_1", 2: "class_2", 3: "class_3"} and resolved["nc"] == 4
    said = [r.getMessage() for r in caplog.records if "class_0" in r.getMessage()]
    assert len(said) == 1 and "nc: 4" in said[0], caplog.text
    for bad in ("0", "abc", "2.5"):
        data.write_text(f"train: images/train\nval: images/train\nnc: {bad}\n")
        with pytest.raises(DatasetConfigError, match=f"{data}: 'nc' is .*; it must be the number of classes"):
            check_data(data, datasets_dir=str(tmp_path / "dd"))


def test_a_dotdot_path_in_the_coco2017_layout_is_still_skipped(tmp_path, coco8_dir, caplog):
    secret = tmp_path / "secret" / "photo.jpg"
    secret.parent.mkdir()
    shutil.copy(coco8_dir / "images" / "val" / "000000000036.jpg", secret)
    root = coco2017(tmp_path / "coco2017", coco8_dir)
    doc = json.loads((root / "annotations" / "instances_train2017.json").read_text())
    for k, name in enumerate(["../secret/photo.jpg", "../../secret/photo.jpg", str(secret)]):
        doc["images"].append({"id": 100 + k, "file_name": name, "width": 481, "height": 640})
        doc["annotations"].append({"id": 100 + k, "image_id": 100 + k, "category_id": 1, "bbox": [1, 1, 50, 50], "iscrowd": 0})
    write_json(root / "annotations" / "instances_train2017.json", doc)
    caplog.set_level(logging.INFO, logger="yolo_cb")
    convert(root / "annotations" / "instances_train2017.json", "coco", tmp_path / "yolo")
    assert_rows(read_rows(tmp_path / "yolo" / "labels" / "train2017"), truth(coco8_dir, "train"))  # the secret is not there
    assert "3 images whose path leaves the dataset root skipped" in caplog.text
    for path in (tmp_path / "yolo").rglob("*"):
        assert Path(os.path.realpath(path)) != secret.resolve(), path
    data = tmp_path / "coco.yaml"  # the same from a data YAML whose root is the COCO folder
    data.write_text(f"path: {root}\ntrain: annotations/instances_train2017.json\nval: annotations/instances_val2017.json\n")
    resolved = check_data(data, datasets_dir=str(tmp_path / "dd"))
    assert sorted(split_rows(resolved["train"])) == TRAIN_STEMS
    data.write_text("train: coco2017/annotations/instances_train2017.json\nval: coco2017/annotations/instances_val2017.json\n")
    resolved = check_data(data, datasets_dir=str(tmp_path / "dd2"))  # no path: the YAML's folder, which holds the
    assert sorted(split_rows(resolved["train"])) == TRAIN_STEMS  # secret, is not the root: the COCO folder is
