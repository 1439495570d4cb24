"""Attention of a compiled CPU forward over the static KV cache as specbench's own C++ operator (its C++ in
native_attention_source.py, built into the library by native_linear), float32 or bfloat16 (its cache read as it is,
the arithmetic in float32, the output rounded once), head dim 64 or 128, with an additive mask (grouped_attention.py
calls it).

Why: a decode or verify forward attends a few query rows to the whole static cache. SDPA's flash kernel on a CPU
spent ~60 us a layer at one row on the embedded model's 3 key / value heads (its blocks and buffers sized for long
queries) where reading the layer's keys and values takes ~20, and it reads every slot of the cache, the masked ones
past the sequence too. The embedded model's whole compiled forward over a 512-token cache took 0.89 / 0.90 / 0.89 /
0.92 / 0.95 of its time with SDPA at 1 / 2 / 4 / 8 / 16 rows (benchmarks/compiled_ab.py, rounds interleaved in one
process; benchmarks/RESULTS-cpu.md, stop 59).

How: per batch row, the keys some query row may see are found from the mask (first and last visible; the keys
outside get weight exactly 0 from SDPA too, so skipping them changes no sum), split into chunks so that each thread
has two units or more (units: batch x key / value head x chunk). A unit takes the query heads that read its key /
value head (grouped-query attention without copying the cache) and, per query row: the scores q k * scale + mask,
their max, e^(score - max) (a 16-wide polynomial exp, exactly 0 below -87.3 as a masked score's is) and its sum,
and the weighted sum of values. The chunks are then combined exactly as flash-decoding does (each rescaled by
e^(its max - the row's max)). Output [B, Q, H, D], the layout transformers' attention functions return.
"""

from __future__ import annotations

import torch

HEAD_DIMS = (64, 128)
DTYPES = (torch.float32, torch.bfloat16)  # bfloat16: the cache read as it is, the arithmetic in float32


def fits(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Whether the operator takes this call: float32 or bfloat16 query / key / additive mask (all one dtype) on a CPU,
    head dim 64 or 128, the mask one per batch row (or one for all) over every key, query heads a multiple of key /
    value heads."""
    return (mask is not None and query.device.type == "cpu" and query.dtype == key.dtype == mask.dtype in DTYPES
            and query.dim() == key.dim() == mask.dim() == 4 and query.shape[-1] in HEAD_DIMS
            and mask.shape[1] == 1 and mask.shape[-1] == key.shape[2] and mask.shape[0] in (1, query.shape[0])
            and query.shape[1] % key.shape[1] == 0)


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
              scale: float) -> torch.Tensor:
    """query [B, H, Q, D], key / value [B, KVH, C, D], mask additive [B or 1, 1, Q, C] -> [B, Q, H, D]."""
    return torch.ops.specbench_native.attention(query, key, value, mask, scale)

