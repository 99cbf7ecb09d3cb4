"""Validation: the validator, its metrics table, COCO JSON, per-class results, several validation sets."""
