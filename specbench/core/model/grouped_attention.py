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

Inside a compiled graph on a CPU, bfloat16 / float16 attention with a mask runs as two batched products and a
softmax in float32 (`grouped_products`: the query heads of one key / value head stacked as rows, [b, kv_heads,
groups * q, d] against [b, kv_heads, k, d]) instead of SDPA's flash kernel, whose bfloat16 path at one query row
made a whole compiled forward slower at one row than at two (17.8 against 13.1 ms, benchmarks/RESULTS-cpu.md,
stop 58). In float32 the two measured alike (1.95 / 5.05 / 7.10 ms against SDPA's 2.00 / 5.21 / 6.56 over 30 layers
at 1 / 8 / 16 rows), so float32 kept SDPA until specbench's own operator (native_attention.py): a float32 or
bfloat16 masked attention inside a compiled CPU graph runs it where the native library is built and the call fits it
(head dim 64 or 128; without groups too), the products (float16) or SDPA elsewhere.
$SPECBENCH_COMPILE_ATTENTION=native, products or sdpa sets one for every dtype (native where it fits). Eager
forwards keep SDPA: the lossless reference never shares the compiled path's attention.
"""

from __future__ import annotations

import os

import torch

from . import native_attention, native_linear

NAME = "specbench_grouped"
ENV = "SPECBENCH_COMPILE_ATTENTION"  # auto (native where it fits, else products below float32), native, products, sdpa
UNSUPPORTED = ("position_bias", "softcap", "s_aux", "sinks")  # extras of a family's attention none of ours applies


def grouped_products(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                     scaling: float | None) -> torch.Tensor:
    """query [b, heads, q, d], key / value [b, kv_heads, k, d], mask additive [b or 1, 1, q, k] -> [b, heads, q, d]:
    softmax(q k^T * scale + mask) v per query head, each reading key / value head h // groups (SDPA's enable_gqa),
    the scores and softmax in float32."""
    b, heads, q, d = query.shape
    kv_heads, k = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    scale = d ** -0.5 if scaling is None else scaling
    stacked = query.reshape(b, kv_heads, groups * q, d)  # head h = kv * groups + j: rows j * q .. j * q + q - 1
    scores = torch.matmul(stacked, key.transpose(-1, -2)).view(b, kv_heads, groups, q, k)
    scores = scores.float() * scale + mask[:, :, None].float()  # [b, 1, 1, q, k] over every head of a group
    probs = torch.softmax(scores, dim=-1).to(value.dtype).view(b, kv_heads, groups * q, k)
    return torch.matmul(probs, value).view(b, heads, q, d)


def products_here(dtype: torch.dtype) -> bool:
    """Whether a masked attention of `dtype` that native_attention does not take runs as grouped_products: only while
    compiling (ENV, else below float32)."""
    if not torch.compiler.is_compiling():
        return False
    said = os.environ.get(ENV, "auto").strip().lower()
    return said == "products" or (said == "auto" and dtype in (torch.bfloat16, torch.float16))


def native_here(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, kwargs: dict) -> bool:
    """Whether this call runs native_attention's operator: only while compiling, where it fits the call and the
    native library is built (ENV auto or native)."""
    if not torch.compiler.is_compiling() or os.environ.get(ENV, "auto").strip().lower() not in ("auto", "native"):
        return False
    return native_attention.fits(query, key, mask) and all(kwargs.get(k) is None for k in UNSUPPORTED) \
        and native_linear.ready()


def grouped_sdpa(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                 is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """query [b, heads, q, d], key / value [b, kv_heads, k, d], attention_mask additive [b or 1, 1, q, k] ->
    ([b, q, heads, d], None), as transformers' attention functions return."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if dropout == 0.0 and native_here(query, key, attention_mask, kwargs):
        scale = query.shape[-1] ** -0.5 if scaling is None else scaling
        return native_attention.attention(query, key, value, attention_mask, scale), None
    groups = getattr(module, "num_key_value_groups", 1)
    if groups <= 1 or attention_mask is None or kwargs.get("position_bias") is not None \
            or kwargs.get("softcap") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    if dropout == 0.0 and attention_mask.dtype != torch.bool and products_here(query.dtype):
        out = grouped_products(query, key, value, attention_mask, scaling)
    else:
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
    if next((p.dtype for p in model.parameters()), None) in native_attention.DTYPES:  # (a drafter has no .dtype)
        native_linear.ready()  # built (once per machine) and loaded now: tracing only asks whether it is


def restore(model) -> None:
    """Back to SDPA, the only implementation `use` replaces."""
    if getattr(getattr(model, "config", None), "_attn_implementation", None) == NAME:
        model.set_attn_implementation("sdpa")
