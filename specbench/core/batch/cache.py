"""The only code that edits transformers' KV caches (DynamicCache; the batch engines write their own preallocated
stores).

`cache.crop(-n)` (drop the last n positions) is the form whose meaning every supported transformers
release shares; a non-negative argument has meant different things in different releases, so it is never used here.

Sliding-window attention (Mistral, Qwen2 with use_sliding_window, Gemma 2/3, ...): transformers' own cache keeps
only the last `window - 1` keys of such layers (DynamicSlidingWindowLayer), and from then on it cannot roll back
(`crop` raises "the sliding window size was already reached"): every speculative method rolls back rejected
drafts. So new_cache gives every attention layer a full DynamicLayer (all keys and values, croppable, indexable by
absolute position like a full-attention layer), and the window is applied by the attention mask instead: the
model builds that mask itself from position ids for plain forwards (masking_utils' sliding-window mask over the
full KV length), and window_mask() applies it to the custom 4-D masks of tree methods. The cost: the cache holds
the whole context instead of the window (the same memory as a full-attention model of that size), and attention
reads every key and masks the old ones (the tokens are the same as transformers' windowed cache produces).
"""

from __future__ import annotations

import weakref

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from ...errors import SpecbenchError


def new_cache(model) -> DynamicCache:
    """A DynamicCache for `model` in which sliding-window layers keep full keys/values (the module docstring says
    why); other layer kinds (full attention, KV-sharing dummies, ...) are what transformers builds for the config."""
    cache = DynamicCache(config=model.config)
    for i, layer in enumerate(cache.layers):
        if type(layer) is DynamicSlidingWindowLayer:
            cache.layers[i] = DynamicLayer()
    return cache


# id(config) -> (weak reference to it, its windows): reading them walks the config, which would otherwise happen once per tree step
_WINDOWS: dict[int, tuple[weakref.ref, list[int | None]]] = {}


def sliding_windows(model) -> list[int | None]:
    """Per decoder layer: the attention window (keys within `window` positions of the query: the query itself
    and window - 1 before it), or None for full attention. Read from the config as transformers does."""
    config = model.config
    known = _WINDOWS.get(id(config))
    if known is not None and known[0]() is config:
        return known[1]
    windows = read_windows(config)
    _WINDOWS[id(config)] = (weakref.ref(config), windows)
    return windows


def read_windows(config) -> list[int | None]:
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs

        types, kwargs = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    except Exception:  # a transformers release without the helper: infer from the config's own fields
        cfg = config.get_text_config(decoder=True)
        types = getattr(cfg, "layer_types", None) or (
            ["sliding_attention" if getattr(cfg, "sliding_window", None) else "full_attention"]
            * cfg.num_hidden_layers)
        kwargs = [{"sliding_window": getattr(cfg, "sliding_window", None)} for _ in types]
    return [kw.get("sliding_window") if t == "sliding_attention" else None for t, kw in zip(types, kwargs)]


def window_mask(model, mask: torch.Tensor, position_ids: torch.Tensor):
    """Apply the model's sliding windows to a custom additive 4-D mask [1, 1, q, kv] (tree verification, prompt
    tokens): transformers uses a 4-D mask as given, so without this a sliding-window layer would see the whole
    context. Keys are the cache's positions 0..kv-q-1 (compacted caches hold the accepted sequence in order) then
    the q inputs at `position_ids` [1, q]; a query at position p sees keys at positions > p - window, the rule
    transformers' own sliding-window mask applies. Returns the mask unchanged without sliding layers, one windowed
    mask when every attention layer has the same window, else the {"full_attention": ..., "sliding_attention": ...}
    mapping that hybrid models (Qwen2, Gemma 2/3) accept in place of a mask."""
    windows = sliding_windows(model)
    sizes = {w for w in windows if w is not None}
    if not sizes:
        return mask
    if len(sizes) > 1:
        raise SpecbenchError(f"{type(model).__name__}: sliding-window layers of different sizes {sorted(sizes)} "
                             "are not supported by tree methods; use ar, pld, sd or pearl")
    window = sizes.pop()
    q, kv = mask.shape[-2], mask.shape[-1]
    qpos = position_ids[0].to(mask.device)  # [q]
    kpos = torch.cat([torch.arange(kv - q, device=mask.device), qpos])  # [kv]
    outside = (qpos[:, None] - kpos[None, :]) >= window  # [q, kv]
    windowed = mask.masked_fill(outside, torch.finfo(mask.dtype).min)
    if all(w is not None for w in windows):
        return windowed
    return {"full_attention": mask, "sliding_attention": windowed}


def cache_length(cache: DynamicCache) -> int:
    return cache.get_seq_length()


def drop_last(cache: DynamicCache, n: int) -> None:
    """Remove the last n positions from every layer (no-op for n <= 0)."""
    if n > 0:
        try:
            cache.crop(-n)
        except (RuntimeError, ValueError) as exc:  # a layer kind that cannot roll back (e.g. recurrent state)
            kinds = sorted({type(layer).__name__ for layer in cache.layers})
            raise SpecbenchError(f"this model's KV cache ({', '.join(kinds)}) cannot drop rejected tokens: "
                                 f"{str(exc).splitlines()[0]}. Only `ar` can run it.") from exc


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


# Batch engines (core/batch/ragged.py, core/batch/padded.py): preallocated per-layer stores written in place.

def preallocated(stores: dict[int, torch.Tensor], layer: int, like: torch.Tensor, slots: int,
                 need: int) -> torch.Tensor:
    """The layer's store [slots, kv_heads, capacity, head_dim], allocated on first use and grown to hold `slots`
    rows and `need` entries (capacity doubled, at least 64, so that a growing batch copies O(log T) times, not
    every step as a DynamicCache's torch.cat does). like: new keys or values [., kv_heads, ., head_dim]."""
    old = stores.get(layer)
    if old is not None and old.shape[0] >= slots and old.shape[2] >= need:
        return old
    rows = slots if old is None else max(slots, old.shape[0])
    capacity = max(need, 64) if old is None else (old.shape[2] if old.shape[2] >= need else
                                                  max(need, 2 * old.shape[2]))
    grown = like.new_zeros(rows, like.shape[1], capacity, like.shape[-1])
    if old is not None:
        grown[:old.shape[0], :, :old.shape[2]] = old
    stores[layer] = grown
    return grown
