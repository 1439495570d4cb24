"""The only code that edits KV caches (transformers 5.x DynamicCache).

`cache.crop(-n)` (drop the last n positions) is the form that means the same across 5.x releases; a
non-negative argument changed meaning between releases, so it is never used here.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


def new_cache(model) -> DynamicCache:
    return DynamicCache(config=model.config)


def cache_length(cache: DynamicCache) -> int:
    return cache.get_seq_length()


def drop_last(cache: DynamicCache, n: int) -> None:
    """Remove the last n positions from every layer (no-op for n <= 0)."""
    if n > 0:
        cache.crop(-n)


def crop_to(cache: DynamicCache, length: int) -> None:
    """Keep the first `length` positions."""
    drop_last(cache, cache_length(cache) - length)


def keep_positions(cache: DynamicCache, start: int, keep: list[int]) -> None:
    """Tree compaction: of the positions appended from `start`, keep those at offsets `keep` (ascending; the
    accepted root-to-node path) moved to start, start+1, ..., and drop every other appended position."""
    total = cache_length(cache)
    if keep != list(range(len(keep))):
        index = torch.tensor(keep, dtype=torch.long) + start
        for layer in cache.layers:
            for states in (layer.keys, layer.values):  # [B, heads, T, head_dim]
                states[:, :, start:start + len(keep)] = states[:, :, index.to(states.device)]
    drop_last(cache, total - start - len(keep))
