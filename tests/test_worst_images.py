"""worst_batches=k: after each validation in training, the k validation images with the lowest per-image AP, and
(worst_source=train | both) after each epoch the k training batches of highest loss, are drawn (labels | predictions)
and handed to the loggers; the chosen images and batches really are the worst."""

from __future__ import annotations

import copy
from pathlib import Path

import cv2
import pytest
import torch
from conftest import TINY

from yolo_cb import YOLO
from yolo_cb.metrics import DetMetrics
from yolo_cb.recipe.ema import unwrap

pytestmark = pytest.mark.slow
K = 3


def ap_of(stat: dict, nc: int) -> float:
    m = DetMetrics(nc)
    m.update(stat["pred_boxes"], stat["pred_scores"], stat["pred_cls"], stat["gt_boxes"], stat["gt_cls"], key=stat["im_file"])
    return float(m.compute().map)


def worst_callback(model):
    return next(e.owner for e in model.trainer.callbacks.entries("on_val_end") if type(e.owner).__name__ == "WorstImages")


@pytest.fixture(scope="module")
def run(tmp_path_factory, shapes_small_yaml):
    root = tmp_path_factory.mktemp("worst")
    seen = {"batches": {}}

    def record_batch(trainer):
        """Every training batch's loss computed here again, by a copy of the model in the same state (train mode, so
        the same batch statistics), and its images: apart from the callback's own value and ranking."""
        images, targets = trainer.batch["img"].clone(), trainer.batch["targets"].clone()
        with torch.no_grad(), torch.autocast(trainer.device.type, dtype=trainer.amp_dtype, enabled=trainer.use_amp):  # as the step
            loss = float(copy.deepcopy(unwrap(trainer.model))(images.float() / 255, targets)["total"])
        seen["batches"][(trainer.epoch, trainer.batch_i)] = (loss, images)
        seen.setdefault("trainer_loss", {})[(trainer.epoch, trainer.batch_i)] = trainer.loss.item()

    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_val_end", lambda v: v.training and seen.update(stats=list(v.stats), nc=v.nc))
    model.add_callback("on_train_batch_loss_end", record_batch)
    model.add_callback("on_fit_epoch_end", lambda t: seen.update(images=list(t.new_images)))
    model.train(**{**TINY, "epochs": 2, "worst_batches": K, "worst_source": "both", "data": str(shapes_small_yaml),
                   "project": str(root), "name": "exp"})
    return root / "exp", seen, model


def test_the_chosen_images_are_the_worst(run):
    folder, seen, model = run
    scores = sorted((ap_of(s, seen["nc"]), s["im_file"]) for s in seen["stats"] if len(s["gt_cls"]))
    callback = worst_callback(model)
    chosen = callback.worst
    assert len(chosen) == K
    assert [ap for _, ap in chosen] == pytest.approx([ap for ap, _ in scores[:K]])  # the K lowest per-image APs
    assert max(ap for _, ap in chosen) <= min(ap for ap, f in scores if f not in {c for c, _ in chosen})


def test_the_chosen_train_batches_have_the_highest_losses(run):
    folder, seen, model = run
    losses = {i: loss for (epoch, i), (loss, _) in seen["batches"].items() if epoch == 1}
    assert len(losses) == 4  # 32 images, batch 8
    assert [losses[i] for i in range(4)] == pytest.approx([seen["trainer_loss"][(1, i)] for i in range(4)], rel=1e-4)
    assert len(set(losses.values())) == 4  # no ties: the ranking is the losses' own
    chosen = worst_callback(model).worst_train
    assert [(e, i) for e, i, _ in chosen] == [(1, i) for i in sorted(losses, key=losses.get, reverse=True)[:K]]
    assert [loss for _, _, loss in chosen] == pytest.approx([losses[i] for _, i, _ in chosen], rel=1e-4)


def test_the_train_batches_are_drawn_and_reach_the_loggers(run):
    from yolo_cb.utils.draw import plot_batch

    folder, seen, model = run
    for rank, (epoch, i, _) in enumerate(worst_callback(model).worst_train):
        path = folder / "worst" / f"epoch{epoch + 1}_train{rank}_batch{i}.jpg"
        assert path in set(map(Path, seen["images"]))
        grid = plot_batch(seen["batches"][(epoch, i)][1], [], {})  # the grid of that very batch's images
        assert cv2.imread(str(path)).shape == (grid.shape[0], 2 * grid.shape[1], 3)


def test_they_are_drawn_side_by_side_and_reach_the_loggers(run):
    folder, seen, model = run
    files = sorted((folder / "worst").glob("epoch2_[0-9]*.jpg"))
    assert len(files) == K and set(files) <= set(map(Path, seen["images"]))
    callback = worst_callback(model)
    for (im_file, _), path in zip(callback.worst, sorted(files, key=lambda p: int(p.name.split("_")[1])), strict=True):
        original, drawn = cv2.imread(im_file), cv2.imread(str(path))
        assert Path(im_file).stem in path.name and drawn.shape == (original.shape[0], 2 * original.shape[1], 3)


def test_the_ranking_on_known_answers(run):
    """The run's real validation records, with predictions replaced: perfect (the labels) for all images but three, which
    keep one label of their labels as their only prediction (AP < 1), none at all (AP 0), or a wrong class (AP 0)."""
    import numpy as np

    from yolo_cb.evaluation.val_metrics import ImageStats
    from yolo_cb.integrations.worst_images import worst

    _, seen, _ = run
    stats = [dict(s) for s in seen["stats"] if len(s["gt_cls"]) >= 2]
    assert len(stats) >= 6
    for s in stats:
        s["pred_boxes"], s["pred_scores"], s["pred_cls"] = s["gt_boxes"].copy(), np.full(len(s["gt_cls"]), 0.9), s["gt_cls"].copy()
    partial, empty, wrong = stats[1], stats[3], stats[4]
    partial.update(pred_boxes=partial["gt_boxes"][:1], pred_scores=np.array([0.9]), pred_cls=partial["gt_cls"][:1])
    empty.update(pred_boxes=np.zeros((0, 4)), pred_scores=np.zeros(0), pred_cls=np.zeros(0, dtype=int))
    wrong.update(pred_cls=(wrong["gt_cls"] + 1) % seen["nc"])
    records = ImageStats(seen["nc"])  # as validator.stats holds them
    for s in stats:
        records.append(s)
    chosen = worst(records, K)
    assert {s["im_file"] for s, _ in chosen} == {partial["im_file"], empty["im_file"], wrong["im_file"]}
    assert chosen[-1][0] is partial and 0 < chosen[-1][1] < 1 and chosen[0][1] == 0
