"""Training throughput for benchmarks/gpu_check.py, over whole epochs: our default model (and, with --full-grid, each
lever setting), and Ultralytics' YOLO11n / YOLO26n with the same settings, timed by the same callbacks (both libraries
fire on_train_epoch_start, on_train_batch_end, on_train_epoch_end and on_fit_epoch_end in that order, and both
trainers expose train_loader, batch_size and tloss).

Only the standard library at the top: the Ultralytics rows run under an interpreter that may lack yolo-cb's packages.
"""

from __future__ import annotations

import time
from pathlib import Path

ULTRALYTICS_MODELS = ("yolo11n.yaml", "yolo26n.yaml")  # built from their YAMLs: from scratch, nothing downloaded


class EpochClock:
    """Whole epochs as a user feels them: each runs from on_train_epoch_start to on_fit_epoch_end (the epoch's batches,
    its boundary, validation and checkpoints; both libraries fire these events in that order). Within an epoch,
    `first_batch_s` runs to the first on_train_batch_end (the wait for the first batch and its step) and `batches_s`
    from there to on_train_epoch_end; `gap_s` is the time between one epoch's on_fit_epoch_end and the next one's
    start (outside every epoch: only `span_s` has it). Nothing synchronises per batch: the GPU is waited for once at
    on_train_epoch_end and once at on_fit_epoch_end. Also peak GPU memory, the last epoch's mean loss, the amp used."""

    def __init__(self):
        self.epochs, self.current, self.peak_bytes, self.loss, self.amp = [], None, 0, None, ""

    def attach(self, add_callback) -> None:
        for event, fn in (("on_train_start", self.train_start), ("on_train_epoch_start", self.epoch_start),
                          ("on_train_batch_end", self.batch_end), ("on_train_epoch_end", self.epoch_end),
                          ("on_fit_epoch_end", self.fit_end)):
            add_callback(event, fn)

    def train_start(self, trainer) -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        self.amp = amp_in_use(trainer)

    def epoch_start(self, trainer) -> None:
        self.current = {"start": time.perf_counter(), "batches": 0, "first": None, "size": len(trainer.train_loader.dataset),
                        "batch": int(trainer.batch_size)}

    def batch_end(self, trainer) -> None:
        self.current["batches"] += 1
        if self.current["first"] is None:
            self.current["first"] = time.perf_counter()

    def epoch_end(self, trainer) -> None:
        self.current["train_end"] = synced_now()
        self.loss = total_loss(getattr(trainer, "tloss", None))

    def fit_end(self, trainer) -> None:
        """Ends the epoch on_train_epoch_start began; a second call without a new epoch (Ultralytics fires
        on_fit_epoch_end again when it validates best.pt after the last epoch) is not an epoch."""
        import torch

        c, now, self.current = self.current, synced_now(), None
        if c is None or "train_end" not in c:
            return
        if torch.cuda.is_available():
            self.peak_bytes = max(self.peak_bytes, torch.cuda.max_memory_allocated())
        images = min(c["batches"] * c["batch"], c["size"])
        first = c["first"] if c["first"] is not None else c["train_end"]
        self.epochs.append({"start": c["start"], "end": now, "images": images, "batches": c["batches"], "first_batch_images": min(c["batch"], images),
                            "epoch_s": now - c["start"], "train_s": c["train_end"] - c["start"], "first_batch_s": first - c["start"],
                            "batches_s": c["train_end"] - first, "val_s": now - c["train_end"]})

    def figures(self) -> dict:
        """Images/s over whole epochs (`ips`), over the epochs after the first (`ips_after_first`: no cold start) and over
        the batches after each epoch's first (`steady_ips`: no boundary, no validation: the first GPU check's kind)."""
        e = self.epochs
        images, seconds = sum(x["images"] for x in e), sum(x["epoch_s"] for x in e)
        later, later_s = sum(x["images"] - x["first_batch_images"] for x in e), sum(x["batches_s"] for x in e)
        rest, rest_s = sum(x["images"] for x in e[1:]), sum(x["epoch_s"] for x in e[1:])
        gaps = [b["start"] - a["end"] for a, b in zip(e[:-1], e[1:], strict=True)]
        epochs = [{k: v for k, v in x.items() if k not in ("start", "end")} for x in e]
        return {"ips": images / seconds if seconds > 0 else None, "ips_after_first": rest / rest_s if rest_s > 0 else None,
                "steady_ips": later / later_s if later_s > 0 else None, "images": images, "seconds": seconds,
                "span_s": e[-1]["end"] - e[0]["start"] if e else None, "gap_s": gaps, "epochs": epochs,
                "peak_mib": self.peak_bytes / 2**20 if self.peak_bytes else None, "loss": self.loss, "amp": self.amp}


def synced_now() -> float:
    """perf_counter() once the GPU has finished what was queued (no wait on the CPU)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


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
    """One training of the default model per lever setting (spec["train_configs"]), in this process, one after another;
    the first is the one compared with Ultralytics."""
    from yolo_cb import YOLO
    from yolo_cb.utils.paths import DEFAULT_MODEL

    for i, config in enumerate(spec["train_configs"]):
        name = lever_name(config)
        if out_of_time(spec, result, name, error_row):
            continue
        clock, start = EpochClock(), time.perf_counter()
        model = YOLO(DEFAULT_MODEL)
        clock.attach(model.add_callback)
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
        result.add({"config": name, "status": "ok", "kind": "train", **clock.figures(), "row_s": time.perf_counter() - start,
                    "map50_95": metrics.get("metrics/mAP50-95(B)"), "lib": "yolo-cb", "model": DEFAULT_MODEL, "compared": i == 0})


def ultralytics_rows(spec: dict, result, error_row) -> None:
    """Ultralytics' loader alone (benchmarks/gpu_loader.py), then YOLO11n and YOLO26n from scratch with our recipe's
    imgsz, batch, epochs, amp, workers, cache and validation, timed by the same EpochClock; or why not."""
    try:
        import ultralytics
        from ultralytics import YOLO
    except ImportError as error:
        for name in ULTRALYTICS_MODELS:
            result.add({"config": name, "status": "unavailable", "note": f"ultralytics is not importable here ({error})"})
        return
    from benchmarks.gpu_loader import ultralytics_loader_rows

    settings = spec["ultralytics_settings"]
    try:
        ultralytics_loader_rows(spec, result, error_row, ultralytics.__version__)
    except Exception as error:  # its dataset failed to build: the trainings still run
        result.add(error_row("ultralytics loader", error))
    for name in ULTRALYTICS_MODELS:
        config = f"{name} amp={'on' if settings['amp'] else 'off'} (ultralytics {ultralytics.__version__})"
        if out_of_time(spec, result, config, error_row):
            continue
        clock, start = EpochClock(), time.perf_counter()
        try:
            model = YOLO(name)
            clock.attach(model.add_callback)
            model.train(**settings, name=Path(name).stem)
        except Exception as error:  # YOLO26 needs ultralytics >= 8.4; a failure of one model leaves the other
            result.add(error_row(config, error))
            continue
        result.add({"config": config, "status": "ok", "kind": "train", **clock.figures(), "row_s": time.perf_counter() - start,
                    "lib": "ultralytics", "model": name})
