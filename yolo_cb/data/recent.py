"""The images a loader process decoded last, kept for the mosaic partners that come from the same few batches."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

MAX_BYTES = 512 * 2**20  # at most this much decoded image memory per loader process (~450 images at 640, ~1800 at 320)


class RecentImages:
    """Decoded images (resized, BGR) by dataset index: at most `count` images and `max_bytes`; the first in goes first
    (a batch's pool is its own images and those of the few batches before, so the oldest are the ones no longer needed)."""

    def __init__(self, count: int, max_bytes: int = MAX_BYTES):
        self.count, self.max_bytes = int(count), int(max_bytes)
        self.images: OrderedDict[int, np.ndarray] = OrderedDict()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self.images)

    def get(self, index: int) -> np.ndarray | None:
        return self.images.get(index)

    def put(self, index: int, img: np.ndarray) -> None:
        if index in self.images:
            return
        self.images[index] = img
        self.nbytes += img.nbytes
        while len(self.images) > self.count or (self.nbytes > self.max_bytes and len(self.images) > 1):
            _, old = self.images.popitem(last=False)
            self.nbytes -= old.nbytes
