"""A linear of a few rows on weights packed in 16-column panels: specbench's own CPU kernel (`panels`, its C++ in
native_source.py, built by native_linear), one of the candidates a compiled CPU forward chooses per width bucket
(linear_kernels.py).

Why: at 1-4 rows a linear reads its weight once and does little else, so it should run at the machine's streaming
bandwidth. oneDNN's packed linear spends ~10 us a call before it reads (its primitive, its threads), so the small
matrices of a small model read at 28-35 GB/s where the machine streams 42-46: a 576 x 576 float32 weight took 44-47 us
through oneDNN against 34 us here, the 49152 x 576 LM head 2.53 against 2.39 ms (benchmarks/RESULTS-cpu.md, stop 59).
Which kernel runs at each width is measured per machine (linear_kernels.py).

How: the weight W [N, K] is copied once into panels [ceil(N / 16), K, 16] (panel p holds W[16 p : 16 p + 16]^T, the
last one zero-padded), one contiguous stream per panel. For each k, a panel's 16 weights times each row's x[k] add
into a 16-float vector register. The panels go in tiles of 4 (3 where the tiles would be few or their weights large),
the tiles split between the threads; each tile serves every block of rows (up to 4, 7 or 8 rows: up to 28 sums in
registers) before the next, so the weights are read from memory once whatever the width (16 rows of the LM head: 3.3
against 6.3 ms when rows went in passes of 8 over the whole weight, stop 60). A row's sums run in k's order whatever
rows sit beside it, so a token's output is the same at every width. With `ahead` (the `panel-ahead` candidate) the
kernel prefetches in software: the first row block's pass asks for each panel's weights 2 KB before it reads them (a
pass summing several rows a weight ran its stream slower than a one-row pass: 0.87-0.95 of the time with it at 2-16
float32 rows, stop 67), and each thread prefetches its next tile into L2, a share during each row block's pass over
the current one, so a wide step's sums overlap the next weights' stream; the sums are the same. Float32 and bfloat16
(its weights kept in bfloat16, half the bytes to stream; the sums float32, the output rounded to bfloat16 once:
oneDNN's bfloat16 linear read the embedded model's weights at ~6.6 GB/s on the AMX Xeon, where the machine streams
~26, benchmarks/RESULTS-cpu.md, stop 63), only where the native library is built (`available`). A bfloat16 panel
keeps its pairs of k side by side per column, so one 64-byte read gives two vectors of exact floats in two operations
(a widening read took two a vector: the same bits in 0.92 of the time at 16 rows, stop 65). That layout is also an
AMX B tile's: where the CPU has AMX and K is a multiple of 32, bfloat16 runs on the tiles (native_amx_source.py),
whose arithmetic no longer limits any width up to 16 (0.78x the vector kernel's time at 8 rows, 0.47x at 16, stop
66).
The copies: one per layer, the fused groups' one per group (fused_linears.py), kept weak-keyed by layer, made only
for a compiled step whose choice runs this kernel (memory_need counts them).
"""

from __future__ import annotations

import weakref

import torch

from . import native_linear

PANEL = 16  # output columns per panel: one 16-float vector


_COPIES: "weakref.WeakKeyDictionary[torch.nn.Linear, torch.Tensor]" = weakref.WeakKeyDictionary()


def available(dtype: torch.dtype) -> bool:
    """Whether the kernel runs at `dtype` here: float32 or bfloat16, with the native library built and loaded."""
    return dtype in (torch.float32, torch.bfloat16) and native_linear.ready()


def pack(weight: torch.Tensor) -> torch.Tensor:
    """W [N, K] -> panels [ceil(N / 16), K, 16] in W's dtype (float32 or bfloat16), contiguous; the padded columns
    zero. bfloat16: [ceil(N / 16), K2, 16] with K2 = K rounded up to even, each panel's pairs of k side by side per
    column ([K2 / 2, 16, 2] in memory: the kernel reads a column's two weights as one 32-bit lane), the pad zero."""
    n, k = weight.shape
    panels = -(-n // PANEL)
    dtype = weight.dtype if weight.dtype == torch.bfloat16 else torch.float32
    wide = k + k % 2 if dtype == torch.bfloat16 else k
    with torch.no_grad():
        padded = weight.detach().new_zeros(panels * PANEL, wide, dtype=dtype)
        padded[:n, :k] = weight.detach()
        if dtype == torch.bfloat16:
            pairs = padded.view(panels, PANEL, wide // 2, 2).permute(0, 2, 1, 3)  # [P, K2 / 2, 16, 2]
            return pairs.contiguous().view(panels, wide, PANEL)
        return padded.view(panels, PANEL, k).transpose(1, 2).contiguous()


def copy_of(layer: torch.nn.Linear) -> torch.Tensor:
    """The layer's packed copy (made once, kept while the layer lives)."""
    if layer not in _COPIES:
        _COPIES[layer] = pack(layer.weight)
    return _COPIES[layer]


def group_copy(members: list[torch.nn.Linear]) -> torch.Tensor:
    """The members' weights concatenated ([sum of out, K]) and packed (once per group, kept with its first member)."""
    head = members[0]
    if head not in _COPIES:
        _COPIES[head] = pack(torch.cat([m.weight.detach() for m in members]))
    return _COPIES[head]


def linear(x: torch.Tensor, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None,
           ahead: bool = False, dot: bool = False) -> torch.Tensor:
    """x [..., K] @ W^T (+ bias) -> [..., out_features] on W's packed copy; `ahead` turns the software prefetches on
    (the first row block's own weights ahead of its reads, each thread's next tile where a tile has two row blocks or
    more; on AMX tiles the first pass's only): the same sums either way. `dot` (bfloat16, where dot_pairs()): each
    pair of k's summed by one AVX512-BF16 dot product (vdpbf16ps: its own order and rounding) where AMX tiles are not
    used; a row's sums still never depend on the rows beside it."""
    return torch.ops.specbench_native.panels(x, packed, out_features, bias, ahead, dot)


def dot_pairs() -> bool:
    """Whether the native library's bfloat16 panels have the AVX512-BF16 dot-product path (`dot`) on this CPU."""
    try:
        return bool(torch.ops.specbench_native.panels_dot())
    except (AttributeError, RuntimeError):  # no native library (or one built before the path)
        return False



def drop(layers) -> None:
    """Forget the layers' copies (tests; a copy otherwise goes with its layer)."""
    for m in layers:
        _COPIES.pop(m, None)
