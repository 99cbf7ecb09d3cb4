"""Inference: model files of every format as backends, sources, the predictor and its Results."""
