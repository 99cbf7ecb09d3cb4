"""Training throughput for benchmarks/gpu_check.py: our default model per lever setting, and Ultralytics' YOLO11n / YOLO26n
with the same recipe, timed by the same callbacks (both libraries fire on_train_epoch_start, on_train_batch_end and
on_train_epoch_end, and both trainers expose train_loader, batch_size and tloss).

Only the standard library at the top: the Ultralytics rows run under an interpreter that may lack yolo-cb's packages.
"""

from __future__ import annotations

import time
from pathlib import Path

ULTRALYTICS_MODELS = ("yolo11n.yaml", "yolo26n.yaml")  # built from their YAMLs: from scratch, nothing downloaded


class Throughput:
    """Train images/s (data wait included) over the batches after the first `warm` (compilation, cuDNN's autotuning);
    peak GPU memory and the last epoch's mean loss. Nothing here synchronises per batch: each epoch's end waits for the
    GPU once, and that wait is counted in its last batch."""

    def __init__(self, warm: int):
        self.warm, self.intervals, self.peak_bytes, self.loss = warm, [], 0, None
        self.index = self.size = self.batch = 0
        self.last = time.perf_counter()
        self.amp = ""

    def attach(self, add_callback) -> None:
        for event, fn in (("on_train_start", self.train_start), ("on_train_epoch_start", self.epoch_start),
                          ("on_train_batch_end", self.batch_end), ("on_train_epoch_end", self.epoch_end)):
            add_callback(event, fn)

    def train_start(self, trainer) -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        self.amp = amp_in_use(trainer)

    def epoch_start(self, trainer) -> None:
        self.index, self.size, self.batch = 0, len(trainer.train_loader.dataset), int(trainer.batch_size)
        self.last = time.perf_counter()

    def batch_end(self, trainer) -> None:
        now = time.perf_counter()
        images = max(min(self.batch, self.size - self.index * self.batch), 0)
        self.index += 1
        self.intervals.append([images, now - self.last])
        self.last = now

    def epoch_end(self, trainer) -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
            self.peak_bytes = max(self.peak_bytes, torch.cuda.max_memory_allocated())
        if self.intervals:
            self.intervals[-1][1] += time.perf_counter() - self.last
        self.loss = total_loss(getattr(trainer, "tloss", None))

    def figures(self) -> dict:
        timed = self.intervals[self.warm:] if len(self.intervals) > self.warm else self.intervals
        images, seconds = sum(i for i, _ in timed), sum(t for _, t in timed)
        return {"ips": images / seconds if seconds > 0 else None, "timed_images": images, "timed_batches": len(timed),
                "peak_mib": self.peak_bytes / 2**20 if self.peak_bytes else None, "loss": self.loss, "amp": self.amp}


def total_loss(tloss) -> float | None:
    """The epoch's mean loss summed over its terms: a tensor of terms (ours, YOLO11 in Ultralytics 8.3) or a dict of
    them (Ultralytics 8.4)."""
    if tloss is None:
        return None
    if isinstance(tloss, dict):
        return float(sum(float(v) for v in tloss.values()))
    return float(tloss.sum())


def amp_in_use(trainer) -> str:
    """What mixed precision the trainer resolved: ours bf16 where supported (else fp16 + GradScaler); Ultralytics fp16."""
    scaler = getattr(trainer, "scaler", None)
    scaled = " + GradScaler" if scaler is not None and scaler.is_enabled() else ""
    if hasattr(trainer, "use_amp"):  # yolo-cb
        return f"{str(trainer.amp_dtype).removeprefix('torch.')}{scaled}" if trainer.use_amp else "off"
    return f"fp16{scaled}" if bool(getattr(trainer, "amp", False)) else "off"


def lever_name(config: dict) -> str:
    name = f"amp={'on' if config['amp'] else 'off'} channels_last={'on' if config['channels_last'] else 'off'} " \
           f"compile={config['compile'] if config['compile'] else 'off'}"
    return name + (" cudnn.benchmark=on" if config.get("cudnn_benchmark") else "")


def cudnn_autotune(trainer) -> None:
    """on_pretrain_routine_start: cuDNN picks its fastest convolution algorithms per shape (not a setting of ours: the
    trainer restores the process's cudnn flags when the run ends)."""
    import torch

    torch.backends.cudnn.benchmark = True


