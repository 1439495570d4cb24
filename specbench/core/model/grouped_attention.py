"""Grouped-query attention without copying the KV cache, for `--compile`'s static forwards.

transformers' SDPA path meets a grouped-query model (SmolLM2: 9 query heads over 3 key / value heads) with a mask
under torch.compile by `repeat_kv`: every layer copies its whole key and value cache to one copy per query head
before attention. Over a static cache that is 3 x [1, 9, capacity, 64] floats written and read per layer on every
forward (its eager path packs the query instead, at width 1 only, and not while compiling). Here attention runs on
the key / value heads as they are, SDPA's `enable_gqa=True` (each query head reads key / value head h // groups,
the pairing repeat_kv makes), which saves those copies on every compiled forward (the measured gain:
benchmarks/RESULTS-cpu.md).

The function is registered with transformers under NAME (attention and mask, the mask as SDPA's) and a model is
switched to it while a compile state is attached (core/model/compile.enable / disable). It is transformers' SDPA
function wherever that one does not copy: without groups, or without a mask (causal prefill). On CPUs only, where
it was measured: on CUDA, SDPA with a mask and `enable_gqa` runs its math kernel (transformers avoids it there for
that reason), so CUDA keeps transformers' path until a GPU run compares the two (benchmarks/gpu_pass.sh).
"""

from __future__ import annotations

import torch

NAME = "specbench_grouped"


def grouped_sdpa(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                 is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """query [b, heads, q, d], key / value [b, kv_heads, k, d], attention_mask additive [b or 1, 1, q, k] ->
    ([b, q, heads, d], None), as transformers' attention functions return."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    if groups <= 1 or attention_mask is None or kwargs.get("position_bias") is not None \
            or kwargs.get("softcap") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(NAME, grouped_sdpa)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def use(model) -> None:
    """Switch `model` to the grouped function where it runs SDPA on a CPU (other implementations and devices are left
    as they are)."""
    from .placement import input_device

    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa" or not hasattr(model, "set_attn_implementation") \
            or input_device(model).type != "cpu":
        return
    _register()
    model.set_attn_implementation(NAME)


def restore(model) -> None:
    """Back to SDPA, the only implementation `use` replaces."""
    if getattr(getattr(model, "config", None), "_attn_implementation", None) == NAME:
        model.set_attn_implementation("sdpa")
