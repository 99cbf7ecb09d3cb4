"""The Validator: runs a model over a validation loader and returns COCO-exact metrics.

    metrics = Validator(args)(model="best.pt")          # standalone: builds the loader from args.data / args.split
    metrics = trainer.validator(trainer=trainer)        # in training: EMA model, trainer.test_loader, val losses
Events: on_val_start, on_val_batch_start, on_val_batch_end, on_val_end (callbacks get the validator).
During a batch `validator.batch` is the loader's batch and `validator.preds` its post-processed detections
([x1, y1, x2, y2, score, cls] in letterboxed-input pixels), matched in original-image pixels. classes= keeps the predictions
and labels of those classes only (as Ultralytics' val(classes=...)); save_txt=True: evaluation/val_txt.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from yolo_cb.callbacks import Callbacks
from yolo_cb.data.dataset import YOLODataset
from yolo_cb.data.dataset_yaml import resolve_datasets_dir
from yolo_cb.data.loading.loader import build_dataloader, build_yolo_dataset, close_loaders
from yolo_cb.data.resolve import check_data, missing_split_error, single_class
from yolo_cb.data.transforms import LetterBox
from yolo_cb.errors import ConfigError
from yolo_cb.evaluation import coco_json, per_class, val_txt
from yolo_cb.evaluation.val_metrics import DetectionMetrics, ImageStats, metrics_so_far
from yolo_cb.metrics import RECALL_THRESHOLDS, ConfusionMatrix, DetMetrics, coco_summary_keys, cxcywh2xyxy, xyxy2xywh
from yolo_cb.nn.postprocess import postprocess, scale_boxes
from yolo_cb.prediction.backend import load_backend
from yolo_cb.prediction.predictor import tta_predictions
from yolo_cb.recipe.stop import refuse_foreign_stop_flag
from yolo_cb.settings.config import Config, get_config
from yolo_cb.utils import plotting
from yolo_cb.utils.device import restore_train_flags, synchronize, train_flags
from yolo_cb.utils.draw import plot_batch, targets_to_boxes
from yolo_cb.utils.files import run_dir
from yolo_cb.utils.log import LOGGER, printable

VAL_CONF = 0.001  # default confidence threshold for validation (low, so the PR curve reaches high recall)
VAL_MULTI_LABEL = True  # a box is a candidate under every class it scores above conf (Ultralytics' and YOLOv5's val)
SCORE_DECIMALS = 5  # scores are rounded like in predictions.json, so COCOeval on the json sees the same ranking
MAX_CONFUSION_CLASSES = 1000  # past this the (nc+1)^2 confusion matrix (8 MB at 1000; 74.5 GiB at 100000) is not kept


class Validator:
    """Validation over a loader; see the module docstring. Results: metrics, per_class, speed, stats."""

    def __init__(self, args=None, save_dir=None, callbacks: Callbacks | None = None, dataloader=None):
        self.args = args if isinstance(args, Config) else get_config(dict(args or {}))
        self.save_dir = Path(save_dir) if save_dir else None
        self.callbacks = callbacks if callbacks is not None else Callbacks()
        self.dataloader = dataloader
        self.plot = False  # the trainer sets it for the final validation (plots, json) of best.pt
        self.trainer = None  # the trainer when validating during training (set by it): validator callbacks reach its state
        self.set_name: str | None = None  # the validation set after the first being validated (evaluation/val_sets.py); None: the first
        self.training = False
        self.device = torch.device("cpu")
        self.model = None
        self.data: dict | None = None
        self.names: dict[int, str] = {}
        self.nc = 0
        self.metrics: DetectionMetrics = DetectionMetrics({})  # a dict of the metric keys with Ultralytics' attributes
        self.plots: dict[Path, dict] = {}  # plot file -> {"data": None, "timestamp": time}, as Ultralytics' validator.plots
        self.per_class: list[dict] = []
        self.speed: dict[str, float] = {}
        self.stats: ImageStats = ImageStats(0)  # per image validated so far (evaluation/val_metrics.py; Ultralytics' keys too)
        self.batch = None
        self.preds = None
        self.batch_i = 0
        self.seen = 0
        self.det_metrics: DetMetrics | None = None
        self.confusion_matrix: ConfusionMatrix | None = None
        self.fitness = 0.0
        self.coco_stats: list[float] | None = None
        self.coco_metrics: dict[str, float] = {}
        self.jdict: list[dict] = []
        self._modes: dict = {}
        self._grad_ctx = torch.inference_mode

    def __setattr__(self, name: str, value) -> None:
        refuse_foreign_stop_flag(name, "validator")  # SuperGradients' / Keras' context.stop_training would do nothing
        super().__setattr__(name, value)

    @property
    def epoch(self) -> int | None:
        """The 0-based epoch being validated during training (None outside training)."""
        return None if self.trainer is None else self.trainer.epoch

    def run_callbacks(self, event: str) -> None:
        self.callbacks.run(event, self)

    def add_callback(self, event: str, fn, on_error: str = "raise") -> None:
        """Register `fn(validator)` on `event` (Ultralytics' validator.add_callback)."""
        self.callbacks.add_callback(event, fn, on_error=on_error)

    # --- setup ------------------------------------------------------------------------------
    def _setup_training(self, model, live: bool, loader, data: dict, save_dir) -> torch.nn.Module:
        """`model` (the EMA's, else the live training model), unwrapped from DDP, put in eval; the training's loader, data
        and run dir."""
        model = model.module if hasattr(model, "module") else model
        self.training = True
        # The live training model is validated under no_grad, not inference_mode: tensors a module caches during an
        # inference-mode forward (e.g. anchor grids) could not be saved for backward in the next training step.
        self._grad_ctx = torch.no_grad if live else torch.inference_mode
        self.device = next(model.parameters()).device  # the training's device: the model lives there
        self.dataloader = loader or self.dataloader
        self.data = data
        self.names = {int(k): str(v) for k, v in data["names"].items()}
        self.save_dir = Path(save_dir) if save_dir else self.save_dir
        self._modes = train_flags(model)
        model.eval()
        return model

    def _setup_standalone(self, model):
        """A Backend for `model` (or args.model); the loader from args.data unless one was given; the run dir."""
        from torch import nn

        args = self.args
        self.training = False
        self._grad_ctx = torch.inference_mode
        model = model if model is not None else args.model
        if model is None or model == "":
            raise ValueError("Validator needs a model: pass model=... (a .pt / .onnx / .torchscript file or an nn.Module)")
        if isinstance(model, nn.Module):
            self._modes = train_flags(model)
            model.eval()
        backend = load_backend(model, device=args.device, fp16=bool(args.half), trust=bool(args.trust), imgsz=args.imgsz)
        self.device = backend.device
        model_name = backend.path or (type(model).__name__ if isinstance(model, nn.Module) else str(model))
        if self.dataloader is None:
            self.dataloader = self._build_loader(backend)
            data_nc, data_file = self.data["nc"], self.data["yaml_file"]
        else:
            dataset = self.dataloader.dataset
            self.names = {int(k): str(v) for k, v in dict(getattr(dataset, "names", None) or backend.names).items()}
            data_nc, data_file = len(self.names), "the given dataloader"
        if backend.nc != data_nc and not args.single_cls:  # single_cls: every predicted class counts as 'item', as Ultralytics
            raise ConfigError(f"class count mismatch: the model {model_name} predicts {backend.nc} classes but the dataset {data_file} "
                             f"has {data_nc} (nc={data_nc}); validate with the dataset the model was trained on")
        if self.save_dir is None:
            self.save_dir = run_dir(args, "val")
        return backend

    def _build_loader(self, backend):
        args = self.args
        if not args.data:
            raise ValueError("Validator needs a dataset: pass data=... (a dataset YAML)")
        self.data = check_data(args.data, args.datasets_dir)
        label_names = self.data["names"]  # single_cls: labels are checked against the YAML's classes, then made 'item'
        self.data = single_class(self.data) if args.single_cls else self.data
        split, yaml_file = args.split or "val", self.data["yaml_file"]
        self.names = {int(k): str(v) for k, v in self.data["names"].items()}
        paths = self.data.get(split)
        if not paths:
            raise missing_split_error(yaml_file, split)
        sets = list(self.data.get("val_sets") or ())
        if split == "val" and len(sets) > 1:
            LOGGER.info(f"{yaml_file} has {len(sets)} validation sets ({', '.join(sets)}): validating the first, '{sets[0]}' "
                        f"(training validates each)")
        batch = backend.batch or args.batch
        try:
            if backend.imgsz:  # a static export: square (non-rect) letterbox at its fixed size, its fixed batch
                h, w = backend.imgsz
                dataset = YOLODataset(paths, imgsz=max(h, w), names=label_names, augment=False, hyp=args, rect=False,
                                      batch_size=batch, stride=backend.stride, cache=args.cache, prefix=f"{split}: ",
                                      datasets_dir=resolve_datasets_dir(args.datasets_dir))
                if h != w:
                    dataset.transforms = [LetterBox((h, w), scaleup=False)]
            else:
                dataset = build_yolo_dataset(args, paths, mode="val", names=label_names, stride=backend.stride, batch=batch)
        except FileNotFoundError as error:
            raise FileNotFoundError(f"dataset {yaml_file}: split '{split}' has no usable images ({error})") from error
        if len(dataset) == 0:
            shown = ", ".join(map(str, paths)) if isinstance(paths, (list, tuple)) else str(paths)
            raise FileNotFoundError(f"dataset {yaml_file}: split '{split}' ({shown}) is empty")
        return build_dataloader(dataset, batch, args.workers, shuffle=False, rank=-1)

    # --- the run ----------------------------------------------------------------------------
    def __call__(self, trainer=None, model=None, dataloader=None) -> DetectionMetrics:
        """Validate `trainer`'s model (with val losses) or `model` (path / Module / Backend); returns the metrics (a dict of the
        metric keys with Ultralytics' attributes: box.map, results_dict, speed, ...; see yolo_cb.evaluation.val_metrics).
        `dataloader`: validate on it instead of trainer.test_loader (another validation set)."""
        self._modes: dict = {}  # submodule -> training flag, restored afterwards
        own_loader = trainer is None and self.dataloader is None and dataloader is None  # built here: its workers end with this call
        try:
            if trainer is not None:  # during training: validator callbacks reach its state through validator.trainer
                self.trainer, ema = trainer, getattr(trainer, "ema", None)
                model = self._setup_training(ema.ema if ema else trainer.model, ema is None, dataloader or getattr(trainer, "test_loader", None),
                                             trainer.data, getattr(trainer, "save_dir", None))
            else:
                model = self._setup_standalone(model)
            self.model = model
            n_batches, loss_sums, times = self._run(model)
        finally:
            restore_train_flags(self._modes)
            if own_loader:
                close_loaders(self.dataloader)
        self.speed = {k: 1000 * v / max(self.seen, 1) for k, v in times.items()}
        self.finalize()
        if self.training:
            self.metrics.update({f"val/{k}_loss": v / max(n_batches, 1) for k, v in loss_sums.items()})
        self.print_results()
        self.save_outputs()
        self.run_callbacks("on_val_end")
        return self.metrics

    def _run(self, model) -> tuple[int, dict, dict]:
        """The batch loop: preprocess, forward (+ loss in trainer mode), NMS, matching; fires the batch events."""
        self.nc = len(self.names)
        args = self.args
        self.conf = VAL_CONF if args.conf is None else float(args.conf)
        self.end2end = getattr(model, "end2end", None)  # an export with NMS in its graph: its iou and max_det
        self.stats, self.jdict, self.coco_stats, self.seen = ImageStats(self.nc), [], None, 0
        self.metrics = DetectionMetrics({}, names=self.names, stats=self.stats)  # this validation's, filled at its end
        self.confusion_matrix = ConfusionMatrix(self.nc, names=self.names) if self.nc <= MAX_CONFUSION_CLASSES else None
        if self.confusion_matrix is None and not self.training:
            LOGGER.info(f"no confusion matrix: {self.nc} classes (it is kept for at most {MAX_CONFUSION_CLASSES}; (nc+1)^2 counts)")
        self.det_metrics = DetMetrics(self.nc, self.names)
        loss_sums = dict.fromkeys(getattr(getattr(model, "criterion", None), "loss_names", ()), 0.0)  # val/<name>_loss in trainer mode
        times = dict.fromkeys(("preprocess", "inference", "postprocess"), 0.0)
        n_batches = 0
        self.run_callbacks("on_val_start")
        with self._grad_ctx():
            for batch_i, batch in enumerate(self.dataloader):
                self.batch_i, self.batch = batch_i, batch
                self.run_callbacks("on_val_batch_start")
                t0 = time.perf_counter()
                img = batch["img"].to(self.device, non_blocking=True).float() / 255
                synchronize(self.device)
                t1 = time.perf_counter()
                if self.training:
                    preds, losses = self._forward_with_loss(model, img, batch["targets"].to(self.device))
                    for key in loss_sums:
                        value = losses.get(key, 0.0)
                        loss_sums[key] += float(value.detach().float().mean()) if isinstance(value, torch.Tensor) else float(value)
                else:  # augment=True (standalone only, as Ultralytics' val): test-time augmentation, prediction/predictor.py
                    preds = tta_predictions(model, img) if args.augment else self._infer(model, img)
                synchronize(self.device)
                t2 = time.perf_counter()
                self.preds = self.postprocess(preds)
                self.update_metrics(self.preds, batch)
                t3 = time.perf_counter()
                times["preprocess"] += t1 - t0
                times["inference"] += t2 - t1
                times["postprocess"] += t3 - t2
                n_batches += 1
                self.run_callbacks("on_val_batch_end")
        return n_batches, loss_sums, times

    def _forward_with_loss(self, model, img: torch.Tensor, targets: torch.Tensor):
        """Eval-mode model(img, targets) -> (preds, loss_dict); a model returning only the loss dict is run twice."""
        out = model(img, targets)
        if isinstance(out, (tuple, list)) and len(out) == 2 and isinstance(out[1], dict):
            return out
        if isinstance(out, dict):
            return model(img), out
        raise TypeError(f"model(img, targets) in eval mode must return (preds, loss_dict), got {type(out).__name__}")

    def _infer(self, backend, img: torch.Tensor) -> torch.Tensor:
        """Backend forward; a fixed-batch export gets chunks of its batch, the last one zero-padded."""
        fixed = getattr(backend, "batch", None)
        if not fixed or img.shape[0] == fixed:
            return backend(img)
        outs = []
        for chunk in img.split(fixed):
            n = chunk.shape[0]
            if n < fixed:
                chunk = torch.cat((chunk, chunk.new_zeros((fixed - n, *chunk.shape[1:]))))
            outs.append(backend(chunk)[:n])
        return torch.cat(outs)

    def postprocess(self, preds: torch.Tensor, conf: float | None = None) -> list[torch.Tensor]:
        if isinstance(preds, (tuple, list)):
            preds = preds[0]
        return postprocess(preds, conf=self.conf if conf is None else conf, iou=self.args.iou, max_det=self.args.max_det, agnostic=bool(self.args.agnostic_nms),
                           classes=self.args.classes, end2end=getattr(self, "end2end", None), multi_label=VAL_MULTI_LABEL,
                           single_cls=bool(self.args.single_cls))

    def update_metrics(self, preds: list[torch.Tensor], batch: dict) -> None:
        """Map detections and labels of a batch back to original pixels; store them; update the confusion matrix."""

        targets = batch["targets"]
        for i, pred in enumerate(preds):
            self.seen += 1
            labels = targets[targets[:, 0] == i]
            if self.args.classes is not None:  # classes=: only those classes are evaluated (their predictions and labels)
                labels = labels[torch.isin(labels[:, 1].long(), torch.as_tensor(self.args.classes, device=labels.device))]
            ori_shape, ratio_pad = batch["ori_shapes"][i], batch["ratio_pad"][i]
            gt_xyxy = scale_boxes(cxcywh2xyxy(labels[:, 2:6].float().cpu()), ratio_pad, ori_shape)
            gt_cls = labels[:, 1].long().cpu()
            pred = pred.detach().float().cpu()
            pred_xyxy = scale_boxes(pred[:, :4], ratio_pad, ori_shape)
            if self.confusion_matrix is not None:
                self.confusion_matrix.process_batch(torch.cat((pred_xyxy, pred[:, 4:6]), 1), gt_xyxy, gt_cls)
            self.stats.append({  # (ImageStats adds each detection's matches, "tp")
                "im_file": batch["im_files"][i],
                "ori_shape": tuple(int(v) for v in ori_shape),
                "pred_boxes": xyxy2xywh(pred_xyxy),  # COCO xywh, original pixels, float64
                "pred_scores": np.round(pred[:, 4].double().numpy(), SCORE_DECIMALS),
                "pred_cls": pred[:, 5].long().numpy(),
                "gt_boxes": xyxy2xywh(gt_xyxy),
                "gt_cls": gt_cls.numpy(),
            })

    def get_stats(self) -> dict[str, float]:
        """Ultralytics' get_stats(): the metric keys and fitness over the images validated so far (from a batch callback)."""
        return metrics_so_far(self.stats, self.names).results_dict

    def finalize(self) -> None:
        """Image ids, COCO-exact AP, P/R, per-class rows and the metrics dict."""
        stems = [Path(s["im_file"]).stem for s in self.stats]
        numeric = all(stem.isnumeric() for stem in stems)
        for s, stem in zip(self.stats, stems, strict=True):
            s["image_id"] = int(stem) if numeric else stem
        if len(set(s["image_id"] for s in self.stats)) < len(self.stats):
            LOGGER.warning("WARNING some validation images share a file name stem; their COCO image_id collide in predictions.json")
        for s in self.stats:
            self.det_metrics.update(s["pred_boxes"], s["pred_scores"], s["pred_cls"], s["gt_boxes"], s["gt_cls"], key=s["image_id"])
        m = self.det_metrics.compute()
        self.metrics = DetectionMetrics(m.results_dict, det=m, speed=self.speed, names=self.names, confusion_matrix=self.confusion_matrix,
                                        stats=self.stats)
        self.metrics.save_dir = self.save_dir
        self.per_class = m.per_class
        self.fitness = m.fitness
        if self.training and per_class.wanted(self.args.per_class, self.nc):  # trainer.metrics; val() keeps Ultralytics' keys
            self.metrics.update(per_class.metric_keys(self.per_class))  # per_class/<name>/<metric>: evaluation/per_class.py

    # --- reporting ------------------------------------------------------------------------------
    def print_results(self) -> None:
        m = self.det_metrics
        head = ("%22s" + "%11s" * 6) % ("Class", "Images", "Instances", "P", "R", "mAP50", "mAP50-95")
        row = "%22s" + "%11i" * 2 + "%11.3g" * 4
        lines = [head, row % ("all", self.seen, int(m.nt.sum()), m.mp, m.mr, m.map50, m.map)]
        if m.nt.sum() == 0:
            LOGGER.warning(f"WARNING no labels found in the validation set ({self.seen} images): metrics are 0")
        if self.nc > 1 and (not self.training or self.plot or self.args.verbose):
            for r in self.per_class:  # a name is printed escaped (a data YAML's "\x1b[2J" would clear the screen), kept as it is
                lines.append(row % (printable(r["name"])[:22], r["images"], r["instances"], r["precision"], r["recall"], r["mAP50"], r["mAP50-95"]))
        LOGGER.info("\n".join(lines))
        s = self.speed
        LOGGER.info(f"Speed: {s.get('preprocess', 0):.1f}ms preprocess, {s.get('inference', 0):.1f}ms inference, "
                    f"{s.get('postprocess', 0):.1f}ms postprocess per image")

    def save_outputs(self) -> None:
        final = not self.training or self.plot
        if self.save_dir is not None and self.args.save and (self.training or self.trainer is None):  # not best.pt's final check
            per_class.write(self.save_dir, self.per_class, getattr(self.trainer, "epoch", 0) + 1 if self.training else None, self.set_name)
        if self.args.plots and final and self.save_dir is not None:
            try:
                self.plots.update({Path(f): {"data": None, "timestamp": time.time()} for f in self.plot_metrics() if f})
            except Exception as error:  # a plot must never cost the metrics
                LOGGER.warning(f"WARNING validation plots failed: {type(error).__name__}: {error}")
        if self.args.save_json and final and self.save_dir is not None:
            self.save_json()
            self.eval_json()
        if self.args.save_txt and final and self.save_dir is not None:  # labels/<stem>.txt, as Ultralytics
            val_txt.write(self.stats, Path(self.save_dir) / "labels", bool(self.args.save_conf))
        if not self.training and self.save_dir is not None:
            LOGGER.info(f"Results saved to {self.save_dir}")

    def plot_metrics(self) -> list[Path]:
        m, d = self.det_metrics, Path(self.save_dir)
        valid = m.classes_with_gt
        names = [self.names.get(int(c), str(c)) for c in valid]
        matrix = [] if self.confusion_matrix is None else [
            plotting.plot_confusion_matrix(self.confusion_matrix.matrix, self.names, d / "confusion_matrix.png", normalize=False),
            plotting.plot_confusion_matrix(self.confusion_matrix.matrix, self.names, d / "confusion_matrix_normalized.png", normalize=True)]
        files = [*matrix,
                 plotting.plot_pr_curve(RECALL_THRESHOLDS, m.pr_curves[valid], m.ap[valid, 0], names, d / "PR_curve.png"),
                 plotting.plot_mc_curve(m.px, m.f1_curve[valid], names, d / "F1_curve.png", ylabel="F1"),
                 plotting.plot_mc_curve(m.px, m.p_curve[valid], names, d / "P_curve.png", ylabel="Precision"),
                 plotting.plot_mc_curve(m.px, m.r_curve[valid], names, d / "R_curve.png", ylabel="Recall")]
        return files

    def plot_val_samples(self, batch: dict, ni: int) -> Path:
        """Ultralytics' name: the batch's images with their labels, into <save_dir>/val_batch{ni}_labels.jpg (the loop never
        calls it: call it from an on_val_batch_end callback, e.g. with validator.batch, validator.batch_i)."""
        path = Path(self.save_dir or ".") / f"val_batch{ni}_labels.jpg"
        plot_batch(batch["img"], targets_to_boxes(batch["targets"], len(batch["img"])), self.names, path)
        return path

    def plot_predictions(self, batch: dict, preds: list, ni: int, conf: float = 0.25) -> Path:
        """Ultralytics' name: the batch's images with `preds` (validator.preds: per image [x1, y1, x2, y2, conf, cls]) of
        confidence >= conf, into <save_dir>/val_batch{ni}_pred.jpg."""
        path = Path(self.save_dir or ".") / f"val_batch{ni}_pred.jpg"
        plot_batch(batch["img"], [p[p[:, 4] >= conf].detach().float().cpu() for p in preds], self.names, path, scores=True)
        return path

    def save_json(self) -> tuple[Path, Path]:
        """predictions.json (COCO results) and ground_truth.json (COCO dataset built from the YOLO labels)."""
        self.jdict, pred_file, gt_file = coco_json.write(self.stats, self.names, (self.data or {}).get("category_ids"), Path(self.save_dir))
        return pred_file, gt_file

    def eval_json(self) -> list[float] | None:
        """COCOeval on the saved json files when pycocotools is installed (a dev/test extra); logs its summary."""
        self.coco_stats = coco_json.evaluate(Path(self.save_dir), self.jdict)
        if self.coco_stats is not None:
            self.coco_metrics = dict(zip(coco_summary_keys(), self.coco_stats, strict=True))
        return self.coco_stats
