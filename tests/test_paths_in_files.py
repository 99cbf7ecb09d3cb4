"""A file that names another file names one inside its own folder (issue 59, section 2), and malformed import files
are one line (section 5).

A COCO `file_name`, a LabelMe `imagePath`, a VOC image-set id and a Label Studio image each name a file; every set here
also names a "secret" image that exists outside the dataset root (through '..', an absolute path, a symbolic link in
the root that points out). `yolo-cb convert`, `yolo-cb data check` and a downloaded COCO set resolved for training must
read none of them: the written set neither holds nor links the secret, and a counted line says what was skipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml
from test_data_safety import server  # noqa: F401 - the loopback http server fixture

TESTS = Path(__file__).resolve().parent
LEAVES = "entries whose image path leaves"


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)]), "HOME": str(cwd),
           "YOLO_CB_DATASETS": str(cwd / "default_datasets"), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "yolo_cb", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=300, stdin=subprocess.DEVNULL)


def jpg(path: Path, value: int = 90, h: int = 48, w: int = 64) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), np.full((h, w, 3), value, np.uint8))
    return path


@pytest.fixture
def secret(tmp_path) -> Path:
    """tmp_path/secret/photo.jpg: a private image outside every dataset root (noise, so its bytes are its own)."""
    path = tmp_path / "secret" / "photo.jpg"
    path.parent.mkdir()
    noise = np.random.default_rng(59).integers(0, 255, (48, 64, 3), dtype=np.uint8)
    path.write_bytes(cv2.imencode(".jpg", noise)[1].tobytes())
    return path


def link(path: Path, target: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, path)
    return path


def assert_nothing_from_outside(folder: Path, root: Path, secret: Path) -> None:
    """Every file under `folder` is ours or a link into `root`; none is (or holds the bytes of) the secret."""
    assert folder.is_dir(), folder
    data = secret.read_bytes()
    for path in folder.rglob("*"):
        real = Path(os.path.realpath(path))
        if path.is_symlink():
            assert root.resolve() in real.parents, f"{path} links to {real}, outside {root}"
        assert real not in (secret.resolve(), Path("/etc/hostname")), path
        if path.is_file():
            assert data not in path.read_bytes(), f"{path} holds the secret's bytes"


def image_names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.suffix == ".jpg")


def coco_doc(file_names: list[str], names=("thing",)) -> dict:
    images = [{"id": i + 1, "file_name": f, "width": 64, "height": 48} for i, f in enumerate(file_names)]
    anns = [{"id": i + 1, "image_id": i + 1, "category_id": 1, "bbox": [4, 4, 20, 20], "iscrowd": 0} for i in range(len(file_names))]
    return {"images": images, "annotations": anns, "categories": [{"id": k + 1, "name": n} for k, n in enumerate(names)]}


def coco_set(ds: Path, secret: Path) -> Path:
    """ds/ann.json naming two images inside ds (one by its absolute path) and five ways out of it."""
    jpg(ds / "a.jpg")
    jpg(ds / "images" / "b.jpg", 120)
    link(ds / "link.jpg", secret)  # a link in the root that points out is out
    names = ["a.jpg", "../../secret/photo.jpg", str(ds / "images" / "b.jpg"), str(secret), "/etc/hostname", "link.jpg",
             "images/../../../secret/photo.jpg"]
    (ds / "ann.json").write_text(json.dumps(coco_doc(names)))
    return ds / "ann.json"


# --- 1. yolo-cb convert, each format -------------------------------------------------------------------------
def test_convert_coco_reads_nothing_outside_the_json_folder(tmp_path, secret):
    ds = tmp_path / "user" / "ds"
    coco_set(ds, secret)
    done = cli("convert", "source=user/ds/ann.json", "format=coco", "out=out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert_nothing_from_outside(tmp_path / "out", ds, secret)
    assert image_names(tmp_path / "out") == ["a.jpg", "b.jpg"]
    assert sorted(p.stem for p in (tmp_path / "out" / "labels" / "ann").iterdir()) == ["a", "b"]
    assert f"skipped 5 {LEAVES} {ds}: e.g. '../../secret/photo.jpg'" in done.stdout, done.stdout
    assert "5 images whose path leaves the dataset root skipped" in done.stdout, done.stdout


def test_convert_labelme_reads_nothing_outside_its_folder(tmp_path, secret):
    lm = tmp_path / "user" / "lm"
    shape = [{"label": "cat", "shape_type": "rectangle", "points": [[4, 4], [20, 20]]}]

    def annotation(stem: str, image_path: str | None) -> None:
        doc = {"imageWidth": 64, "imageHeight": 48, "shapes": shape, **({"imagePath": image_path} if image_path else {})}
        (lm / f"{stem}.json").write_text(json.dumps(doc))

    jpg(lm / "e.jpg")
    annotation("e", "e.jpg")
    annotation("a", "../../secret/photo.jpg")
    annotation("b", str(secret))
    annotation("c", "c_link.jpg")
    link(lm / "c_link.jpg", secret)
    annotation("d", None)  # no imagePath: the image beside it with its stem, here a link that points out
    link(lm / "d.jpg", secret)
    annotation("f", "..\\..\\secret\\photo.jpg")  # written on Windows
    done = cli("convert", "source=user/lm", "format=labelme", "out=out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert_nothing_from_outside(tmp_path / "out", lm, secret)
    assert image_names(tmp_path / "out") == ["e.jpg"]
    assert f"skipped 5 {LEAVES} {lm}: e.g. '../../secret/photo.jpg'" in done.stdout, done.stdout


def voc_set(voc: Path, secret: Path) -> None:
    """A VOC folder whose list names 0001 (inside), two ids that climb out, one whose image links out, and one whose
    annotation links out; the secret annotation beside the secret image has a class of its own."""
    for sub in ("Annotations", "JPEGImages", "ImageSets/Main"):
        (voc / sub).mkdir(parents=True, exist_ok=True)
    xml = ("<annotation><filename>{}.jpg</filename><size><width>64</width><height>48</height></size><object>"
           "<name>{}</name><bndbox><xmin>5</xmin><ymin>5</ymin><xmax>20</xmax><ymax>20</ymax></bndbox></object></annotation>")
    secret.with_suffix(".xml").write_text(xml.format("photo", "secretclass"))
    jpg(voc / "JPEGImages" / "0001.jpg")
    (voc / "Annotations" / "0001.xml").write_text(xml.format("0001", "cat"))
    (voc / "Annotations" / "0002.xml").write_text(xml.format("0002", "cat"))
    link(voc / "JPEGImages" / "0002.jpg", secret)
    link(voc / "Annotations" / "0003.xml", secret.with_suffix(".xml"))
    jpg(voc / "JPEGImages" / "0003.jpg")
    ids = ["0001", "../../../secret/photo", str(secret.with_suffix("")), "0002", "0003"]
    (voc / "ImageSets" / "Main" / "train.txt").write_text("\n".join(ids) + "\n")


def test_convert_voc_reads_nothing_outside_its_root(tmp_path, secret):
    voc = tmp_path / "user" / "VOC"
    voc_set(voc, secret)
    done = cli("convert", "source=user/VOC", "format=voc", "out=out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert_nothing_from_outside(tmp_path / "out", voc, secret)
    assert image_names(tmp_path / "out") == ["0001.jpg"]
    assert yaml.safe_load((tmp_path / "out" / "data.yaml").read_text())["names"] == {0: "cat"}  # no class read from outside
    assert f"skipped 4 {LEAVES} {voc}: e.g. '../../../secret/photo'" in done.stdout, done.stdout


def test_convert_labelstudio_reads_nothing_outside_the_export_folder(tmp_path, secret):
    ls = tmp_path / "user" / "ls"
    jpg(ls / "images" / "good.jpg")
    link(ls / "link.jpg", secret)
    link(ls / "images" / "link2.jpg", secret)
    result = {"type": "rectanglelabels", "original_width": 64, "original_height": 48,
              "value": {"x": 10, "y": 10, "width": 30, "height": 30, "rotation": 0, "rectanglelabels": ["car"]}}
    images = ["/data/upload/1/good.jpg", "/data/upload/1/link.jpg", "http://example.invalid/link2.jpg"]
    tasks = [{"id": i + 1, "data": {"image": image}, "annotations": [{"result": [result]}]} for i, image in enumerate(images)]
    (ls / "export.json").write_text(json.dumps(tasks))
    done = cli("convert", "source=user/ls/export.json", "format=labelstudio", "out=out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert_nothing_from_outside(tmp_path / "out", ls, secret)
    assert image_names(tmp_path / "out") == ["good.jpg"]
    assert f"skipped 2 {LEAVES} {ls}: e.g. 'link.jpg'" in done.stdout, done.stdout


# --- 2. yolo-cb data check and training's resolution of a data YAML -----------------------------------------
def test_data_check_of_a_coco_yaml_links_nothing_outside(tmp_path, secret):
    ds = tmp_path / "user" / "ds"
    coco_set(ds, secret)
    (tmp_path / "user" / "data.yaml").write_text("path: ds\ntrain: ann.json\nval: ann.json\n")
    done = cli("data", "check", "data=user/data.yaml", "datasets_dir=store", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert_nothing_from_outside(tmp_path / "store", ds, secret)
    assert [image_names(f) for f in (tmp_path / "store" / "converted").iterdir()] == [["a.jpg", "b.jpg"]] * 2
    assert "WARNING train: the COCO/VOC conversion: 5 images whose path leaves the dataset root skipped" in done.stdout, done.stdout
    assert f"WARNING train: the COCO/VOC conversion: {ds / 'ann.json'}: skipped 5 {LEAVES} {ds}" in done.stdout, done.stdout


def test_data_check_of_a_voc_yaml_reads_no_class_from_outside(tmp_path, secret):
    voc = tmp_path / "user" / "VOC"
    voc_set(voc, secret)
    (tmp_path / "user" / "data.yaml").write_text("path: VOC\ntrain: ImageSets/Main/train.txt\nval: ImageSets/Main/train.txt\n")
    done = cli("data", "check", "data=user/data.yaml", "datasets_dir=store", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "(1 classes)" in done.stdout and "secretclass" not in done.stdout, done.stdout
    assert_nothing_from_outside(tmp_path / "store", voc, secret)


def test_a_downloaded_coco_set_resolves_for_training_without_the_secret(tmp_path, secret, server):  # noqa: F811
    """The data YAML names a downloaded COCO JSON: what training reads (the converted train split) holds only the
    archive's own image, never the secret that '../../secret/photo.jpg' names from datasets_dir/ds."""
    from yolo_cb.data.resolve import check_data
    from yolo_cb.data.verify import list_image_files

    www, url, requests = server
    with zipfile.ZipFile(www / "ds.zip", "w") as zf:
        zf.writestr("ds/images/a.jpg", cv2.imencode(".jpg", np.full((48, 64, 3), 90, np.uint8))[1].tobytes())
        zf.writestr("ds/ann.json", json.dumps(coco_doc(["a.jpg", "../../secret/photo.jpg", str(secret), "/etc/hostname"])))
    (tmp_path / "data.yaml").write_text(f"path: ds\ntrain: ann.json\nval: ann.json\nnames: [thing]\ndownload: {url}/ds.zip\n")
    store = tmp_path / "store"
    data = check_data(tmp_path / "data.yaml", datasets_dir=str(store))
    assert requests == ["/ds.zip"]
    assert [Path(f).name for f in list_image_files(data["train"])] == ["a.jpg"]
    assert_nothing_from_outside(store, store / "ds", secret)
    record = json.loads((Path(data["train"]).parents[1] / "conversion.json").read_text())
    assert record["counts"] == {"outside_root": 3} and f"skipped 3 {LEAVES} {store / 'ds'}" in record["notes"][-1]


