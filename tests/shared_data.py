"""Where the data beside the checkout is: ../shared, or $YOLO_CB_SHARED (datasets, Megvii's YOLOX reference files)."""

from __future__ import annotations

import os
from pathlib import Path

SHARED = Path(os.environ.get("YOLO_CB_SHARED", Path(__file__).resolve().parents[2] / "shared"))
GOLDEN_DIR = Path(os.environ.get("YOLO_CB_GOLDEN_DIR") or SHARED / "golden" / "yolox")  # Megvii reference outputs, losses, weights
