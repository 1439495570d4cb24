"""The only code that edits KV caches (transformers 5.x DynamicCache).

`cache.crop(-n)` (drop the last n positions) is the form that means the same across 5.x releases; a
non-negative argument changed meaning between releases, so it is never used here.
"""

from __future__ import annotations

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
