"""TensorBoard (tensorboard=True): event files in the run dir — scalars per epoch, the model graph, visualisation images.

    tensorboard --logdir runs/detect

Scalars: train losses (train/iou_loss ...), learning rates (lr/pg0 ...) and, for epochs that validated, the
validation metrics under their own keys (metrics/mAP50-95(B), val/iou_loss, fitness); step = the 0-based epoch.
The graph is traced once from an eval copy of the model at the start (a failure only warns). Images: the
visualisation JPEGs (plots=True) as they appear, tag = file name without the epoch (val_batch0_pred), step = epoch,
stored as the JPEG file's own bytes (TensorBoard shows JPEG as it shows PNG): nothing is decoded or re-encoded, which
was ~0.5 s per 1286 px grid as PNG, most of the integration's cost.

The writer's own thread writes the events to disk: an epoch hands them over and goes on (an explicit flush every epoch
waited ~50-150 ms for the images to be written); the file is flushed every FLUSH_SECS seconds and when training ends,
so a viewer sees an epoch at most FLUSH_SECS late, and a kill -9 loses at most the last FLUSH_SECS of events.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

from yolo_cb.callbacks.registry import integration
from yolo_cb.integrations.visualize import image_tag, read_rgb
from yolo_cb.recipe.ema import unwrap
from yolo_cb.utils.log import LOGGER

GRAPH_IMGSZ = 64  # side of the zero image the graph is traced with (any multiple of 32 gives the same graph)
FLUSH_SECS = 30  # the writer's thread flushes the event file at least this often (SummaryWriter's default: 120)
ENCODED = ("JPEG", "PNG")  # image files stored as their own bytes; others are decoded and stored as PNG by TensorBoard


@integration("tensorboard", enabled=lambda args: bool(args.tensorboard), requires={"tensorboard": "pip install tensorboard"})
class TensorBoard:
    """Writes TensorBoard event files into trainer.save_dir (main process only)."""

    rank_zero_only = True

    def __init__(self):
        self.writer = None

    def on_pretrain_routine_end(self, trainer):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(trainer.save_dir), flush_secs=FLUSH_SECS)
        LOGGER.info(f"TensorBoard: tensorboard --logdir {trainer.save_dir.parent} (view at http://localhost:6006/)")
        self.add_graph(trainer)

    def add_graph(self, trainer) -> None:
        import torch

        try:
            model = copy.deepcopy(unwrap(trainer.model)).float().cpu().eval()
            image = torch.zeros(1, 3, GRAPH_IMGSZ, GRAPH_IMGSZ)
            with warnings.catch_warnings(), torch.no_grad():  # no autograd records: the graph is the same
                warnings.simplefilter("ignore")  # tracer warnings about constant grids are expected
                # trace once ourselves: add_graph's own trace re-runs a sanity check that the cached decode grids fail
                traced = torch.jit.trace(model, image, strict=False, check_trace=False)
                self.writer.add_graph(traced, image, use_strict_trace=False)
        except Exception as error:  # a graph is nice to have; never worth a run
            LOGGER.warning(f"WARNING TensorBoard: the model graph could not be traced ({type(error).__name__}: {error}); scalars and images are still logged")


    def on_fit_epoch_end(self, trainer):
        if self.writer is None:
            return
        for key, value in trainer.epoch_record.scalars().items():
            self.writer.add_scalar(key, float(value), trainer.epoch)
        self.add_new_images(trainer)

    def add_new_images(self, trainer) -> None:
        for path in trainer.new_images:
            tag, step = image_tag(path, trainer.epoch)
            summary = encoded_image(tag, path)
            if summary is not None:
                self.writer._get_file_writer().add_summary(summary, step)  # what add_image does, minus its PNG encoding
                continue
            img = read_rgb(path)
            if img is not None:
                self.writer.add_image(tag, img, step, dataformats="HWC")

    def on_train_end(self, trainer):
        self.close()

    def teardown(self, trainer):
        self.close()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def encoded_image(tag: str, path):
    """A TensorBoard image summary holding the file's own bytes (a JPEG or PNG: its header gives the size), or None for
    any other file (then it is decoded and stored as PNG)."""
    from PIL import Image
    from torch.utils.tensorboard.summary import Summary

    try:
        with Image.open(path) as image:  # reads the header only
            if image.format not in ENCODED:
                return None
            (width, height), channels = image.size, len(image.getbands())
        data = Path(path).read_bytes()
    except OSError as error:
        LOGGER.debug(f"TensorBoard: could not read {path} ({error})")
        return None
    return Summary(value=[Summary.Value(tag=tag, image=Summary.Image(height=height, width=width, colorspace=channels,
                                                                     encoded_image_string=data))])
