"""A TorchScript file is code, not weights: beyond the decision to load it at all (yolo_cb/prediction/model_trust.py: only
files yolo-cb wrote for this user, or trust=True), yolo-cb runs one only when every operation in it is tensor maths.

These content checks are defence in depth for files that are loaded: a crafted `.torchscript` whose graph called
`aten::from_file(path, shared=True)` overwrote bytes of a file outside its folder during `yolo-cb predict` and `val`
(security round 4). So before loading, the archive must hold each entry once and its code must define no `__setstate__`
(which torch.jit.load runs while loading); after loading, every method and forward hook of every submodule is walked,
and an operation outside ALLOWED_OPS (file, storage, process or network access; calls into functions or script classes
whose code is not walked) refuses the file in one line naming it and the operation. Every op of our own exports is
allowed. They cannot make an untrusted file safe: torch parses the archive itself, and PyTorch has no safe mode for
torch.jit.load.
"""

from __future__ import annotations

import io
import re
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

SETSTATE = re.compile(rb"\bdef\s+__setstate__\b")


def check_archive(data: bytes, path: Path) -> None:
    """Before torch.jit.load: each entry is in the archive once (torch reads the first of a name, case-insensitively, where
    Python's zipfile reads the last), and no code in it defines __setstate__ (torch.jit.load would run it while loading)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            entries = archive.infolist()
            names = [entry.filename.lower() for entry in entries]
            if len(set(names)) != len(names):
                twice = next(name for name in names if names.count(name) > 1)
                raise refusal(path, f"its archive holds the entry {twice} more than once")
            code = [entry for entry in entries if "/code/" in entry.filename.lower()]
            for entry in code:
                if SETSTATE.search(archive.read(entry)):
                    raise refusal(path, f"its code defines __setstate__ ({entry.filename.split('/', 2)[-1]}), which would run while loading")
    except (zipfile.BadZipFile, NotImplementedError) as error:  # a damaged entry, a compression zipfile cannot read
        raise refusal(path, f"its archive cannot be read through ({error})") from None


def check_graph(module: torch.jit.ScriptModule, path: Path) -> None:
    """After loading, before any call: every operation of every method and forward hook of every submodule is in
    ALLOWED_OPS, and every method called is a submodule's (a script class's methods are not walked)."""
    modules = {owner._c._type().qualified_name() for owner in module.modules()}
    for name, graph in _graphs(module):
        for node in _nodes(graph):
            kind = node.kind()
            if kind not in ALLOWED_OPS:
                raise refusal(path, f"its {name} calls {kind}, which is no tensor maths (a file, process or storage operation, "
                                    f"or code yolo-cb does not inspect)")
            receiver = node.inputsAt(0).type() if kind == "prim::CallMethod" else None
            if receiver is not None and getattr(receiver, "qualified_name", lambda: "")() not in modules:
                raise refusal(path, f"its {name} calls {receiver.str()}.{node.s('name')}(), a method of a script class, whose "
                                    f"code yolo-cb does not inspect")


def refusal(path: Path, why: str) -> CheckpointError:
    return CheckpointError(f"refused to run '{path}': {why}. A TorchScript file is a program: yolo-cb runs one only when "
                           f"every operation in it is tensor maths (docs/security.md)")


def _graphs(module: torch.jit.ScriptModule) -> Iterator[tuple[str, torch.Graph]]:
    """('method forward()' / 'forward hook h()', its graph) of every method and forward (pre-)hook of every submodule."""
    for owner in module.modules():
        for name in owner._c._method_names():
            yield f"method {name}()", owner._c._get_method(name).graph
        for hook in (*owner._c._get_forward_pre_hooks(), *owner._c._get_forward_hooks()):
            yield f"forward hook {hook.name}()", hook.graph


def _nodes(graph) -> Iterator[torch.Node]:
    for node in graph.nodes():
        yield node
        for block in node.blocks():
            yield from _nodes(block)
