"""Datasets, label verification + cache, transforms, loaders, dataset YAML resolution, synthetic data; other annotation
formats (formats/: COCO, VOC, LabelMe, Label Studio), `yolo-cb convert` (convert), `yolo-cb data check` (check),
labels.jpg (drawn by utils/plotting.py).

Import from the submodules (kept light on purpose: importing this package loads nothing heavy)::

    from yolo_cb.data.resolve import check_data
    from yolo_cb.data.loading.loader import build_yolo_dataset, build_dataloader
    from yolo_cb.data.transforms import letterbox
"""
