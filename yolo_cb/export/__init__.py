"""Export: the exporter, each format's conversion, NMS in the graph, the check against PyTorch, `yolo-cb benchmark`."""
