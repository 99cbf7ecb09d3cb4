"""DDP on CPU with gloo and 2 real processes: callbacks reach both ranks, stop reaches every rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from yolo_cb import YOLO
from yolo_cb.callbacks import rank_zero_only

pytestmark = pytest.mark.slow
TIMEOUT = 600


@pytest.fixture
def writable_small_yaml(tmp_path, shapes_small_yaml):
    """The small shapes subset in a writable folder (images linked, labels copied), so label caches are written there."""
    import yaml

    folder = tmp_path / "data"
    spec = yaml.safe_load(shapes_small_yaml.read_text())
    for split in ("train", "val"):
        for line in (Path(spec["path"]) / spec[split]).read_text().split():
            image = Path(line)
            label = image.parents[2] / "labels" / split / f"{image.stem}.txt"
            (folder / "images" / split).mkdir(parents=True, exist_ok=True)
            (folder / "labels" / split).mkdir(parents=True, exist_ok=True)
            (folder / "images" / split / image.name).symlink_to(image)
            if label.is_file():
                (folder / "labels" / split / label.name).write_text(label.read_text())
    path = folder / "data.yaml"
    path.write_text(yaml.safe_dump({**spec, "path": str(folder), "train": "images/train", "val": "images/val"}))
    return path


def test_self_launched_ddp_closures_stop_metrics_and_rank0_writes(tiny, tmp_path, writable_small_yaml):
    tiny = {**tiny, "data": str(writable_small_yaml)}  # a writable dataset: the label caches are written (by rank 0 only)
    markers = tmp_path / "markers"
    markers.mkdir()

    def record_writes(trainer):  # a closure over markers: serialised by value to each worker
        import yolo_cb.checkpoints.checkpoint as ckpt_mod
        import yolo_cb.utils.files as files_mod

        original = files_mod.atomic_write_bytes

        def spy(path, data):
            with open(markers / f"writes_rank{trainer.rank}.txt", "a") as f:
                f.write(f"{path}\n")
            return original(path, data)

        files_mod.atomic_write_bytes = spy
        ckpt_mod.atomic_write_bytes = spy
        (markers / f"rank{trainer.rank}.txt").write_text(f"world {trainer.world_size}")

    def stop_on_rank1(trainer):
        if trainer.rank == 1 and trainer.batch_i == 1:
            trainer.stop, trainer.stop_reason = True, "rank 1 said stop"

    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_pretrain_routine_start", record_writes)
    model.add_callback("on_train_batch_end", stop_on_rank1)
    model.add_callback("on_train_batch_end", rank_zero_only(lambda t: open(markers / f"rank_zero_only{t.rank}.txt", "a").write("x")),
                       name="rank_zero_closure")
    model.add_callback("on_train_batch_end", lambda t: open(markers / f"batches_rank{t.rank}.txt", "a").write(f"{t.epoch},{t.batch_i}\n"))
    model.add_callback("teardown", lambda t: (markers / f"metrics_rank{t.rank}.json").write_text(json.dumps(t.metrics, sort_keys=True)))
    metrics = model.train(**{**tiny, "epochs": 3, "nproc": 2, "device": "cpu"})

    assert (markers / "rank0.txt").read_text() == (markers / "rank1.txt").read_text() == "world 2"
    for rank in (0, 1):  # both ranks stopped after their 2nd batch of the first epoch
        assert (markers / f"batches_rank{rank}.txt").read_text().split() == ["0,0", "0,1"]
    m0, m1 = (json.loads((markers / f"metrics_rank{r}.json").read_text()) for r in (0, 1))
    assert m0 == m1 and "metrics/mAP50-95(B)" in m0
    assert metrics["metrics/mAP50-95(B)"] == m0["metrics/mAP50-95(B)"]
    assert "_weights" not in metrics  # the launcher's note of the final weights is taken out of the metrics train() returns
    assert Path(model.source).is_absolute() and Path(model.source).name == "best.pt" and Path(model.source).is_file()
    assert not (markers / "writes_rank1.txt").exists()
    written = (markers / "writes_rank0.txt").read_text()
    assert "last.pt" in written and "results.csv" in written
    # the label caches (in yolo-cb's cache folder: this data lies outside datasets_dir) are written by rank 0 only
    assert "/train.yolo_cb.cache" in written and "/val.yolo_cb.cache" in written
    record = json.loads((Path(tiny["project"]) / "exp" / "callbacks.json").read_text())  # rank 0 merged both ranks'
    rows = {(r["event"], r["name"]): r for r in record["callbacks"]}
    assert record["world_size"] == 2 and record["ranks_missing"] == []
    assert rows[("on_train_batch_end", "stop_on_rank1")]["calls_by_rank"] == {"0": 2, "1": 2}  # the user's closure, on both ranks
    assert rows[("on_pretrain_routine_start", "record_writes")]["calls_by_rank"] == {"0": 1, "1": 1}
    # rank_zero_only: the dispatcher does not call it on rank 1 (its calls there are 0), and a rank-0-only integration likewise
    assert rows[("on_train_batch_end", "rank_zero_closure")]["calls_by_rank"] == {"0": 2, "1": 0}
    assert (markers / "rank_zero_only0.txt").read_text() == "xx" and not (markers / "rank_zero_only1.txt").exists()
    rank_zero = [r for r in record["callbacks"] if r["rank"] == "rank 0" and r["origin"] != "user" and r["calls"]]
    assert rank_zero and all(r["calls_by_rank"].get("1", 0) == 0 for r in rank_zero), rank_zero


def test_torchrun_module_entry(tiny, tmp_path):
    args = [f"{k}={v}" for k, v in {**tiny, "epochs": 1, "device": "cpu", "sync_bn": True}.items()]
    from yolo_cb.training.launch import free_port

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()), "-m", "yolo_cb", "train", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (tmp_path / "runs" / "exp" / "weights" / "best.pt").is_file()
    assert not (tmp_path / "runs" / "exp-2").exists()  # rank 1 did not make a run dir of its own
    assert "sync_bn=True needs CUDA" in proc.stdout + proc.stderr  # on CPU: a clear warning, plain BatchNorm


def save_params(folder: Path):
    """An on_train_end callback that saves this rank's trained parameters to folder/params_rank<r>.pt."""

    def save(trainer):
        import torch

        model = getattr(trainer.model, "module", trainer.model)
        torch.save({n: p.detach().cpu().clone() for n, p in model.named_parameters()}, folder / f"params_rank{trainer.rank}.pt")

    return save


