"""Tracking for `track` (`model.track(source, persist=True)`, `yolo-cb track`): each frame's detections go through a
multi-object tracker of the `trackers` package (Apache-2.0: BoT-SORT and ByteTrack, `tracker=botsort.yaml | bytetrack.yaml`)
and come back as Results whose boxes carry ids (`boxes.id`), as Ultralytics' track mode.

    tracks = Tracks("bytetrack.yaml", fps=30.0)
    results = tracks.update(results, persist=False)   # each Results keeps the tracked boxes only, with their ids

The package is an optional extra (`pip install 'yolo-cb[track]'`); without it `track` is refused in one line, before any
work (`require_trackers`, called while the settings are resolved). Nothing here imports torch or the package at import time.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from yolo_cb.settings.config import require_trackers

TRACK_CONF = 0.1  # track's confidence threshold when conf= is not given (Ultralytics': the tracker sees low-score boxes)
HIGH_CONF = 0.25  # Ultralytics' bytetrack.yaml / botsort.yaml: track_high_thresh and new_track_thresh
MATCH_IOU = 0.2  # their match_thresh 0.8 is a cost (1 - IoU): a match needs IoU >= 0.2
LOST_BUFFER = 30  # their track_buffer: frames (at 30 FPS) a lost track is kept for re-association


def new_tracker(name: str, fps: float = 30.0) -> Any:
    """A fresh tracker of the `trackers` package for `tracker=` (botsort[.yaml] | bytetrack[.yaml]), with Ultralytics'
    default thresholds; a track is confirmed on its first frame, as Ultralytics' (its first frame's boxes get ids)."""
    require_trackers()
    from trackers import BoTSORTTracker, ByteTrackTracker

    common = {"lost_track_buffer": LOST_BUFFER, "frame_rate": fps or 30.0, "track_activation_threshold": HIGH_CONF,
              "minimum_consecutive_frames": 1, "high_conf_det_threshold": HIGH_CONF}
    if name.removesuffix(".yaml") == "bytetrack":
        return ByteTrackTracker(**common, minimum_iou_threshold=MATCH_IOU)
    return BoTSORTTracker(**common, minimum_iou_threshold_first_assoc=MATCH_IOU)


def tracked_boxes(tracker: Any, boxes: np.ndarray, frame: np.ndarray) -> np.ndarray:
    """One frame through `tracker`: `boxes` (n, 6) [x1, y1, x2, y2, conf, cls] -> (m, 7) [x1, y1, x2, y2, id, conf, cls],
    the detections the tracker matched to a track (Ultralytics' tracked-box layout), in the order given."""
    import supervision as sv

    detections = sv.Detections(xyxy=boxes[:, :4].astype(np.float32), confidence=boxes[:, 4].astype(np.float32),
                               class_id=boxes[:, 5].astype(int), data={"index": np.arange(len(boxes))})
    kwargs = {"frame": frame} if getattr(tracker, "tracker_id", "") == "botsort" else {}  # BoT-SORT's camera-motion step reads it
    out = tracker.update(detections, **kwargs)
    ids = np.asarray(out.tracker_id if out.tracker_id is not None else [], dtype=int)
    keep = ids >= 0
    index = np.asarray(out.data.get("index", []), dtype=int)[keep]
    order = np.argsort(index, kind="stable")
    index, ids = index[order], ids[keep][order]
    rows = boxes[index]
    return np.concatenate([rows[:, :4], ids[:, None].astype(rows.dtype) + 1, rows[:, 4:6]], axis=1).reshape(-1, 7)  # ids from 1, as Ultralytics


class Tracks:
    """The trackers of a predictor across calls: one per video (reset when the video changes, as Ultralytics, unless
    persist), all made anew at each call unless persist (or when tracker= changes)."""

    def __init__(self, name: str, fps: float = 30.0):
        self.name, self.fps = name, fps
        self.tracker = new_tracker(name, fps)
        self.path: str | None = None  # the video (or image) the tracker last saw

    def update(self, results: list, persist: bool) -> list:
        """Each Results with its tracked boxes only, and their ids."""
        out = []
        for r in results:
            if not persist and self.path is not None and r.path != self.path:
                self.tracker = new_tracker(self.name, self.fps)
            self.path = r.path
            boxes = r.boxes.data.detach().cpu().numpy() if hasattr(r.boxes.data, "detach") else np.asarray(r.boxes.data)
            out.append(r.with_tracks(tracked_boxes(self.tracker, boxes.reshape(-1, 6), r.orig_img)))
        return out


def tracks_for(current: Tracks | None, name: str, persist: bool) -> Tracks:
    """The trackers a call runs: `current` when persist and of the same tracker=, else new ones (at 30 FPS, as
    Ultralytics' trackers are made)."""
    if persist and current is not None and current.name.removesuffix(".yaml") == name.removesuffix(".yaml"):
        return current
    return Tracks(name)
