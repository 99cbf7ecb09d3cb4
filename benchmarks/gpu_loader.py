"""The data-path parts of benchmarks/gpu_check.py: each train loader alone over whole epochs (ours, and Ultralytics' under
its own interpreter), the harness's known-answer rows, and the device-side augmentation's ms per batch.

Only the standard library at the top: the Ultralytics rows import this module under an interpreter that may lack
yolo-cb's packages.

How a loader is timed (`time_epochs`), as a trainer meets it: each epoch starts a new iteration (`set_epoch`, then
`iter(loader)`; our workers restart or refill there, Ultralytics' run on), and every batch is taken, copied to the device
where there is one, and handed to a consumer (`consumer_s`: a sleep standing in for the training step; 0 = none). An
epoch's time runs from just before `iter()` to the end of its last batch's consumer, so the boundary (the wait for
the epoch's first batch) is in it; `first_batch_s` is that wait, and `batches_s` the rest (every later batch's wait and
consumer). Images/s are over whole epochs (`ips`) and over the batches after each epoch's first (`steady_ips`, the
kind of figure the first GPU check reported).
"""

from __future__ import annotations

import importlib
import inspect
import time

AUGMENT_FN = "yolo_cb.data.loading.device_colour:augment_batch"  # the device-side augmentation (issue 58 item 2), when it exists


def time_epochs(loader, epochs: int, files_key: str = "im_files", consumer_s: float = 0.0, device: str | None = None) -> dict:
    """Whole epochs of `loader` (see the module's docstring): per-epoch figures and their sums."""
    rows = []
    for epoch in range(epochs):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        start = time.perf_counter()
        images = batches = first_images = 0
        first_done = first_wait = None
        for batch in loader:
            if first_wait is None:
                first_wait = time.perf_counter() - start
            if device is not None:  # as a trainer does: the images onto the device, asynchronously from pinned memory
                batch["img"].to(device, non_blocking=True)
            if consumer_s:
                time.sleep(consumer_s)
            images += len(batch[files_key])
            batches += 1
            if first_done is None:
                first_done, first_images = time.perf_counter(), images
        if device is not None:
            import torch

            torch.cuda.synchronize()
        end = time.perf_counter()
        rows.append({"images": images, "batches": batches, "epoch_s": end - start, "first_batch_s": first_wait,
                     "batches_s": end - first_done if first_done is not None else 0.0, "first_batch_images": first_images})
    return summary(rows)


def summary(epochs: list[dict]) -> dict:
    """Images/s over whole epochs and over each epoch's batches after the first, from per-epoch figures."""
    images, seconds = sum(e["images"] for e in epochs), sum(e["epoch_s"] for e in epochs)
    later = sum(e["images"] - e["first_batch_images"] for e in epochs)
    later_s = sum(e["batches_s"] for e in epochs)
    return {"ips": images / seconds if seconds > 0 else None, "steady_ips": later / later_s if later_s > 0 else None,
            "images": images, "seconds": seconds, "epochs": epochs}


class StubLoader:
    """A loader whose timing is known: `start_s` at each `iter()` (a worker restart), `batch_s` per batch, `batches`
    batches of `batch` images. The harness's known answer: an epoch takes start_s + batches * (batch_s + consumer_s)."""

    def __init__(self, batches: int, batch: int, start_s: float, batch_s: float):
        self.batches, self.batch, self.start_s, self.batch_s = batches, batch, start_s, batch_s

    def __len__(self) -> int:
        return self.batches

    def __iter__(self):
        time.sleep(self.start_s)
        for _ in range(self.batches):
            time.sleep(self.batch_s)
            yield {"im_files": ["stub"] * self.batch}


def known_answer_rows(spec: dict, result, loader_factory) -> None:
    """Rows whose answer is known before they run (the dry run's harness checks; spec["known_answer"]):
    a stub loader with a known restart and batch time, and our real loader under a consumer slow enough that it
    cannot be the limit (its steady images/s must be batch / sleep)."""
    known = spec["known_answer"]
    stub = known["stub"]
    expected_s = stub["start_s"] + stub["batches"] * (stub["batch_s"] + stub["consumer_s"])
    figures = time_epochs(StubLoader(stub["batches"], spec["batch"], stub["start_s"], stub["batch_s"]), spec["loader_epochs"],
                          consumer_s=stub["consumer_s"])
    result.add({"config": f"known answer: stub loader, {stub['start_s']} s start, {stub['batch_s']} s / batch, consumer "
                          f"{stub['consumer_s']} s", "status": "ok", "kind": "known-answer", "lib": "stub", **figures,
                "expected_ips": stub["batches"] * spec["batch"] / expected_s, "expected_epoch_s": expected_s})
    sleep_s, workers = known["consumer_s"], known["workers"]
    loader = loader_factory(workers)
    figures = time_epochs(loader, spec["loader_epochs"], consumer_s=sleep_s)
    loader.reset_workers()
    result.add({"config": f"known answer: workers={workers}, consumer sleeps {sleep_s} s per batch", "status": "ok",
                "kind": "known-answer", "lib": "yolo-cb", "workers": workers, **figures, "expected_steady_ips": spec["batch"] / sleep_s})