def out_of_time(spec: dict, result, config: str, error_row) -> bool:
    """Whether the part's budget cannot fit another row; if so the row says it was skipped."""
    left = spec["deadline"] - time.time()
    if left >= spec["row_min_s"]:
        return False
    result.add({"config": config, "status": "skipped", "note": f"part budget spent ({left:.0f} s left, a row needs ~{spec['row_min_s']} s)"})
    return True


def train_rows(spec: dict, result, error_row) -> None:
    """One training of the default model per lever setting (spec["train_configs"]), in this process, one after another."""
    from yolo_cb import YOLO
    from yolo_cb.utils.paths import DEFAULT_MODEL

    for i, config in enumerate(spec["train_configs"]):
        name = lever_name(config)
        if out_of_time(spec, result, name, error_row):
            continue
        meter, start = Throughput(spec["warm_batches"]), time.perf_counter()
        model = YOLO(DEFAULT_MODEL)
        meter.attach(model.add_callback)
        levers = dict(config)
        if levers.pop("cudnn_benchmark", False):
            model.add_callback("on_pretrain_routine_start", cudnn_autotune)
        try:
            metrics = model.train(**spec["train_settings"], **levers, name=f"train{i}")
        except Exception as error:  # an OOM or a compile failure in one row must not stop the others
            result.add(error_row(name, error))
            continue
        best = Path(spec["out"]) / "runs" / f"train{i}" / "weights" / "best.pt"
        if i == 0 and best.is_file():
            result.checks["best_pt"] = str(best)
        result.add({"config": name, "status": "ok", **meter.figures(), "seconds": time.perf_counter() - start,
                    "map50_95": metrics.get("metrics/mAP50-95(B)"), "lib": "yolo-cb", "model": DEFAULT_MODEL})


def ultralytics_rows(spec: dict, result, error_row) -> None:
    """YOLO11n and YOLO26n from scratch with our recipe's imgsz, batch, epochs, amp, workers and cache, or why not."""
    try:
        import ultralytics
        from ultralytics import YOLO
    except ImportError as error:
        for name in ULTRALYTICS_MODELS:
            result.add({"config": name, "status": "unavailable", "note": f"ultralytics is not importable here ({error})"})
        return
    settings = spec["ultralytics_settings"]
    ultralytics_loader_rows(spec, result, error_row, ultralytics.__version__)
    for name in ULTRALYTICS_MODELS:
        config = f"{name} amp={'on' if settings['amp'] else 'off'} (ultralytics {ultralytics.__version__})"
        if out_of_time(spec, result, config, error_row):
            continue
        meter, start = Throughput(spec["warm_batches"]), time.perf_counter()
        try:
            model = YOLO(name)
            meter.attach(model.add_callback)
            model.train(**settings, name=Path(name).stem)
        except Exception as error:  # YOLO26 needs ultralytics >= 8.4; a failure of one model leaves the other
            result.add(error_row(config, error))
            continue
        result.add({"config": config, "status": "ok", **meter.figures(), "seconds": time.perf_counter() - start,
                    "lib": "ultralytics", "model": name})


def ultralytics_loader_rows(spec: dict, result, error_row, version: str) -> None:
    """Ultralytics' train loader alone with the loader part's settings (mosaic, cache=ram, batch, worker counts), timed as
    ours is (benchmarks/gpu_parts.time_loader): images/s per worker count, beside our loader's rows."""
    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_dataloader, build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    from benchmarks.gpu_parts import time_loader

    settings = spec["ultralytics_settings"]
    data = check_det_dataset(settings["data"])
    for workers in spec["loader_workers"]:
        config = f"loader workers={workers} cache=ram mosaic=1.0 batch={spec['batch']} (ultralytics {version})"
        try:
            cfg = get_cfg(overrides={**settings, "workers": workers, "mosaic": 1.0})
            dataset = build_yolo_dataset(cfg, data["train"], spec["batch"], data, mode="train")
            loader = build_dataloader(dataset, spec["batch"], workers, shuffle=True)
            images, seconds = time_loader(loader, spec["loader_batches"], files_key="im_file")
            result.add({"config": config, "status": "ok", "ips": images / seconds, "images": images, "seconds": seconds,
                        "kind": "loader", "workers": workers, "lib": "ultralytics"})
        except Exception as error:  # one worker count failing must not hide the others
            result.add(error_row(config, error))