def test_ddp_resume_from_rank0_checkpoint_across_an_unfreeze(tiny, tmp_path):
    """freeze=2 unfreeze_epoch=1 under DDP, stopped after epoch 0 and resumed: the frozen layers are bit-identical
    through epoch 0, train in epoch 1 (the DDP wrapper rebuilt for them), and both ranks end with the same weights
    (an unfrozen tensor DDP did not all-reduce would differ between the ranks)."""
    import torch

    from yolo_cb.checkpoints.checkpoint import load_checkpoint

    frozen = ("backbone.backbone.stem.", "backbone.backbone.dark2.")
    run = {**tiny, "epochs": 2, "nproc": 2, "device": "cpu", "freeze": 2, "unfreeze_epoch": 1, "save_initial": True, "save_period": 1}
    first = YOLO("yolox-nano.yaml")
    first.add_callback("on_fit_epoch_end", lambda t: setattr(t, "stop", True))
    first.train(**run)
    weights = tmp_path / "runs" / "exp" / "weights"
    last = weights / "last.pt"

    assert load_checkpoint(last).epoch == 0
    starts = tmp_path / "starts"
    starts.mkdir()
    resumed = YOLO()
    resumed.add_callback("on_train_start", lambda t: (starts / f"rank{t.rank}").write_text(str(t.start_epoch)))
    resumed.add_callback("on_train_end", save_params(starts))
    metrics = resumed.train(resume=str(last), nproc=2, device="cpu")
    assert (starts / "rank0").read_text() == (starts / "rank1").read_text() == "1"
    assert "metrics/mAP50-95(B)" in metrics and load_checkpoint(last).epoch == 1

    initial, epoch1, end = (load_checkpoint(weights / name).model for name in ("initial.pt", "epoch1.pt", "last.pt"))
    keys = [k for k in initial if k.startswith(frozen)]
    assert keys and all(torch.equal(initial[k], epoch1[k]) for k in keys)  # bit-identical before epoch 1
    weights_after = [k for k in keys if k.endswith(".weight")]
    assert all(not torch.equal(epoch1[k], end[k]) for k in weights_after)  # trained in epoch 1
    p0, p1 = (torch.load(starts / f"params_rank{r}.pt", weights_only=True) for r in (0, 1))
    assert p0.keys() == p1.keys() and [k for k in p0 if not torch.equal(p0[k], p1[k])] == []
    assert all(torch.equal(p0[k], end[k]) for k in weights_after)  # what the ranks hold is what last.pt saved
