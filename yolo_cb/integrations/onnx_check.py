"""ONNX check (onnx_check=True|strict, onnx_check_tol): does the model still convert to ONNX faithfully?

Before the first epoch (on_pretrain_routine_end, the EMA/bare model) and, with onnx_check_best=true, on best.pt after
the final validation (on_train_end). Each time a fused eval copy is exported with the project's exporter (the run's opset)
in memory (no file), checked with onnx.checker, run in onnxruntime on a real image (the first validation image,
letterboxed, scaled down to onnx_check_imgsz, float in [0, 1]) and every output compared with PyTorch. The best.pt
check simplifies the graph as `yolo-cb export` does (simplify=); the pretrain check does not (what it exists to catch,
an op that does not export or a traced graph that computes something else, happens before onnxslim):

    ONNX check (pretrain): difference 2.1e-06 (max abs 2.1e-06) vs PyTorch — OK (64x64 image, not simplified)

Measured on 2 CPU cores, YOLOCB-n: the check at imgsz 640 with onnxslim cost 2-9 s each time; at 64 px without onnxslim
about a second (the export traces the model at the check's size, and PyTorch's reference run is one forward). Once by
default (as SuperGradients' ModelConversionCheckCallback): what it catches is in the architecture, and best.pt's ONNX
file is verified by `yolo-cb export` itself; onnx_check_best=true checks best.pt at the end too.

The difference is the export verification's (exporter.compare): absolute for values up to 1, relative above.
A failed export or a difference above onnx_check_tol warns loudly (true) or raises (strict; the trainer
registers the check with on_error="raise" then, so training fails before its first epoch). No file is written.
"""

from __future__ import annotations

from pathlib import Path

from yolo_cb.callbacks.registry import callback_alias, integration
from yolo_cb.recipe.ema import unwrap
from yolo_cb.utils.log import LOGGER


class OnnxCheckError(RuntimeError):
    """The model could not be exported to ONNX, or the ONNX model disagrees with PyTorch beyond onnx_check_tol."""


# a strict check must fail the run; otherwise a failing check switches itself off and training goes on
@callback_alias("ModelConversionCheckCallback", {"atol": "tol"})  # SuperGradients' name
@integration("onnx_check", enabled=lambda args: args.onnx_check in (True, "strict"),
             on_error=lambda args: "raise" if args.onnx_check == "strict" else "disable", requires={"onnxruntime": "pip install onnxruntime"})
class OnnxCheck:
    """Checks ONNX conversion before training, and on best.pt with onnx_check_best (main process only); see the module docstring."""

    rank_zero_only = True  # the dispatcher calls it on rank 0 only

    def __init__(self, strict: bool | None = None, tol: float | None = None, best: bool | None = None):
        self.strict, self.tol = strict, tol  # None: from the trainer's onnx_check / onnx_check_tol settings
        self.best = best  # check best.pt at the end too; None: from the onnx_check_best setting
        self.image = None
        self.results: dict[str, dict] = {}  # stage -> {max_abs, max_rel, ok} or {error, ok}

    def on_pretrain_routine_end(self, trainer):
        self.image = self._image(trainer)
        model = trainer.ema.ema if trainer.ema is not None else unwrap(trainer.model)
        self.check(trainer, model, "pretrain", simplify=False)

    def on_train_end(self, trainer):
        best = Path(trainer.wdir) / "best.pt" if trainer.wdir else None
        wanted = self.best if self.best is not None else bool(getattr(trainer.args, "onnx_check_best", False))
        if not wanted or best is None or not best.is_file():
            return
        if self.image is None:
            self.image = self._image(trainer)
        self.check(trainer, best, "best.pt", simplify=bool(trainer.args.simplify))

    def check(self, trainer, model, stage: str, simplify: bool) -> dict:
        """Run the round trip of `model` (a model in use, copied, or a checkpoint's path); log the figures; warn, or raise
        OnnxCheckError when strict, on a failure."""
        from yolo_cb.export.checks import onnx_roundtrip  # the exporter loads torch: here, so that registering the check does not

        args = trainer.args
        strict = self.strict if self.strict is not None else args.onnx_check == "strict"
        tol = float(self.tol if self.tol is not None else args.onnx_check_tol)
        how = f"{self.image.shape[-2]}x{self.image.shape[-1]} image, {'simplified' if simplify else 'not simplified'}"
        try:
            result = onnx_roundtrip(model, self.image, opset=int(args.opset), simplify=simplify)
        except Exception as error:
            self.results[stage] = {"error": f"{type(error).__name__}: {error}", "ok": False}
            message = (f"ONNX check ({stage}): the model cannot be exported to ONNX ({type(error).__name__}: {str(error).strip()[:500]}); "
                       f"`yolo-cb export format=onnx` will fail too")
            self._fail(message, strict, error)
            return self.results[stage]
        ok = result["max_err"] <= tol  # the export's rule: absolute for values up to 1, relative above
        self.results[stage] = {**result, "ok": ok, "shape": tuple(self.image.shape[-2:]), "simplified": simplify}
        figures = f"difference {result['max_err']:.2g} (max abs {result['max_abs']:.2g}) vs PyTorch"
        if ok:
            LOGGER.info(f"ONNX check ({stage}): {figures} — OK ({how})")
            return self.results[stage]
        message = (f"ONNX check ({stage}): {figures} — above onnx_check_tol={tol:g}: the ONNX model does NOT "
                   f"match PyTorch on a {how} (look for ops that behave differently when traced, or Python-side computations)")
        self._fail(message, strict, None)
        return self.results[stage]

    @staticmethod
    def _fail(message: str, strict: bool, cause: BaseException | None) -> None:
        if strict:
            raise OnnxCheckError(f"{message} (onnx_check=strict)") from cause
        LOGGER.warning(f"WARNING {message}. Set onnx_check=strict to fail training instead, or onnx_check=false to skip the check.")

    @staticmethod
    def _image(trainer):
        """The first validation image as the loader prepares it (letterboxed), scaled down to onnx_check_imgsz, as float
        (1, 3, H, W) in [0, 1]."""
        import torch

        side = int(getattr(trainer.args, "onnx_check_imgsz", 0) or 0)
        try:
            image = trainer.test_loader.dataset[0]["img"][None].float() / 255
        except Exception as error:  # no usable validation image: a mid-grey image of the check's size
            LOGGER.debug(f"ONNX check: no validation image ({error}); using a grey image")
            size = side or int(trainer.args.imgsz)
            return torch.full((1, 3, size, size), 114 / 255)
        return scaled_down(image, side)


def scaled_down(image, side: int, stride: int = 32):
    """`image` (B, 3, H, W) resized so that its longest side is `side` (each side a multiple of `stride`, at least one
    stride); unchanged when `side` is 0 or the image is not larger."""
    import torch.nn.functional as F

    h, w = image.shape[-2:]
    if not side or max(h, w) <= side:
        return image
    scale = side / max(h, w)
    size = [max(stride, round(n * scale / stride) * stride) for n in (h, w)]
    return F.interpolate(image, size=size, mode="bilinear", antialias=True, align_corners=False).clamp(0, 1)
