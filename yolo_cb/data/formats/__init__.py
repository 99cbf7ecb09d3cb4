"""Annotation formats other than YOLO's: COCO JSON, Pascal VOC, LabelMe, Label Studio.

Each reader returns a :class:`~yolo_cb.data.formats.common.Split`; :mod:`.cache` turns a COCO or VOC split named by a
data YAML into a YOLO folder under datasets_dir (what training reads), :mod:`yolo_cb.data.convert` writes one where
the user asks (``yolo-cb convert``). Nothing is imported here: each user imports the module it needs.
"""
