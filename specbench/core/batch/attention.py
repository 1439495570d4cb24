"""The attention both batch engines run (core/batch/ragged.py `specbench_ragged`, core/batch/padded.py
`specbench_padded`) once each has gathered a layer's queries, keys, values and bool mask.

Most layers need plain scaled dot-product attention: one SDPA call (grouped-query heads without copying keys). Two
features SDPA does not have are computed explicitly, as the models' own eager attention does:
- attention logit soft-capping (Gemma 2: `attn_logit_softcapping`, passed to attention functions as `softcap`):
  scores = cap * tanh(scores / cap) before the mask;
- attention sinks (gpt-oss: a learned logit per head, passed as `s_aux`): one extra column in every row's softmax,
  dropped after it, so a query may put part of its attention nowhere.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from ...errors import SpecbenchError


class UnsupportedAttention(SpecbenchError):
    """A model whose layers the batch engines cannot run (a layer kind without a KV cache of its own positions)."""


ATTENTION_LAYERS = {"full_attention", "sliding_attention"}  # the layer kinds both engines mask and cache
_CHECKED: dict[int, weakref.ref] = {}  # id(config) -> a weak reference to a config that passed check_batchable


def check_batchable(model) -> None:
    """Refuse, before any forward, a model with layers that are not full or sliding-window attention (linear
    attention, state-space or convolution mixers, chunked attention): the engines keep and mask per-position keys
    and values only, so such a layer would silently compute something else. Checked once per config (a check
    walks the config, which costs a visible share of a tiny model's forward)."""
    config = getattr(model, "config", None)
    if config is None:
        return
    known = _CHECKED.get(id(config))
    if known is not None and known() is config:
        return
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    odd = sorted(set(getattr(text, "layer_types", None) or ()) - ATTENTION_LAYERS)
    if not odd:
        _CHECKED[id(config)] = weakref.ref(config)
    else:
        raise UnsupportedAttention(f"{type(model).__name__} has {', '.join(odd)} layers: specbench's batch engines "
                                   "(--batching unpadded and padded) run full and sliding-window attention layers "
                                   "only; run this model with --batch-size 1")


def layer_extras(module, kwargs: dict) -> tuple[float | None, torch.Tensor | None]:
    """(softcap, sinks [H]) that a transformers attention module hands its attention function (the keywords of
    transformers' modelling files: `softcap`; `s_aux` in gpt-oss and most others, `sinks` in a few); None where the
    layer has none."""
    sinks = kwargs.get("s_aux")
    if sinks is None:
        sinks = kwargs.get("sinks")
    if sinks is not None and sinks.numel() != module.config.num_attention_heads:
        raise UnsupportedAttention(f"{type(module).__name__}: attention sinks of shape {tuple(sinks.shape)}, not one "
                                   "per head: specbench's batch engines cannot run this model; run it with "
                                   "--batch-size 1")
    return (kwargs.get("softcap") or None), sinks


def attend(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, allowed: torch.Tensor,
           scaling: float | None, softcap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """query [B, H, q, D], keys / values [B, kv, k, D] (H a multiple of kv: query head h reads kv head h // (H / kv),
    transformers' repeat_kv order), allowed [B, 1, q, k] bool (True = attend; no row empty) -> [B, H, q, D].
    scaling None: 1 / sqrt(D). Without softcap and sinks: SDPA; else explicit, the softmax in float32."""
    if softcap is None and sinks is None:
        return F.scaled_dot_product_attention(query, keys, values, attn_mask=allowed, scale=scaling,
                                              enable_gqa=query.shape[1] != keys.shape[1])
    b, heads, q, d = query.shape
    kv = keys.shape[1]
    scale = d ** -0.5 if scaling is None else scaling
    grouped = query.reshape(b, kv, heads // kv, q, d)  # [B, kv, g, q, D]: the g query heads of each kv head
    scores = (grouped.float() @ keys[:, :, None].float().transpose(-1, -2)) * scale  # [B, kv, g, q, k]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~allowed[:, :, None], float("-inf"))  # [B, 1, 1, q, k] broadcast
    if sinks is not None:  # one more column per row: the head's sink logit
        sink = sinks.float().to(scores.device).reshape(1, kv, heads // kv, 1, 1).expand(b, -1, -1, q, 1)
        probs = torch.cat([scores, sink], -1).softmax(-1)[..., :-1]  # [B, kv, g, q, k]: the sink's share dropped
    else:
        probs = scores.softmax(-1)
    out = probs.to(values.dtype) @ values[:, :, None]  # [B, kv, g, q, D]
    return out.reshape(b, heads, q, d)
