"""Guards of the loop: non-finite losses, the time limit, top-k checkpoints, fp32 final weights without optimizer."""

from __future__ import annotations

import pytest
import torch

from yolo_cb import YOLO
from yolo_cb.checkpoints.checkpoint import load_checkpoint
from yolo_cb.errors import ConfigError
from yolo_cb.training.trainer import NonFiniteLossError

pytestmark = pytest.mark.slow


def poison(batches: set[int]):
    """A callback that makes the loss NaN on the given global batch numbers."""

    def fn(trainer):
        if trainer.epoch * trainer.num_batches + trainer.batch_i in batches:
            trainer.loss = trainer.loss * float("nan")

    return fn


def test_a_few_nonfinite_losses_are_skipped_with_a_warning(tiny, caplog):
    model = YOLO("yolox-nano.yaml").add_callback("on_train_batch_loss_end", poison({1, 2}))
    metrics = model.train(**{**tiny, "epochs": 2, "save_topk": 1})
    assert "metrics/mAP50-95(B)" in metrics
    assert sum("non-finite loss" in r.getMessage() for r in caplog.records) == 2
    final = load_checkpoint(model.trainer.wdir / "last.pt")
    assert final.optimizer is None  # a finished run drops the optimizer
    assert all(v.dtype == torch.float32 for v in final.model.values() if v.is_floating_point())
    assert all(torch.isfinite(v).all() for v in final.model.values() if v.is_floating_point())
    assert len(list(model.trainer.wdir.glob("best_epoch*.pt"))) == 1  # save_topk=1 keeps one


def test_too_many_nonfinite_losses_in_a_row_fail_after_saving_last(tiny):
    seen = []
    model = YOLO("yolox-nano.yaml").add_callback("on_train_batch_loss_end", poison(set(range(100))))
    model.add_callback("on_exception", lambda t: seen.append(type(t.exception).__name__))
    with pytest.raises(NonFiniteLossError, match="NaN/inf for 5 batches in a row"):
        model.train(**{**tiny, "epochs": 3, "batch": 4})
    assert seen == ["NonFiniteLossError"]
    assert (model.trainer.wdir / "last.pt").is_file()


def test_time_limit_stops_cleanly(tiny):
    model = YOLO("yolox-nano.yaml")
    metrics = model.train(**{**tiny, "epochs": 50, "time": 1e-6})
    assert model.trainer.epoch == 0 and model.trainer.batch_i == 0
    assert "time limit" in model.trainer.stop_reason and "metrics/mAP50-95(B)" in metrics


def test_fine_tune_from_checkpoint_transfers_matching_weights(tiny, coco8_yaml, caplog):
    first = YOLO("yolox-nano.yaml")
    first.train(**tiny)
    best = first.trainer.wdir / "best.pt"
    tuned = YOLO(str(best))  # 4 classes -> coco8's 80: every tensor but the class head transfers
    settings = {k: v for k, v in tiny.items() if k != "model"}
    with pytest.raises(ConfigError, match="names another"):  # two different models named: refused, not one silently dropped
        tuned.train(**{**tiny, "data": str(coco8_yaml), "name": "tuned"})
    tuned.train(**{**settings, "data": str(coco8_yaml), "name": "tuned"})
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("transferred"))
    moved, total = map(int, line.split()[1].split("/"))
    assert 0.9 * total < moved < total
    assert load_checkpoint(tuned.trainer.wdir / "last.pt").names[79] == "toothbrush"


def test_val_of_a_model_config_asks_for_weights():
    with pytest.raises(FileNotFoundError, match="needs trained weights"):
        YOLO("yolox-nano.yaml").val(data="shapes.yaml")


def test_no_loader_worker_outlives_train_or_val(tiny):
    """Persistent loader workers end with train() and val(): none is left for garbage collection to reap later, which
    took ~20 s (5 s per worker's join) in whichever later test happened to collect them."""
    import multiprocessing

    model = YOLO("yolox-nano.yaml")
    model.train(**{**tiny, "workers": 2})
    assert multiprocessing.active_children() == []
    model.val(data=tiny["data"], imgsz=64, batch=8, workers=2, plots=False, project=tiny["project"], name="val")
    assert multiprocessing.active_children() == []
