"""Export check (export_check=onnx,openvino_int8, export_check_tol, export_check_strict): at the end of training best.pt
is exported to each variant, each export is validated on the val split next to PyTorch (the same letterboxed images),
and the rows go to export_check.csv in the run folder, and to the run's loggers as `export_check/<variant>/mAP50-95` and
`.../drop` (MLflow metrics, TensorBoard scalars, W&B summary values; MLflow also uploads the CSV with the run's files):

    export check: onnx_int8 mAP50-95 0.3021 vs PyTorch 0.3090 (drop 0.0069) — OK

A variant that cannot be exported, or drops more than export_check_tol, warns; with export_check_strict=true it fails
the run (the trainer registers the check with on_error="raise" then).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from yolo_cb.callbacks.dispatch import rank_zero_only
from yolo_cb.callbacks.registry import integration
from yolo_cb.utils.files import atomic_write_text
from yolo_cb.utils.log import LOGGER

COLUMNS = ("variant", "file", "mAP50-95", "pytorch", "drop", "ok", "error")  # export_check.csv's (VariantChecks.run's rows)


class ExportCheckError(RuntimeError):
    """An export of best.pt failed, or lost more mAP50-95 than export_check_tol (export_check_strict=true)."""


@integration("export_check", enabled=lambda args: bool(args.export_check),
             on_error=lambda args: "raise" if args.export_check_strict else "disable", requires={"onnxruntime": "pip install onnxruntime"})
class ExportCheck:
    """Exports and validates best.pt at on_train_end (main process only); see the module docstring."""

    def __init__(self):
        self.rows: list[dict] = []
        self.variants = None  # the export module's VariantChecks, made when the run starts (it names each bad variant)

    def on_pretrain_routine_end(self, trainer):
        from yolo_cb.export.checks import VariantChecks  # the exporter loads torch: here, so that registering the check does not

        self.variants = VariantChecks(trainer.args.export_check)  # every rank checks the names; a bad one fails before epoch 1

    @rank_zero_only  # the export and its validation: rank 0 only
    def on_train_end(self, trainer):
        best = Path(trainer.wdir) / "best.pt" if trainer.wdir else None
        if best is None or not best.is_file() or self.variants is None:
            return
        self.rows = self.variants.run(best, trainer.args, Path(trainer.save_dir))
        self._write(Path(trainer.save_dir) / "export_check.csv")
        self._log(trainer)
        self._judge(bool(trainer.args.export_check_strict), float(trainer.args.export_check_tol))

    def _write(self, file: Path) -> None:
        buffer = io.StringIO()  # written atomically, as every file of a run: a link planted at the name is replaced, not followed
        writer = csv.DictWriter(buffer, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(self.rows)
        atomic_write_text(file, buffer.getvalue())

    def _log(self, trainer) -> None:
        """The figures to the loggers of this run that are still open (they end at their own on_train_end, after this one:
        integrations run in the order of their file names)."""
        figures = {f"export_check/{r['variant']}/{key}": float(r[key]) for r in self.rows if not r["error"] for key in ("mAP50-95", "drop")}
        step = max(int(trainer.epoch), 0)
        for entry in trainer.callbacks.entries("on_train_end"):
            owner = entry.owner
            if getattr(owner, "run_id", None) and getattr(owner, "client", None) is not None:  # MLflow
                for key, value in figures.items():
                    owner.client.log_metric(owner.run_id, key, value, step=step)
            elif getattr(owner, "writer", None) is not None:  # TensorBoard
                for key, value in figures.items():
                    owner.writer.add_scalar(key, value, step)
            elif getattr(owner, "run", None) is not None and hasattr(owner.run, "summary"):  # W&B
                owner.run.summary.update(figures)

    def _judge(self, strict: bool, tol: float) -> None:
        for row in self.rows:
            figures = row["error"] or f"mAP50-95 {row['mAP50-95']} vs PyTorch {row['pytorch']} (drop {row['drop']})"
            if row["ok"]:
                LOGGER.info(f"export check: {row['variant']} {figures} — OK")
                continue
            message = f"export check: {row['variant']} {figures} — above export_check_tol={tol:g}" if not row["error"] else \
                f"export check: {row['variant']} cannot be exported ({figures})"
            if strict:
                raise ExportCheckError(f"{message} (export_check_strict=true)")
            LOGGER.warning(f"WARNING {message}. Set export_check_strict=true to fail the run instead.")
