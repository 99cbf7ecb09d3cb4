"""Data in the formats people have (issue #46): COCO JSON and VOC splits in a data YAML train directly and after
`yolo-cb convert` with the same labels; `yolo-cb data check` reports each planted problem; bad input is one line,
exit 2, nothing written; labels.jpg is drawn and logged to MLflow. Every set is made in tmp_path (tests/format_sets.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from format_sets import NAMES, make_coco, make_voc, read_yolo_labels

from yolo_cb import YOLO

TOL = 2e-6  # labels are written with 6 decimals


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yolo_cb", *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def files_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def by_stem(labels_dir: Path) -> dict[str, list[list[float]]]:
    return {Path(k).name: v for k, v in read_yolo_labels(labels_dir).items()}


def assert_same_rows(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for stem, rows in want.items():
        assert len(got[stem]) == len(rows), stem
        for a, b in zip(sorted(got[stem]), sorted(rows), strict=True):
            assert a[0] == b[0] and all(abs(x - y) <= TOL for x, y in zip(a[1:], b[1:], strict=True)), (stem, a, b)


def converted_labels(datasets_dir: Path, split_dir: str) -> Path:
    """The labels folder of our converted copy whose images folder is `split_dir` (the data dict's split)."""
    images = Path(split_dir)
    assert images.parent.name == "images" and datasets_dir in images.parents
    return images.parent.parent / "labels" / images.name


@pytest.fixture
def coco(tmp_path, shapes_dir):
    return make_coco(tmp_path / "user", shapes_dir)


@pytest.fixture
def voc(tmp_path, shapes_dir):
    return make_voc(tmp_path / "user", shapes_dir)


@pytest.mark.slow
def test_coco_trains_directly_and_after_convert_with_the_same_labels(tmp_path, coco, tiny, monkeypatch):
    from mlflow.tracking import MlflowClient

    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN"):
        monkeypatch.delenv(key, raising=False)
    before = files_under(coco["folder"])
    data = tmp_path / "coco.yaml"
    data.write_text(f"path: {coco['folder']}\ntrain: instances_train.json\nval: val/val.json\n")  # no names: the categories
    dd = tmp_path / "dd"
    model = YOLO("yolox-nano.yaml")
    model.train(**{**tiny, "data": str(data), "datasets_dir": str(dd), "plots": True, "mlflow": True})
    resolved = model.trainer.data
    assert resolved["names"] == dict(enumerate(NAMES)) and resolved["category_ids"] == [1, 3, 7, 10, 12]  # gaps: 0..4 in id order
    direct = {s: by_stem(converted_labels(dd, resolved[s])) for s in ("train", "val")}
    for split in ("train", "val"):
        assert_same_rows(direct[split], coco["expected"][split])
    assert files_under(coco["folder"]) == before  # nothing written beside the user's data
    run_dir = Path(tiny["project"]) / "exp"
    assert (run_dir / "labels.jpg").stat().st_size > 1000
    client = MlflowClient(f"sqlite:///{Path(tiny['project']) / 'mlruns' / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name(Path(tiny["project"]).name).experiment_id])[0]
    assert "labels.jpg" in {a.path for a in client.list_artifacts(run.info.run_id)}
    local = Path(client.download_artifacts(run.info.run_id, "labels.jpg", str(tmp_path)))
    assert local.read_bytes() == (run_dir / "labels.jpg").read_bytes()

    proc = cli("convert", f"source={coco['folder']}", "format=coco", f"out={tmp_path / 'yolo'}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for split in ("train", "val"):
        assert_same_rows(by_stem(tmp_path / "yolo" / "labels" / split), direct[split])
    YOLO("yolox-nano.yaml").train(**{**tiny, "data": str(tmp_path / "yolo" / "data.yaml"), "name": "after_convert",
                                     "datasets_dir": str(dd)})


@pytest.mark.slow
def test_voc_trains_directly_and_after_convert_with_the_same_labels(tmp_path, voc, tiny):
    before = files_under(voc["folder"])
    data = tmp_path / "voc.yaml"
    data.write_text(f"path: {voc['folder']}\ntrain: .\nval: ImageSets/Main/val.txt\nnames: {NAMES}\n")
    dd = tmp_path / "dd"
    model = YOLO("yolox-nano.yaml")
    model.train(**{**tiny, "data": str(data), "datasets_dir": str(dd)})
    resolved = model.trainer.data
    direct = {s: by_stem(converted_labels(dd, resolved[s])) for s in ("train", "val")}
    for split in ("train", "val"):
        assert_same_rows(direct[split], voc["expected"][split])
    assert files_under(voc["folder"]) == before
    proc = cli("convert", f"source={voc['folder']}", "format=voc", f"out={tmp_path / 'yolo'}", f"names={','.join(NAMES)}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for split in ("train", "val"):
        assert_same_rows(by_stem(tmp_path / "yolo" / "labels" / split), direct[split])
    YOLO("yolox-nano.yaml").train(**{**tiny, "data": str(tmp_path / "yolo" / "data.yaml"), "name": "after_convert"})


def test_data_check_reports_each_planted_problem(tmp_path, coco, voc):
    (tmp_path / "coco.yaml").write_text(f"path: {coco['folder']}\ntrain: instances_train.json\nval: val/val.json\n")
    proc = cli("data", "check", "data=coco.yaml", "datasets_dir=dd", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for planted in ("1 iscrowd boxes skipped", "1 boxes clipped to the image", "1 boxes without area dropped",
                    "1 boxes wholly outside the image dropped", "1 tiny box(es)", "train_000.jpg: class 3 box 1.0x1.0 px",
                    "1 image(s) are in more than one split (same content): train:train_000.jpg = val:val_006.jpg",
                    "val: class(es) with boxes here and none in train: star (1)", "image(s) without boxes (kept as backgrounds)",
                    "train_002.png: named train_002_2.png (as train_002.png it would share its label file train_002.txt"):
        assert planted in out, (planted, out)
    assert out.rstrip().endswith("warning(s); no errors")
    (tmp_path / "voc.yaml").write_text(f"path: {voc['folder']}\ntrain: .\nval: .\nnames: {NAMES}\n")
    out = cli("data", "check", "data=voc.yaml", "datasets_dir=dd", cwd=tmp_path).stdout
    for planted in ("1 difficult boxes skipped", "1 image ids listed twice read once", "1 boxes clipped to the image", "star (1)"):
        assert planted in out, (planted, out)


def test_data_check_on_a_yolo_folder(tmp_path, shapes_dir):
    """Boxes outside the image and a duplicate inside one split, in plain YOLO labels."""
    import shutil

    root = tmp_path / "set"
    for split, n in (("train", 3), ("val", 2)):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        for k, img in enumerate(sorted((shapes_dir / "images" / split).glob("*.jpg"))[:n]):
            shutil.copy(img, root / "images" / split / f"{k}.jpg")
            (root / "labels" / split / f"{k}.txt").write_text("0 0.5 0.5 0.2 0.2\n" if split == "train" else "1 0.5 0.5 0.2 0.2\n")
    shutil.copy(root / "images" / "train" / "0.jpg", root / "images" / "train" / "copy.jpg")
    (root / "labels" / "train" / "1.txt").write_text("0 0.5 0.5 0.2 0.2\n0 0.98 0.5 0.2 0.2\n")  # 8% outside: dropped
    (root / "data.yaml").write_text("train: images/train\nval: images/val\nnames: [a, b, c]\n")
    before = files_under(root)
    proc = cli("data", "check", f"data={root / 'data.yaml'}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "1 label file(s) with boxes outside the image (clipped or dropped)" in proc.stdout
    assert "1 image(s) appear twice in one split (same content): train:0.jpg = train:copy.jpg" in proc.stdout
    assert "val: class(es) with boxes here and none in train: b (2)" in proc.stdout
    assert "class(es) without any box in any split: c" in proc.stdout
    assert files_under(root) == before  # the check writes nothing (no label cache)


def _coco_doc(**changes) -> dict:
    doc = {"images": [{"id": 1, "file_name": "a.jpg", "width": 64, "height": 48}],
           "annotations": [{"id": 7, "image_id": 1, "category_id": 3, "bbox": [1, 2, 10, 10]}],
           "categories": [{"id": 3, "name": "thing"}]}
    doc.update(changes)
    return doc


BAD_COCO = {
    "malformed": ('{"images": [', "not valid JSON (line 1, column"),
    "missing image id": (_coco_doc(annotations=[{"id": 7, "image_id": 5, "category_id": 3, "bbox": [1, 2, 3, 4]}]),
                         "annotations[0] (id 7): image_id 5 is not the id of any entry in 'images'"),
    "bbox of 3": (_coco_doc(annotations=[{"id": 7, "image_id": 1, "category_id": 3, "bbox": [1, 2, 3]}]),
                  "annotations[0] (id 7): bbox must be 4 numbers, got [1, 2, 3]"),
    "bbox of text": (_coco_doc(annotations=[{"id": 7, "image_id": 1, "category_id": 3, "bbox": "1 2 3 4"}]), "bbox must be 4 numbers"),
    "unknown category": (_coco_doc(annotations=[{"id": 7, "image_id": 1, "category_id": 4, "bbox": [1, 2, 3, 4]}]),
                         "category_id 4 is not the id of any entry in 'categories'"),
    "category name twice": (_coco_doc(categories=[{"id": 3, "name": "thing"}, {"id": 4, "name": "thing"}]),
                            "categories: category name 'thing' is given twice"),
    "same file twice": (_coco_doc(images=[{"id": 1, "file_name": "a.jpg", "width": 64, "height": 48},
                                          {"id": 2, "file_name": "a.jpg", "width": 64, "height": 48}]),
                        "images[1] (id 2): file_name 'a.jpg' is also image id 1"),
}


@pytest.mark.parametrize("case", list(BAD_COCO))
def test_bad_coco_is_one_line_exit_2_nothing_written(tmp_path, case):
    import cv2
    import numpy as np

    doc, expected = BAD_COCO[case]
    cv2.imwrite(str(tmp_path / "a.jpg"), np.zeros((48, 64, 3), np.uint8))
    (tmp_path / "ann.json").write_text(doc if isinstance(doc, str) else json.dumps(doc))
    proc = cli("convert", "source=ann.json", "format=coco", "out=out", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert f"{tmp_path / 'ann.json'}: " in proc.stderr and expected in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


BAD_VOC = {
    "malformed": ("<annotation><size><width>64</width>", "not well-formed XML"),
    "doctype": ('<!DOCTYPE a [<!ENTITY x "y">]><annotation/>', "declares a DOCTYPE or ENTITY"),
    "no size": ("<annotation><object><name>a</name></object></annotation>", "<size>: is missing"),
    "bad box": ("<annotation><size><width>64</width><height>48</height></size><object><name>a</name><bndbox><xmin>1</xmin>"
                "<ymin>x</ymin><xmax>5</xmax><ymax>5</ymax></bndbox></object></annotation>", "object 1 (a) <bndbox>: xmin, ymin, xmax, ymax must be 4 numbers"),
}


@pytest.mark.parametrize("case", list(BAD_VOC))
def test_bad_voc_is_one_line_exit_2_nothing_written(tmp_path, case):
    import cv2
    import numpy as np

    text, expected = BAD_VOC[case]
    voc = tmp_path / "VOC"
    for sub in ("Annotations", "JPEGImages", "ImageSets/Main"):
        (voc / sub).mkdir(parents=True)
    cv2.imwrite(str(voc / "JPEGImages" / "0001.jpg"), np.zeros((48, 64, 3), np.uint8))
    (voc / "Annotations" / "0001.xml").write_text(text)
    (voc / "ImageSets" / "Main" / "train.txt").write_text("0001\n")
    proc = cli("convert", "source=VOC", "format=voc", "out=out", "names=a", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert str(voc / "Annotations" / "0001.xml") in proc.stderr and expected in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_labelme_and_labelstudio_convert(tmp_path):
    import cv2
    import numpy as np

    src = tmp_path / "lm"
    src.mkdir()
    cv2.imwrite(str(src / "a.jpg"), np.zeros((50, 100, 3), np.uint8))
    shapes = [{"label": "cat", "shape_type": "rectangle", "points": [[10, 5], [30, 25]]},
              {"label": "dog", "shape_type": "polygon", "points": [[50, 10], [90, 20], [60, 60]]},  # clipped at y=50
              {"label": "cat", "shape_type": "point", "points": [[1, 1]]}]  # not a box: skipped, counted
    (src / "a.json").write_text(json.dumps({"imagePath": "a.jpg", "imageWidth": 100, "imageHeight": 50, "shapes": shapes}))
    proc = cli("convert", "source=lm", "format=labelme", "out=out_lm", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "1 shapes that are not boxes or polygons skipped" in proc.stdout and "1 boxes clipped" in proc.stdout
    rows = read_yolo_labels(tmp_path / "out_lm" / "labels" / "train")["a"]
    assert rows == [[0, 0.2, 0.3, 0.2, 0.4], [1, 0.7, 0.6, 0.4, 0.8]]
    assert "cat" in (tmp_path / "out_lm" / "data.yaml").read_text()

    ls = tmp_path / "ls"
    (ls / "images").mkdir(parents=True)
    cv2.imwrite(str(ls / "images" / "1a2b-photo.jpg"), np.zeros((50, 100, 3), np.uint8))
    result = {"type": "rectanglelabels", "original_width": 100, "original_height": 50,
              "value": {"x": 10, "y": 20, "width": 30, "height": 40, "rotation": 0, "rectanglelabels": ["car"]}}
    tasks = [{"id": 1, "data": {"image": "/data/upload/1/1a2b-photo.jpg"}, "annotations": [{"result": [result]}]}]
    (ls / "export.json").write_text(json.dumps(tasks))
    proc = cli("convert", "source=ls/export.json", "format=labelstudio", "out=out_ls", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert read_yolo_labels(tmp_path / "out_ls" / "labels" / "train")["1a2b-photo"] == [[0, 0.25, 0.4, 0.3, 0.4]]


def test_convert_refuses_a_folder_with_content_and_unknown_keys(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    (tmp_path / "a.json").write_text(json.dumps(_coco_doc(annotations=[])))
    proc = cli("convert", "source=a.json", "format=coco", "out=out", cwd=tmp_path)
    assert proc.returncode == 2 and "exists and is not an empty folder" in proc.stderr
    assert files_under(tmp_path / "out") == {"keep.txt"}
    proc = cli("convert", "source=a.json", "fromat=coco", "out=o", cwd=tmp_path)
    assert proc.returncode == 2 and "Did you mean 'format'" in proc.stderr
    proc = cli("data", "check", cwd=tmp_path)
    assert proc.returncode == 2 and "data check needs data=" in proc.stderr


def test_coco_categories_follow_the_yaml_names_by_name(tmp_path, coco):
    """names: given in another order: each category goes to the class of its name; a category not in names is refused."""
    from yolo_cb.data.resolve import check_data
    from yolo_cb.errors import DataError

    order = ["star", "cross", "triangle", "rectangle", "circle"]
    (tmp_path / "d.yaml").write_text(f"path: {coco['folder']}\ntrain: instances_train.json\nval: val/val.json\nnames: {order}\n")
    data = check_data(tmp_path / "d.yaml", tmp_path / "dd")
    assert "category_ids" not in data  # the YAML's classes: predictions.json writes 0..n-1 as for any YAML
    got = by_stem(converted_labels(tmp_path / "dd", data["val"]))
    want = {stem: [[order.index(NAMES[int(r[0])]), *r[1:]] for r in rows] for stem, rows in coco["expected"]["val"].items()}
    assert_same_rows(got, want)
    (tmp_path / "e.yaml").write_text(f"path: {coco['folder']}\ntrain: instances_train.json\nval: val/val.json\nnames: [circle, cross]\n")
    with pytest.raises(DataError, match=r"instances_train\.json: categories: class 'rectangle' is not in names \(circle, cross\)"):
        check_data(tmp_path / "e.yaml", tmp_path / "dd")
    assert not (tmp_path / "dd" / "converted").exists() or len(list((tmp_path / "dd" / "converted").iterdir())) == 2
