"""Faster float32 linear layers on CPU: oneDNN with weights packed once, instead of MKL's sgemm.

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

import os
import types

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


def _packed_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    # traced by torch.compile (--compile: core/model/compile.py): the plain op, which inductor packs itself (freezing)
    if x.dtype != torch.float32 or (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)) \
            or torch.compiler.is_compiling():
        return F.linear(x, self.weight, self.bias)
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self._specbench_packed, self.bias, "none", [], "")


def prepack(model: torch.nn.Module) -> int:
    """Pack the float32 CPU nn.Linear weights of `model` for oneDNN (idempotent); returns how many were packed.

    Costs one extra copy of those weights in memory (the packed layout). No-op with SPECBENCH_CPU_LINEAR=mkl.
    """
    if backend() != "onednn":
        return 0
    count = 0
    with torch.no_grad():
        for module in model.modules():
            if (type(module) is torch.nn.Linear and module.weight.device.type == "cpu"
                    and module.weight.dtype == torch.float32 and not hasattr(module, "_specbench_packed")):
                module._specbench_packed = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(),
                                                                                   PACK_ROWS_HINT)
                module.forward = types.MethodType(_packed_forward, module)
                count += 1
    return count
