"""The import paths of yolo_cb.engine, kept for one release after the package split of 2026-12-04 (issue #43): importing
`yolo_cb.engine.<module>` warns (DeprecationWarning, naming the new path) and gives the module that holds that code now,
so that `from yolo_cb.engine.trainer import Trainer` works as documented before. MOVED is the whole map; docs/ultralytics.md
lists it. Nothing is installed until this package is imported."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings

MOVED = {  # old module name under yolo_cb.engine -> the module now
    **{m: f"yolo_cb.checkpoints.{m}" for m in ("checkpoint", "weights")},
    **{m: f"yolo_cb.evaluation.{m}" for m in ("coco_json", "per_class", "val_metrics", "val_sets", "validator")},
    **{m: f"yolo_cb.export.{m}" for m in ("benchmark", "exporter")},
    "export_images": "yolo_cb.export.calibration_images", "export_convert": "yolo_cb.export.convert",
    "export_formats": "yolo_cb.export.formats", "export_nms": "yolo_cb.export.nms", "export_verify": "yolo_cb.export.verify",
    **{m: f"yolo_cb.prediction.{m}" for m in ("backend", "predictor", "results", "sources")},
    **{m: f"yolo_cb.recipe.{m}" for m in ("ema", "freeze", "monitor", "optim", "stop")},
    **{m: f"yolo_cb.training.{m}" for m in ("build", "checkpointer", "epoch_record", "place", "resume", "resume_state", "run_state",
                                            "signals", "step", "trainer", "trainer_hooks")},
}
REMOVAL = "the next release"  # when these paths go


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds yolo_cb.engine.<old name> and loads it as the module of its new path (the same module object)."""

    def find_spec(self, fullname: str, path=None, target=None):
        package, _, name = fullname.rpartition(".")
        return importlib.machinery.ModuleSpec(fullname, self) if package == __name__ and name in MOVED else None

    def create_module(self, spec):
        new = MOVED[spec.name.rpartition(".")[2]]
        warnings.warn(f"{spec.name} is now {new}: import it from there ({spec.name} goes in {REMOVAL})", DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module) -> None:  # the module is the new one, already run
        return None


if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
    sys.meta_path.insert(0, MovedModules())
