"""A TorchScript file is code, not weights: yolo-cb runs one only when every operation in it is tensor maths.

A crafted `.torchscript` whose graph called `aten::from_file(path, shared=True)` overwrote bytes of a file outside its
folder during `yolo-cb predict` and `val` (security round 4). So before loading, the archive's code must define no
`__setstate__` (which torch.jit.load runs while loading); after loading, every method of every submodule is walked,
and an operation outside ALLOWED_OPS (file, storage, process or network access; calls into functions whose code is not
walked) refuses the file in one line naming it and the operation. Every op of our own exports is allowed.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from pathlib import Path

import torch

from yolo_cb.errors import CheckpointError

# tensor maths: what our exports of every family hold (fp32 and half), and the usual pure ops beside them
ALLOWED_OPS = frozenset(f"aten::{op}" for op in (
    "Int", "Float", "Bool", "ScalarImplicit", "size", "dim", "numel", "len", "__getitem__", "eq", "ne", "lt", "le", "gt", "ge",
    "_convolution", "conv2d", "conv_transpose2d", "batch_norm", "linear", "addmm", "matmul", "mm", "bmm",
    "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "neg", "pow", "sqrt", "rsqrt", "exp", "log", "abs", "floor",
    "ceil", "round", "remainder", "floor_divide", "clamp", "clamp_", "clamp_min", "clamp_max", "maximum", "minimum",
    "sigmoid", "sigmoid_", "silu", "silu_", "relu", "relu_", "leaky_relu", "leaky_relu_", "hardswish", "hardswish_",
    "hardsigmoid", "tanh", "gelu", "softmax", "log_softmax", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d",
    "upsample_nearest2d", "upsample_bilinear2d", "cat", "stack", "split", "split_with_sizes", "chunk", "slice", "select",
    "index", "index_select", "gather", "narrow", "reshape", "view", "flatten", "permute", "transpose", "contiguous",
    "unsqueeze", "squeeze", "expand", "expand_as", "repeat", "flip", "roll", "to", "type_as", "detach", "clone",
    "lift_fresh", "arange", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like", "empty", "empty_like",
    "linspace", "meshgrid", "max", "min", "amax", "amin", "argmax", "argmin", "sum", "mean", "prod", "topk", "sort",
    "where", "masked_fill", "tensor", "scalar_tensor", "t", "floordiv",
)) | frozenset(f"prim::{op}" for op in (
    "Constant", "GetAttr", "SetAttr", "CallMethod", "ListConstruct", "ListUnpack", "TupleConstruct", "TupleUnpack",
    "TupleIndex", "DictConstruct", "NumToTensor", "device", "dtype", "If", "Loop", "RaiseException", "Uninitialized",
    "unchecked_cast", "isinstance", "min", "max", "shape", "layout", "requires_grad", "data", "is_cuda", "TypeCheck",
))


def check_archive(path: Path) -> None:
    """Before torch.jit.load: no code in the archive defines __setstate__ (torch.jit.load would run it while loading)."""
    try:
        with zipfile.ZipFile(path) as archive:
            code = [n for n in archive.namelist() if "/code/" in n and n.endswith(".py")]
            for name in code:
                if b"def __setstate__" in archive.read(name):
                    raise refusal(path, f"its code defines __setstate__ ({name.split('/code/')[-1]}), which would run while loading")
    except zipfile.BadZipFile:
        return  # not an archive: torch.jit.load says what it is


def check_graph(module: torch.jit.ScriptModule, path: Path) -> None:
    """After loading, before any call: every operation of every method of every submodule is in ALLOWED_OPS."""
    for owner, method in _methods(module):
        for kind in _kinds(owner._c._get_method(method).graph):
            if kind not in ALLOWED_OPS:
                raise refusal(path, f"its method {method}() calls {kind}, which is no tensor maths (a file, process or "
                                    f"storage operation, or code yolo-cb does not inspect)")


def refusal(path: Path, why: str) -> CheckpointError:
    return CheckpointError(f"refused to run '{path}': {why}. A TorchScript file is a program: yolo-cb runs one only when "
                           f"every operation in it is tensor maths (docs/security.md)")


def _methods(module: torch.jit.ScriptModule) -> Iterator[tuple[torch.jit.ScriptModule, str]]:
    for owner in module.modules():
        for name in owner._c._method_names():
            yield owner, name


def _kinds(graph) -> Iterator[str]:
    for node in graph.nodes():
        yield node.kind()
        for block in node.blocks():
            yield from _kinds(block)
