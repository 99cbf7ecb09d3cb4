"""The YOLOCB family: split-CSP backbone and PAN neck (`backbone`), distribution head (`head`), task-aligned assigner
(`assigner`) and loss (`loss`), the detector (`model`). No imports here: `yolo_cb.nn` re-exports YOLOCB."""