def test_a_class_name_with_a_newline_forges_no_line_in_data_check(tmp_path):
    ds = tmp_path / "ds"
    jpg(ds / "a.jpg")
    forged = "cat\nWARNING nothing to see\x1b[2J"
    (ds / "ann.json").write_text(json.dumps(coco_doc(["a.jpg"], names=(forged, "dog"))))
    (ds / "data.yaml").write_text("train: ann.json\nval: ann.json\n")
    done = cli("data", "check", "data=ds/data.yaml", "datasets_dir=store", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert not any(line.startswith("WARNING nothing") for line in done.stdout.splitlines()), done.stdout
    assert "\x1b" not in done.stdout and "cat\\nWARNING nothin" in done.stdout, done.stdout  # the table cuts names at 19


# --- 3. malformed import files: one line, exit 2 ----------------------------------------------------------------
RESULT = {"type": "rectanglelabels", "original_width": 64, "original_height": 48,
          "value": {"x": 10, "y": 10, "width": 30, "height": 30, "rectanglelabels": ["car"]}}


def task(image="/data/upload/1/a.jpg", annotations=None, result=None, **value) -> list[dict]:
    """A Label Studio export of one task; `value` keys replace the result's (value=[1] replaces the whole value)."""
    one = dict(RESULT, value=value["value"]) if "value" in value else dict(RESULT, value={**RESULT["value"], **value})
    return [{"id": 1, "data": {"image": image}, "annotations": [{"result": [one] if result is None else result}] if annotations is None else annotations}]


def coco_text(*images: dict) -> str:
    return json.dumps(coco_doc(["a.jpg"]) | {"images": [{"id": 1, "file_name": "a.jpg", "width": 64, "height": 48} | i for i in images]})


LONG = "x" * 300 + ".jpg"
MALFORMED = {  # case -> (format, file text, what the line says)
    "ls annotations 5": ("labelstudio", task(annotations=5), "task 1: 'annotations' must be a list of objects, got 5"),
    "ls result 5": ("labelstudio", task(result=5), "task 1 annotation 0: 'result' must be a list of objects, got 5"),
    "ls value [1]": ("labelstudio", task(value=[1]), "task 1 result 0: 'value' must be an object, got [1]"),
    "ls rotation abc": ("labelstudio", task(rotation="abc"), "task 1 result 0: value.rotation must be a number (degrees), got 'abc'"),
    "ls rotation nan text": ("labelstudio", task(rotation="nan"), "task 1 result 0: value.rotation must be a number (degrees), got 'nan'"),
    "ls rotation NaN": ("labelstudio", json.dumps(task()).replace('"x": 10', '"rotation": NaN, "x": 10'),
                        "task 1 result 0: value.rotation must be a number (degrees), got nan"),
    "ls invalid url": ("labelstudio", task(image="http://[::1/a.jpg"), "task 1: data.image 'http://[::1/a.jpg' is not a valid URL or path"),
    "ls long name": ("labelstudio", task(image="/data/upload/1/" + LONG), "task 1 data.image: 'xxxxxxxx"),
    "coco nested": ("coco", "[" * 200000 + "]" * 200000, "nested too deeply"),
    "coco 5000-digit id": ("coco", coco_text({}).replace('"id": 1, "file', '"id": ' + "7" * 5000 + ', "file'), "has 5000 digits"),
    "coco 4000-digit id": ("coco", coco_text({}, {"id": int("7" * 4000)}), "images[1] (id 7777777"),
    "coco long file name": ("coco", coco_text({"file_name": LONG}), "images[0] (id 1) file_name: 'xxxxxxxx"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_import_file_is_one_line_exit_2(tmp_path, case):
    fmt, text, said = MALFORMED[case]
    jpg(tmp_path / "src" / "a.jpg")
    source = tmp_path / "src" / "in.json"
    source.write_text(text if isinstance(text, str) else json.dumps(text))
    line = one_line(cli("convert", f"source={source}", f"format={fmt}", "out=out", cwd=tmp_path))
    assert f"{source}: " in line and said in line, line
    assert not (tmp_path / "out").exists()


def one_line(done: subprocess.CompletedProcess) -> str:
    """The one stderr line of a refused command: exit 2, no traceback, no control character, no value 100 long."""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert lines[0].startswith("yolo-cb: error: ") and lines[0].isprintable(), lines[0]
    assert "x" * 100 not in lines[0] and "7" * 100 not in lines[0] and len(lines[0]) < 500, lines[0]
    return lines[0]


def test_a_voc_list_that_is_not_utf8_is_one_line_exit_2(tmp_path):
    voc = tmp_path / "VOC"
    for sub in ("Annotations", "JPEGImages", "ImageSets/Main"):
        (voc / sub).mkdir(parents=True)
    listed = voc / "ImageSets" / "Main" / "train.txt"
    listed.write_bytes(b"0001\n\xff\xfe0002\n")
    line = one_line(cli("convert", "source=VOC", "format=voc", "out=out", "names=a", cwd=tmp_path))
    assert f"{listed}: " in line and "not UTF-8 text" in line, line
    assert not (tmp_path / "out").exists()
