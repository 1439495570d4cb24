"""--compile's attention on the key / value heads (core/model/grouped_attention.py): the same outputs as
transformers' SDPA path (repeat_kv), with a mask at any query width; switched on and back with a compile state."""

from __future__ import annotations

import types

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from specbench.core.model import compile as cc
from specbench.core.model import grouped_attention as ga
from specbench.core.model.load import load_model


@pytest.mark.parametrize("width", [1, 3, 8])
def test_grouped_equals_repeat_kv(width):
    gen = torch.Generator().manual_seed(width)
    heads, kv_heads, keys, dim = 6, 2, 24, 16
    module = types.SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True)
    q = torch.randn(1, heads, width, dim, generator=gen)
    k, v = (torch.randn(1, kv_heads, keys, dim, generator=gen) for _ in range(2))
    visible = torch.rand(width, keys, generator=gen) > 0.3
    visible[:, 0] = True  # every row sees at least one key
    mask = torch.zeros(width, keys).masked_fill(~visible, torch.finfo(torch.float32).min)[None, None]
    ours, _ = ga.grouped_sdpa(module, q, k, v, mask, scaling=0.25)
    theirs, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.25)
    assert ours.shape == theirs.shape == (1, width, heads, dim)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_switched_with_the_compile_state_and_back():
    model = load_model("random:tiny", dtype="float32", device="cpu").model
    assert model.config._attn_implementation == "sdpa"
    cc.enable(model, 64)
    try:
        assert model.config._attn_implementation == ga.NAME
    finally:
        cc.disable(model)
    assert model.config._attn_implementation == "sdpa"
