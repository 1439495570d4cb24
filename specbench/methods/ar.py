"""`ar`: the autoregressive baseline, one token per target forward: the batch step (batch_loop.py) with no drafts;
at batch 1 it appends one token a forward to the model's own KV cache (core/batch/single.py)."""

from __future__ import annotations

from .base import DecodeMethod, register
from .batch_loop import Batchable


@register
class Autoregressive(Batchable, DecodeMethod):
    name = "ar"
    kind = "baseline"
    summary = "one token per forward (the reference every speedup is measured against)"