def our_loader_rows(spec: dict, result, error_row) -> None:
    """Our train loader (mosaic, default augmentation, cache=ram) per worker count, whole epochs; one dataset for all."""
    from benchmarks.dataloader import settings
    from yolo_cb.data.loading.loader import build_dataloader, build_yolo_dataset
    from yolo_cb.data.resolve import check_data

    data = check_data(spec["data"])
    hyp = settings(spec["imgsz"], "ram")
    hyp.batch = spec["batch"]
    start = time.perf_counter()
    deferred = {"colour_on_device": True} if "colour_on_device" in inspect.signature(build_yolo_dataset).parameters else {}
    dataset = build_yolo_dataset(hyp, data["train"], "train", data["names"], batch=spec["batch"], write_caches=True, **deferred)
    result.checks["dataset"] = {"images": len(dataset), "build_s": time.perf_counter() - start}

    def loader(workers: int):
        return build_dataloader(dataset, spec["batch"], workers, shuffle=True, seed=0, pin_memory=spec["cuda"])

    if spec.get("known_answer"):
        try:
            known_answer_rows(spec, result, loader)
        except Exception as error:  # the harness check failing must not hide the loader's rows
            result.add(error_row("known answers", error))
    for workers in spec["loader_workers"]:
        config = f"workers={workers} cache=ram mosaic=1.0 batch={spec['batch']}"
        try:
            built = loader(workers)
            figures = time_epochs(built, spec["loader_epochs"], device="cuda" if spec["cuda"] else None)
            built.reset_workers()
            result.add({"config": config, "status": "ok", "kind": "loader", "lib": "yolo-cb", "workers": workers,
                        "pinned": bool(spec["cuda"]), "batches_per_epoch": len(built), **figures})
        except Exception as error:  # one worker count failing must not hide the others
            result.add(error_row(config, error))


def ultralytics_loader_rows(spec: dict, result, error_row, version: str) -> None:
    """Ultralytics' train loader with the loader part's settings (mosaic, cache=ram, batch, worker counts), timed as ours
    is: whole epochs per worker count, beside our loader's rows."""
    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_dataloader, build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    settings = spec["ultralytics_settings"]
    data = check_det_dataset(settings["data"])
    cfg = get_cfg(overrides={**settings, "mosaic": 1.0})
    dataset = build_yolo_dataset(cfg, data["train"], spec["batch"], data, mode="train")
    for workers in spec["loader_workers"]:
        config = f"loader workers={workers} cache=ram mosaic=1.0 batch={spec['batch']} (ultralytics {version})"
        try:
            loader = build_dataloader(dataset, spec["batch"], workers, shuffle=True)
            figures = time_epochs(loader, spec["loader_epochs"], files_key="im_file", device="cuda" if spec["cuda"] else None)
            result.add({"config": config, "status": "ok", "kind": "loader", "lib": "ultralytics", "workers": workers,
                        "batches_per_epoch": len(loader), **figures})
            del loader  # its workers end with it
        except Exception as error:  # one worker count failing must not hide the others
            result.add(error_row(config, error))


# --- the device-side augmentation --------------------------------------------------------------------------------------
def lookup(path: str):
    """(the function named `module:name`, None) or (None, why it is not there)."""
    module_name, _, name = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name and (module_name == error.name or module_name.startswith(error.name + ".")):  # the module itself (or its package) is missing
            return None, f"no module {module_name}"
        raise  # the module is there and one of its own imports failed: that is an error, not an absence
    fn = getattr(module, name, None)
    return (fn, None) if callable(fn) else (None, f"{module_name} has no function {name}")


def augment_part(spec: dict, result, error_row) -> None:
    """ms per batch of the device-side augmentation (spec["augment_fn"], `module:function`), eager and compiled, on one
    real train batch (our loader, mosaic; the colour left to the device where this version can) moved to the device. The function is called as fn(batch), batch the loader's
    dict with its tensors on the device; a row says "not available in this version" when the function does not exist."""
    path = spec["augment_fn"]
    fn, why = lookup(path)
    if fn is None:
        result.add({"config": path, "status": "unavailable", "kind": "augment", "note": f"not available in this version ({why})"})
        return
    import torch

    from benchmarks.dataloader import settings
    from yolo_cb.data.loading.loader import build_dataloader, build_yolo_dataset
    from yolo_cb.data.resolve import check_data

    data = check_data(spec["data_small"])
    hyp = settings(spec["imgsz"], False)
    hyp.batch = spec["batch"]
    deferred = {"colour_on_device": True} if "colour_on_device" in inspect.signature(build_yolo_dataset).parameters else {}
    dataset = build_yolo_dataset(hyp, data["train"], "train", data["names"], batch=spec["batch"], write_caches=True, **deferred)
    batch = next(iter(build_dataloader(dataset, spec["batch"], 0, shuffle=True, seed=0, pin_memory=False)))
    batch = {k: v.to(spec["device_name"]) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    variants = [("eager", fn)]
    if spec["compile"]:
        backend = {True: "inductor"}.get(spec["compile"], spec["compile"])
        variants.append((f"compiled ({backend})", torch.compile(fn, backend=backend)))
    for label, call in variants:
        config = f"{path} {label}, batch {spec['batch']} at {spec['imgsz']}"
        try:
            start = time.perf_counter()
            call(dict(batch))
            sync(torch)
            first_s = time.perf_counter() - start
            for _ in range(2):
                call(dict(batch))
            sync(torch)
            start = time.perf_counter()
            for _ in range(spec["augment_calls"]):
                call(dict(batch))
            sync(torch)
            ms = (time.perf_counter() - start) * 1e3 / spec["augment_calls"]
            result.add({"config": config, "status": "ok", "kind": "augment", "ms_per_batch": ms, "first_call_s": first_s,
                        "note": f"{ms:.2f} ms per batch over {spec['augment_calls']} calls (first call {first_s:.1f} s)"})
        except Exception as error:
            result.add(error_row(config, error))


def sync(torch) -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
