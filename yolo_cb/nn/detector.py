"""The detector contract as code: `Detector`, the base class of every family's model (YOLOX, YOLOCB).

The trainer, validator, predictor and exporter see a detector only through this contract:

    forward(x, targets) -> loss dict in train mode, (predictions, loss dict) in eval mode (validation with losses);
    forward(x)          -> raw per-level outputs (`head_outputs`) in train mode, decoded predictions in eval mode;
    decode(raw)         -> (B, A, 4 + 1 + nc): cx, cy, w, h in input pixels, objectness and class probabilities;
    raw_outputs(x)      -> per-level outputs in YOLOX's raw layout (B, 4 + 1 + nc, H / s, W / s) (the exporter's graph);
    fuse()              -> self, every BatchNorm folded into its convolution;
    build_loss(settings) -> the family's loss, built from the training settings it reads (`reads_settings`), as
                           `criterion`; the constructor builds one with the defaults. The loss gives what training
                           changes in it as plain data, `training_state()` / `load_training_state(state)` (the
                           checkpoint's `loss`; YOLOX: its L1 switch), so that the trainer knows no family; and
                           `start_final_stage()` -> what it turns on for the last, no-augmentation epochs (YOLOX: "L1
                           loss on"; "" for a loss with no such term), so that the stage switch knows none either;
    family, strides     -> the `family:` value of its model YAMLs; the output levels' strides (8, 16, 32);
    stride              -> the same strides as a float tensor (a non-persistent buffer: it follows .to(device));
    layers              -> the names of its layers in the order the image flows through them (what freeze=N counts);
    current_name(name)  -> a module or state-dict name as this version names it (a family that renamed modules maps
                           the old names; checkpoints are read through it);
    nc, names, cfg, name -> class count, {index: class name}, the architecture dict (stored in checkpoints), display name.
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from .blocks import ConvBNAct
from .summary import log_summary


class Detector(nn.Module, metaclass=ABCMeta):
    """Input: (B, 3, H, W) RGB in [0, 1], H and W multiples of the largest stride. See the module docstring.

    A family subclasses it: sets `family` and `strides`, calls `super().__init__(cfg, name)` first, then builds its
    layers (a `head` with `flatten(raw)` -> the loss's inputs but the targets, and `decode(raw)`) and last its loss with
    `self.build_loss()`; and implements `head_outputs` and `build_loss`.
    """

    family: ClassVar[str]  # the `family:` value of a model YAML that builds this detector
    strides: ClassVar[tuple[int, ...]]  # downsampling factor of each output level
    criterion: Any  # the loss (see build_loss); called as criterion(*head.flatten(raw), targets) -> loss dict
    layers: tuple[str, ...] = ()  # module names of the layers in flow order (freeze=N freezes the first N); () unknown

    def __init__(self, cfg: dict, name: str):
        """cfg: the architecture dict, with "nc" (the class count)."""
        super().__init__()
        self.name = name
        self.nc = int(cfg["nc"])
        self.cfg = cfg
        self.names = {i: str(i) for i in range(self.nc)}
        self.register_buffer("stride", torch.tensor(self.strides, dtype=torch.float32), persistent=False)

    @property
    def yaml(self) -> dict:
        """The architecture dict the model was built from, with its "nc" (Ultralytics' model.model.yaml)."""
        return self.cfg

    @staticmethod
    def current_name(name: str) -> str:
        """A module or state-dict name as this version names it (unchanged unless the family renamed its modules)."""
        return name

    @abstractmethod
    def head_outputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The head's per-level outputs in the family's own layout (what `forward(x)` returns in train mode)."""

    @abstractmethod
    def build_loss(self, settings: Mapping[str, Any] | None = None):
        """Make the family's loss from training settings (keys as in cfg/default.yaml: box, iou_type, ...; the loss reads
        those its `reads_settings` names and no other), store it as `self.criterion` and return it. None: the defaults."""

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None):
        raw = self.head_outputs(x)
        if targets is not None:
            # training: the loss dict; eval (validation with losses): (decoded predictions, loss dict) from one pass
            return self.loss(raw, targets) if self.training else (self.decode(raw), self.loss(raw, targets))
        return raw if self.training else self.decode(raw)

    def raw_outputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Per-level outputs in YOLOX's raw layout (B, 4 + 1 + nc, H / s, W / s); a family whose head has another layout
        overrides this. Decoding them as YOLOX outputs gives `decode`'s predictions."""
        return self.head_outputs(x)

    def decode(self, raw: list[torch.Tensor]) -> torch.Tensor:
        """(B, A, 4 + 1 + nc): cx, cy, w, h in input pixels, objectness and class probabilities."""
        return self.head.decode(raw)

    def loss(self, raw: list[torch.Tensor], targets: torch.Tensor) -> dict:
        """The criterion's loss dict for raw outputs and targets (N, 6) [image_index, class, cx, cy, w, h] in input pixels."""
        return self.criterion(*self.head.flatten(raw), targets)

    @torch.no_grad()
    def fuse(self, verbose: bool = False) -> Detector:
        """Fold every BatchNorm into its convolution, in place (for inference); returns self. verbose: log the fused
        model's summary line (layers, parameters, GFLOPs), as Ultralytics' fuse(verbose=True) does."""
        for module in self.modules():
            if isinstance(module, ConvBNAct):
                module.fuse()
        if verbose:
            log_summary(self, suffix=" (fused)")
        return self
