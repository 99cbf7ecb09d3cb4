"""COCO JSON and Pascal VOC sets made in a test's tmp_path from ../shared/datasets/shapes images and labels, each with the
awkward cases planted (tests/test_data_formats.py): category ids with gaps, iscrowd, a background image, boxes
partly and wholly outside, a box without area, two files that would share a label file, a tiny box, an image in two
splits, a class only in val; VOC: a difficult object, an id listed twice.

`expected` maps each image's stem in the YOLO folder to its rows (cls cx cy w h), computed here independently."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import cv2

NAMES = ["circle", "rectangle", "triangle", "cross", "star"]  # star: boxes only in val
CAT_IDS = [1, 3, 7, 10, 12]  # gaps: mapped to 0..4 in id order


def shapes_items(shapes_dir: Path, split: str, n: int) -> list[tuple[Path, list[list[float]]]]:
    out = []
    for img in sorted((shapes_dir / "images" / split).glob("*.jpg"))[:n]:
        label = shapes_dir / "labels" / split / f"{img.stem}.txt"
        rows = [[float(v) for v in line.split()] for line in label.read_text().splitlines() if line.strip()] if label.exists() else []
        out.append((img, rows))
    return out


def _pixels(row, w, h):
    c, cx, cy, bw, bh = row
    return int(c), [(cx - bw / 2) * w, (cy - bh / 2) * h, bw * w, bh * h]


def _norm(c, x1, y1, x2, y2, w, h):
    return [c, (x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w, (y2 - y1) / h]


def make_coco(root: Path, shapes_dir: Path, n_train: int = 12, n_val: int = 6) -> dict:
    """root/coco/instances_train.json with its images in root/coco/images/ (file_name relative to images/ beside the
    JSON), root/coco/val/val.json with its images beside it; returns paths, expected rows by image stem, and plants."""
    folder = root / "coco"
    expected: dict[str, dict[str, list]] = {"train": {}, "val": {}}
    docs = {}
    for split, n in (("train", n_train), ("val", n_val)):
        images, anns = [], []
        items = shapes_items(shapes_dir, split, n)
        if split == "val":  # the same image as train's first: a duplicate across splits
            items.append(shapes_items(shapes_dir, "train", 1)[0])
        image_dir = folder / "images" if split == "train" else folder / "val"
        image_dir.mkdir(parents=True, exist_ok=True)
        for k, (src, rows) in enumerate(items):
            name = f"{split}_{k:03d}.jpg"
            shutil.copy(src, image_dir / name)
            h, w = cv2.imread(str(src)).shape[:2]
            images.append({"id": 100 + k, "file_name": name, "width": w, "height": h})
            expected[split][name[:-4]] = []
            if split == "train" and k == 1:
                continue  # an image without annotations: a background
            for row in rows:
                c, box = _pixels(row, w, h)
                anns.append({"id": len(anns) + 1, "image_id": 100 + k, "category_id": CAT_IDS[c], "bbox": box, "iscrowd": 0, "area": box[2] * box[3]})
                expected[split][name[:-4]].append(row)
        docs[split] = (images, anns)
    _plant_train(folder, docs["train"], expected["train"])
    _plant_val(docs["val"], expected["val"])
    categories = [{"id": cid, "name": name, "supercategory": "shape"} for cid, name in zip(CAT_IDS, NAMES, strict=True)]
    paths = {"train": folder / "instances_train.json", "val": folder / "val" / "val.json"}
    for split, (images, anns) in docs.items():
        paths[split].write_text(json.dumps({"images": images, "annotations": anns, "categories": categories[::-1]}))
    return {"folder": folder, **paths, "expected": expected}


def _plant_train(folder: Path, doc, expected) -> None:
    images, anns = doc
    first = images[0]
    w, h = first["width"], first["height"]
    name = first["file_name"][:-4]

    def add(image_id, cat, box, crowd=0):
        anns.append({"id": len(anns) + 1, "image_id": image_id, "category_id": cat, "bbox": box, "iscrowd": crowd, "area": 1.0})

    add(first["id"], 1, [10, 10, 40, 40], crowd=1)  # iscrowd: skipped
    add(first["id"], 3, [w - 10, 5, 30, 20])  # partly outside: clipped to 10 px wide
    expected[name].append(_norm(1, w - 10, 5, w, 25, w, h))
    add(first["id"], 3, [w + 5, 5, 10, 10])  # wholly outside: dropped
    add(first["id"], 7, [20, 20, 0, 5])  # no area: dropped
    add(first["id"], 10, [30, 30, 1, 1])  # tiny (1 x 1 px): kept, warned about by data check
    expected[name].append(_norm(3, 30, 30, 31, 31, w, h))
    # train_002.jpg and train_002.png: one label file between them, so the png is renamed train_002_2.png
    src = folder / "images" / images[2]["file_name"]
    png = src.with_suffix(".png")
    cv2.imwrite(str(png), cv2.imread(str(src)))
    images.append({"id": 999, "file_name": images[2]["file_name"].replace(".jpg", ".png"), "width": images[2]["width"], "height": images[2]["height"]})
    add(999, 10, [5, 5, 20, 20])
    expected["train_002_2"] = [_norm(3, 5, 5, 25, 25, images[2]["width"], images[2]["height"])]


def _plant_val(doc, expected) -> None:
    images, anns = doc
    first = images[0]
    anns.append({"id": len(anns) + 1, "image_id": first["id"], "category_id": 12, "bbox": [10, 10, 30, 30], "iscrowd": 0, "area": 900})
    expected[first["file_name"][:-4]].append(_norm(4, 10, 10, 40, 40, first["width"], first["height"]))


def _xml(filename: str, w: int, h: int, objects: list[tuple[str, list[float], int]]) -> str:
    objs = "".join(f"<object><name>{n}</name><difficult>{d}</difficult><bndbox><xmin>{b[0]}</xmin><ymin>{b[1]}</ymin>"
                   f"<xmax>{b[2]}</xmax><ymax>{b[3]}</ymax></bndbox></object>" for n, b, d in objects)
    return f"<annotation><filename>{filename}</filename><size><width>{w}</width><height>{h}</height><depth>3</depth></size>{objs}</annotation>"


def make_voc(root: Path, shapes_dir: Path, n_train: int = 12, n_val: int = 6) -> dict:
    """root/VOC/{Annotations, JPEGImages, ImageSets/Main/{train,val}.txt}: 1-based corners (xmin + 1 .. xmax + 1)."""
    folder = root / "VOC"
    for sub in ("Annotations", "JPEGImages", "ImageSets/Main"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    expected: dict[str, dict[str, list]] = {"train": {}, "val": {}}
    for split, n in (("train", n_train), ("val", n_val)):
        ids = []
        for k, (src, rows) in enumerate(shapes_items(shapes_dir, split, n)):
            image_id = f"{split}_{k:03d}"
            shutil.copy(src, folder / "JPEGImages" / f"{image_id}.jpg")
            h, w = cv2.imread(str(src)).shape[:2]
            objects, kept = [], []
            if not (split == "train" and k == 1):  # train_001: no objects, a background
                for row in rows:
                    c, (x, y, bw, bh) = _pixels(row, w, h)
                    objects.append((NAMES[c], [x + 1, y + 1, x + bw + 1, y + bh + 1], 0))
                    kept.append(row)
            if split == "train" and k == 0:
                objects.append(("circle", [11, 11, 51, 51], 1))  # difficult: skipped
                objects.append(("rectangle", [w - 9, 6, w + 21, 26], 0))  # partly outside: clipped
                kept.append(_norm(1, w - 10, 5, w, 25, w, h))
            if split == "val" and k == 0:
                objects.append(("star", [11, 11, 41, 41], 0))  # a class only in val
                kept.append(_norm(4, 10, 10, 40, 40, w, h))
            (folder / "Annotations" / f"{image_id}.xml").write_text(_xml(f"{image_id}.jpg", w, h, objects))
            expected[split][image_id] = kept
            ids.append(image_id)
        if split == "train":
            ids.append(ids[0])  # listed twice: read once
        (folder / "ImageSets" / "Main" / f"{split}.txt").write_text("\n".join(ids) + "\n")
    return {"folder": folder, "expected": expected}


def read_yolo_labels(labels_dir: Path) -> dict[str, list[list[float]]]:
    """{label path relative to labels_dir, without .txt: rows} of every txt under labels_dir."""
    out = {}
    for f in sorted(labels_dir.rglob("*.txt")):
        out[str(f.relative_to(labels_dir).with_suffix(""))] = [[float(v) for v in line.split()] for line in f.read_text().splitlines() if line.strip()]
    return out
