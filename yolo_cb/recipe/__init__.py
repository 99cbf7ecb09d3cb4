"""The training recipe's parts, free of the trainer: optimizer groups, EMA, freezing, the monitored metric, stop causes."""
