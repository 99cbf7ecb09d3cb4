"""Weights & Biases, the one-file integration: a real offline W&B run read back from its local files; a missing
package costs one warning line, not the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from yolo_cb import YOLO

pytest.importorskip("wandb")


def read_run_records(run_file: Path) -> list:
    """Every record of an offline W&B run file (`run-<id>.wandb`), parsed with W&B's own protobuf schema.

    The file is W&B's 7-byte header then a LevelDB-style log: 32 KiB blocks of chunks, each chunk a 7-byte header
    (crc32c, little-endian length, type: 1 whole record, 2/3/4 first/middle/last piece of one)."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B", data[:8]
    block, pos, pieces, payloads = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:
            payloads.append(chunk)
        elif kind in (2, 3):
            pieces = (pieces if kind == 3 else b"") + chunk
        elif kind == 4:
            payloads.append(pieces + chunk)
    records = []
    for payload in payloads:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        records.append(record)
    return records


def history_rows(records) -> list[dict]:
    """The logged rows; a nested value (a W&B image) becomes a dict of its fields."""
    rows = []
    for record in records:
        if record.WhichOneof("record_type") != "history":
            continue
        row: dict = {}
        for item in record.history.item:
            top, *rest = [item.key] if item.key else list(item.nested_key)
            value = json.loads(item.value_json)
            if rest:
                row.setdefault(top, {})["/".join(rest)] = value
            else:
                row[top] = value
        rows.append(row)
    return rows


@pytest.mark.slow
def test_offline_run_holds_config_losses_metrics_images_and_best_model(tiny, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    settings = {**tiny, "epochs": 2, "wandb": True, "plots": True}
    code = f"from yolo_cb import YOLO; YOLO('yolox-nano.yaml').train(**{settings!r})"
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "HOME": str(home), "WANDB_PROJECT": "yolo-cb-test",
           "XDG_CACHE_HOME": str(home / ".cache"), "XDG_CONFIG_HOME": str(home / ".config"), "XDG_DATA_HOME": str(home / ".local")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = Path(tiny["project"]) / tiny["name"]

    offline = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 1, f"one offline W&B run inside the run dir, found {offline}"
    records = read_run_records(next(offline[0].glob("run-*.wandb")))
    kinds = {r.WhichOneof("record_type") for r in records}
    assert {"run", "history", "artifact", "exit"} <= kinds, kinds

    run_record = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert run_record.project == "yolo-cb-test" and run_record.display_name == tiny["name"]
    config = {item.key: json.loads(item.value_json) for item in run_record.config.update}
    assert config.get("imgsz") == tiny["imgsz"] and config.get("epochs") == 2 and config.get("wandb") is True

    rows = history_rows(records)
    epoch_rows = [row for row in rows if "train/iou_loss" in row]
    assert [row["epoch"] for row in epoch_rows] == [0, 1]  # one row per epoch
    assert all("metrics/mAP50-95(B)" in row and "lr/pg0" in row for row in epoch_rows)  # every epoch validated
    csv = (run_dir / "results.csv").read_text().splitlines()
    header, last = csv[0].split(","), csv[-1].split(",")
    assert epoch_rows[-1]["metrics/mAP50-95(B)"] == pytest.approx(float(last[header.index("metrics/mAP50-95(B)")]), abs=1e-5)
    batch_rows = [row for row in rows if "batch/iou_loss" in row]
    assert len(batch_rows) >= 2  # batch 0 of each epoch at least (every LOG_EVERY batches)
    images = [row["val_batch0_pred"] for row in rows if "val_batch0_pred" in row]  # the visualisation images, as W&B images
    assert len(images) == 2 and images[0]["_type"] == "image-file"
    assert list((offline[0] / "files" / "media" / "images").glob("val_batch0_pred*"))

    artifacts = [r.artifact for r in records if r.WhichOneof("record_type") == "artifact"]
    assert [a.type for a in artifacts] == ["model"]
    assert [entry.path for entry in artifacts[0].manifest.contents] == ["best.pt"]


def test_asked_for_without_the_package_is_one_line_before_any_work(tiny, monkeypatch):
    """wandb=True is asked for explicitly (it is off by default): without the package the run does not start, and the one
    line says how to install it (an integration on by default only warns: test_integration_mlflow / tensorboard)."""
    from yolo_cb.settings.config import ConfigError

    monkeypatch.setitem(sys.modules, "wandb", None)  # the standard way to make `import wandb` fail
    with pytest.raises(ConfigError, match=r"^wandb=True needs wandb, which is not installed: pip install 'yolo-cb\[wandb\]'"):
        YOLO("yolox-nano.yaml").train(**{**tiny, "wandb": True})
    assert not (Path(tiny["project"]) / tiny["name"] / "weights").exists()
