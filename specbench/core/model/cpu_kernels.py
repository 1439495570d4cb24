"""Faster float32 (and native bfloat16) CPU linear layers: oneDNN with weights packed once, not MKL's sgemm.

Why: torch's default float32 CPU linear calls MKL, which re-packs the weight on every call once the input has
two or more rows. On AMD EPYC CPUs that makes a 2-token forward cost far more than a 1-token one,
which no tree or draft method can win back. oneDNN with a weight packed ahead of time (the layout torch.compile's
CPU freezing uses) keeps small widths nearly flat and is faster at width 1 too (benchmarks/RESULTS-cpu.md's
numbers are taken on this path).

The switch is SPECBENCH_CPU_LINEAR: `onednn` (default) or `mkl` (torch's default path). It applies to inference
only: a call that needs gradients falls back to F.linear, so training is unaffected. Every method of a run,
`ar` included, goes through the same kernels, so speedups stay side by side.
"""

from __future__ import annotations

import functools
import os
import weakref

import torch
import torch.nn.functional as F

MAX_PREPACK_PARAMS = 3_000_000_000  # packing keeps a second copy of the linear weights: skip for larger models

ENV = "SPECBENCH_CPU_LINEAR"
PACK_ROWS_HINT = 8  # the row count the packed layout is tuned for (flat from 1 to 8 rows, good to 64)


def backend() -> str:
    """The float32 CPU linear backend in use: onednn (packed weights) or mkl."""
    choice = os.environ.get(ENV, "onednn").strip().lower()
    if choice not in ("onednn", "mkl"):
        from ...errors import SpecbenchError

        raise SpecbenchError(f"{ENV}={choice!r}: use onednn or mkl")
    if choice == "onednn" and not available():
        return "mkl"
    return choice


def available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def room_for_copies(model: torch.nn.Module) -> bool:
    """Whether `model` is small enough (MAX_PREPACK_PARAMS) for packed copies of its linear weights: prepack's, and
    the compiled step's fused groups and panels (fused_linears.py, panel_linear.py)."""
    return sum(p.numel() for p in model.parameters()) <= MAX_PREPACK_PARAMS


def packable(dtype: torch.dtype) -> bool:
    """Whether weights of `dtype` are packed: float32, and bfloat16 where oneDNN runs it natively (AVX512-BF16 / AMX:
    there its packed linear took 0.46 ms where F.linear took 1.00 for a 4096 x 4096 weight at one row, and F.linear's
    one row was slower than its two, benchmarks/RESULTS-cpu.md, stop 58)."""
    if dtype == torch.float32:
        return True
    return dtype == torch.bfloat16 and available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


# the linear layers running on a packed weight; the packed copy itself is bound into their forward (a partial, so a
# deep copy of the module copies it too), so nothing of specbench's is stored on the module but the forward it runs,
# as accelerate's hooks replace a forward
_PACKED: weakref.WeakSet = weakref.WeakSet()


def _packed_forward(module: torch.nn.Linear, packed: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The forward of `module` over its packed weight: x [..., in] -> [..., out]."""
    # traced by torch.compile (--compile: core/model/compile.py): the plain op, which inductor packs itself (freezing)
    if x.dtype != packed.dtype or (torch.is_grad_enabled() and (x.requires_grad or module.weight.requires_grad)) \
            or torch.compiler.is_compiling():
        return F.linear(x, module.weight, module.bias)
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, module.bias, "none", [], "")


def _pack(module: torch.nn.Linear) -> None:
    with torch.no_grad():
        packed = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), PACK_ROWS_HINT)
    module.forward = functools.partial(_packed_forward, module, packed)
    _PACKED.add(module)


def prepack(model: torch.nn.Module) -> int:
    """Pack the float32 (and natively supported bfloat16: packable) CPU nn.Linear weights of `model` for oneDNN
    (idempotent); returns how many were packed.

    Costs one extra copy of those weights in memory (the packed layout). No-op with SPECBENCH_CPU_LINEAR=mkl.
    """
    if backend() != "onednn":
        return 0
    count = 0
    for module in model.modules():
        if (type(module) is torch.nn.Linear and module.weight.device.type == "cpu"
                and packable(module.weight.dtype) and module not in _PACKED):
            _pack(module)
            count += 1
    return count


def packed_copy(module: torch.nn.Module) -> torch.Tensor | None:
    """The packed weight `module` runs on (prepack's), or None where it is not packed."""
    forward = module.__dict__.get("forward")
    if module in _PACKED and isinstance(forward, functools.partial) and forward.func is _packed_forward:
        return forward.args[1]
    return None


def repack(module: torch.nn.Module) -> bool:
    """Pack a packed linear layer's weight again after it was edited in place; False when it was not packed."""
    if module not in _PACKED:
        return False
    _pack(module)
    return True
