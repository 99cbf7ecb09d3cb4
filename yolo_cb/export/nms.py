"""NMS inside the exported graph (`nms=True`): output (B, max_det, 6) = x1, y1, x2, y2, score, class, padded with zeros.

The same selection as `yolo_cb.nn.postprocess.postprocess`: per anchor the best class, score = objectness * its
probability, per-class NMS (classes shifted apart, the trick torchvision's batched_nms uses) at the exported `iou`,
then the `max_det` best. Boxes are kept above NMS_FLOOR in the graph; the runtime `conf` filters the rows afterwards
(a box under `conf` can only suppress boxes scored lower still, so the boxes above `conf` are the same as PyTorch's).
In ONNX the NMS is the standard NonMaxSuppression op (opset 11+), batched over a dynamic batch axis.
"""

from __future__ import annotations

import torch
from torch import nn

NMS_FLOOR = 0.001  # scores kept by the in-graph NMS: the validation default of conf
NMS_OPSET_MIN = 11  # NonMaxSuppression with a dynamic number of boxes


class _BatchedNMS(torch.autograd.Function):
    """NonMaxSuppression over (B, A, 4) xyxy boxes and (B, 1, A) scores -> (N, 3) rows of (batch, 0, anchor)."""

    @staticmethod
    def forward(ctx, boxes: torch.Tensor, scores: torch.Tensor, iou: float, floor: float) -> torch.Tensor:
        from torchvision.ops import nms

        rows = []
        for b in range(boxes.shape[0]):
            keep = (scores[b, 0] > floor).nonzero().flatten()
            kept = keep[nms(boxes[b, keep].float(), scores[b, 0, keep].float(), iou)]
            rows.append(torch.stack((torch.full_like(kept, b), torch.zeros_like(kept), kept), dim=1))
        return torch.cat(rows) if rows else torch.zeros(0, 3, dtype=torch.long)

    @staticmethod
    def symbolic(g, boxes, scores, iou, floor):
        big = g.op("Constant", value_t=torch.tensor([2**31 - 1], dtype=torch.long))
        iou_t = g.op("Constant", value_t=torch.tensor([iou], dtype=torch.float))
        floor_t = g.op("Constant", value_t=torch.tensor([floor], dtype=torch.float))
        return g.op("NonMaxSuppression", boxes, scores, big, iou_t, floor_t)


class NMSWrapper(nn.Module):
    """`graph` (B, 3, H, W) -> (B, A, 5 + nc) followed by in-graph NMS -> (B, max_det, 6); see the module docstring."""

    def __init__(self, graph: nn.Module, iou: float, max_det: int):
        super().__init__()
        # torchvision's C++ ops load on first import and call torchvision::_cuda_version then; inside the ONNX trace
        # that call is recorded and fails ("unsupported output type: int"), so they are loaded here, before any trace
        import torchvision.ops  # noqa: F401
        self.graph, self.iou, self.max_det = graph, float(iou), int(max_det)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.graph(x).float()
        cxcy, wh = y[..., :2], y[..., 2:4]
        boxes = torch.cat((cxcy - wh / 2, cxcy + wh / 2), dim=-1)  # (B, A, 4) xyxy
        prob, cls = y[..., 5:].max(dim=-1)
        score = y[..., 4] * prob  # (B, A)
        reach = boxes.detach().abs().flatten(1).amax(1)[:, None, None] + 1.0  # per image, beyond every coordinate
        shift = cls.to(boxes.dtype)[..., None] * reach  # each class in a region of its own
        picked = _BatchedNMS.apply(boxes + shift, score[:, None], self.iou, NMS_FLOOR)
        kept = torch.zeros_like(score).index_put((picked[:, 0], picked[:, 2]), score[picked[:, 0], picked[:, 2]])
        k = min(self.max_det, y.shape[1])
        top, index = kept.topk(k, dim=1)  # (B, k), best first; suppressed anchors score 0
        rows = torch.cat((boxes, score[..., None], cls.to(boxes.dtype)[..., None]), dim=-1)
        picked_rows = rows.gather(1, index[..., None].expand(-1, -1, 6))
        return picked_rows * (top > 0).to(rows.dtype)[..., None]  # padding rows are all zeros
