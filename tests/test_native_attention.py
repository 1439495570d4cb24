"""The compiled CPU forward's own attention operator (core/model/native_attention.py): equal to SDPA (enable_gqa)
under causal, windowed, tree and per-row masks at every width, batch and head dim it takes; the keys past the last
visible one never read; in bfloat16, float32 attention over the same values rounded once; taken by grouped_sdpa only
while compiling, where it fits; and a compiled model whose heads fit it decodes the eager model's tokens through
it."""

from __future__ import annotations

import json
import types

import pytest
import torch
import torch.nn.functional as F

from specbench.core.model import grouped_attention as ga
from specbench.core.model import native_attention as na
from specbench.core.model import native_linear as nl
from specbench.core.model.load import load_model
from specbench.core.verify import Sampling
from specbench.methods import get_method

from .conftest import prompt_ids


@pytest.fixture
def built(monkeypatch):
    monkeypatch.delenv(nl.ENV, raising=False)
    if not nl.ready():
        pytest.fail(f"the native library did not build here: {nl.status()}")  # inductor's C++ compiler is here


def _mask(visible: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """visible [B, Q, C] bool -> the additive mask [B, 1, Q, C] of `dtype`, hidden keys at its lowest."""
    return torch.zeros(visible.shape, dtype=dtype).masked_fill(~visible, torch.finfo(dtype).min)[:, None]


def _visible(kind: str, batch: int, width: int, capacity: int, gen) -> torch.Tensor:
    keys = torch.arange(capacity)
    ends = torch.randint(width, capacity + 1, (batch,), generator=gen)  # each row's sequence length
    pos = ends[:, None] - width + torch.arange(width)[None]  # [B, Q]: each query row's position
    causal = keys[None, None] <= pos[..., None]
    if kind == "causal":
        return causal
    if kind == "window":  # a sliding window of 8: the first visible key is past 0
        return causal & (keys[None, None] > pos[..., None] - 8)
    tree = causal & (torch.rand(batch, width, capacity, generator=gen) > 0.4)  # a tree's rows: some drafts hidden
    return tree | (keys[None, None] == pos[..., None])  # every row sees itself


@pytest.mark.parametrize("kind", ["causal", "window", "tree"])
@pytest.mark.parametrize("width, batch, heads, kv_heads, dim", [(1, 1, 9, 3, 64), (1, 2, 8, 2, 128), (2, 1, 9, 3, 64),
                                                               (3, 2, 9, 3, 64), (16, 1, 4, 4, 128), (33, 2, 8, 2, 64)])
def test_equals_sdpa(built, kind, width, batch, heads, kv_heads, dim):
    gen = torch.Generator().manual_seed(width * 7 + batch)
    capacity = 96
    q = torch.randn(batch, heads, width, dim, generator=gen)
    k, v = (torch.randn(batch, kv_heads, capacity, dim, generator=gen) for _ in range(2))
    mask = _mask(_visible(kind, batch, width, capacity, gen))
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3, enable_gqa=True).transpose(1, 2)
    assert na.fits(q, k, mask)
    torch.testing.assert_close(na.attention(q, k, v, mask, 0.3), want, rtol=1e-5, atol=1e-5)
    if batch == 1:  # one mask for the whole batch: broadcast over batch rows
        q2, k2, v2 = (torch.cat([t, t]) for t in (q, k, v))
        torch.testing.assert_close(na.attention(q2, k2, v2, mask, 0.3), torch.cat([want, want]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["causal", "tree"])
# (8 rows a unit or more score on AMX tiles where the CPU has them: 16 keys x 16 rows a tile, 4 row groups at a time)
@pytest.mark.parametrize("width, batch, heads, kv_heads, dim", [(1, 1, 9, 3, 64), (2, 2, 8, 2, 128), (8, 1, 9, 3, 64),
                                                                (24, 1, 12, 2, 64), (3, 2, 8, 2, 128)])
def test_bfloat16_is_float32_attention_over_the_same_values_rounded_once(built, kind, width, batch, heads, kv_heads,
                                                                          dim):
    """A bfloat16 call reads the cache as it is and sums in float32: SDPA in float32 over the same (widened) values,
    each output within bfloat16's rounding of it; the mask at bfloat16's lowest still hides the keys."""
    gen = torch.Generator().manual_seed(width * 5 + batch)
    capacity = 80
    q = torch.randn(batch, heads, width, dim, generator=gen).bfloat16()
    k, v = (torch.randn(batch, kv_heads, capacity, dim, generator=gen).bfloat16() for _ in range(2))
    mask = _mask(_visible(kind, batch, width, capacity, gen), torch.bfloat16)
    assert na.fits(q, k, mask)
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask.float(), scale=0.3,
                                          enable_gqa=True).transpose(1, 2)
    got = na.attention(q, k, v, mask, 0.3)
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    torch.testing.assert_close(got.float(), want, rtol=2 ** -8, atol=1e-6)  # bfloat16 keeps 8 bits


# 2 query rows x 3 heads a key head: a row at a time; 5 x 3: blocks of 16 keys read once for all the rows
@pytest.mark.parametrize("rows", [2, 5])
def test_keys_past_the_last_visible_are_not_read(built, rows):
    """Slots past the sequence (a static cache's stale or unwritten ones) carry weight exactly 0, so they are
    skipped: even NaN there leaves the output equal to attention over the sequence alone."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 6, rows, 64, generator=gen)
    k, v = (torch.randn(1, 2, 50, 64, generator=gen) for _ in range(2))
    ends = torch.arange(30, 30 + rows)[:, None]  # row i sees keys [0, 30 + i)
    visible = torch.arange(50)[None, None, :] < ends[None]  # [1, rows, 50]
    last = 30 + rows
    want = na.attention(q, k[:, :, :last], v[:, :, :last], _mask(visible)[..., :last], 0.125)
    k[:, :, last:], v[:, :, last:] = float("nan"), float("nan")
    torch.testing.assert_close(na.attention(q, k, v, _mask(visible), 0.125), want, rtol=0, atol=0)


@pytest.mark.parametrize("heads", [4, 8])  # 2 or 4 heads a key head: 4 rows a unit (a row at a time), 8 (blocks)
def test_a_row_whose_chunk_is_all_minus_infinity_takes_nothing_from_it(built, heads):
    """With -inf (not the dtype's lowest) as the mask, a query row that sees none of a chunk's keys while another row
    does: that chunk adds nothing to the row (no NaN from -inf - -inf), as SDPA."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, heads, 2, 64, generator=gen)
    k, v = (torch.randn(1, 2, 100, 64, generator=gen) for _ in range(2))
    keys = torch.arange(100)
    visible = torch.stack([keys < 10, keys >= 90])[None]  # row 0 sees the first 10 keys, row 1 the last 10
    mask = torch.zeros(visible.shape).masked_fill(~visible, float("-inf"))[:, None]
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125, enable_gqa=True).transpose(1, 2)
    got = na.attention(q, k, v, mask, 0.125)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_refused_shapes_and_dtypes(built):
    q, k = torch.randn(1, 4, 1, 64), torch.randn(1, 2, 10, 64)
    mask = torch.zeros(1, 1, 1, 10)
    assert na.fits(q, k, mask)
    assert not na.fits(q, k, None)
    assert na.fits(q.bfloat16(), k.bfloat16(), mask.bfloat16())
    assert not na.fits(q.half(), k.half(), mask.half())
    assert not na.fits(q.bfloat16(), k, mask)  # dtypes mixed
    assert not na.fits(torch.randn(1, 4, 1, 80), torch.randn(1, 2, 10, 80), mask)  # head dim 80
    assert not na.fits(q, k, torch.zeros(1, 4, 1, 10))  # a mask per head
    with pytest.raises(RuntimeError, match="head dim 64 or 128"):
        na.attention(torch.randn(1, 4, 1, 32), torch.randn(1, 2, 10, 32), torch.randn(1, 2, 10, 32), mask, 1.0)


def test_grouped_sdpa_takes_it_only_while_compiling_where_it_fits(built, monkeypatch):
    module = types.SimpleNamespace(num_key_value_groups=3, is_causal=True)
    q, k, v = torch.randn(1, 6, 2, 64), torch.randn(1, 2, 20, 64), torch.randn(1, 2, 20, 64)
    mask = torch.zeros(1, 1, 2, 20)
    taken = []
    real = na.attention
    monkeypatch.setattr(na, "attention", lambda *a: taken.append(1) or real(*a))
    monkeypatch.delenv(ga.ENV, raising=False)
    ga.grouped_sdpa(module, q, k, v, mask, scaling=0.125)
    assert not taken  # eager: SDPA (the lossless reference never runs it)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    out, _ = ga.grouped_sdpa(module, q, k, v, mask, scaling=0.125)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125, enable_gqa=True).transpose(1, 2)
    assert taken == [1] and out.shape == (1, 2, 6, 64)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    ga.grouped_sdpa(module, q, k, v, mask, scaling=0.125, s_aux=torch.zeros(6))  # attention sinks: not ours
    monkeypatch.setenv(ga.ENV, "sdpa")
    ga.grouped_sdpa(module, q, k, v, mask, scaling=0.125)
    assert taken == [1]


def _wide_heads_llama(tmp_path, dtype: str):
    """A 2-layer random Llama whose heads fit the operator (head dim 64: 2 query heads over 1 key / value head)."""
    config = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
              "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 260,
              "max_position_embeddings": 512, "tie_word_embeddings": True}
    path = tmp_path / "wide_heads.json"
    path.write_text(json.dumps(config))
    return load_model(f"random:{path}", dtype=dtype, device="cpu")


@pytest.mark.parametrize("linear", ["auto", "panel"])
def test_compiled_model_decodes_eager_tokens_through_it(built, tmp_path, monkeypatch, linear):
    """A 2-layer random Llama with head dim 64 under --compile: ar's and a tree method's tokens equal eager ones
    (the eager forward: SDPA and oneDNN, no path shared), and every compiled decode forward runs the operator once
    per layer; with the panels forced for every linear (panel_linear.py) too, each forward then one panels call per
    fused group and ungrouped layer."""
    from specbench.core.model import compile as cc
    from specbench.core.model import linear_kernels as lk

    from .conftest import artifact_options

    monkeypatch.delenv(ga.ENV, raising=False)
    monkeypatch.setenv(lk.ENV, linear)
    target = _wide_heads_llama(tmp_path, "float32")
    methods = {"ar": get_method("ar")(target, {}),
               "ppd": get_method("ppd")(target, {**artifact_options("ppd", target), "tree": "size=4"})}
    eager = {n: m.generate(prompt_ids(0), 12, Sampling(), None).tokens for n, m in methods.items()}
    state = cc.enable(target.model, 128)
    try:
        for name, method in methods.items():
            assert method.generate(prompt_ids(0), 12, Sampling(), None).tokens == eager[name], name
        state.finish_warm_up()
        with torch.profiler.profile() as prof:
            methods["ar"].generate(prompt_ids(1), 4, Sampling(), None)
        assert state.eager_steps == 0
        counts = {e.key: e.count for e in prof.key_averages()}
        calls = counts.get("specbench_native::attention", 0)
        assert calls and calls % 2 == 0, calls  # one per layer of every compiled forward
        if linear == "panel":  # q/k/v, o, gate/up, down per layer, and the LM head: 4 x 2 + 1 a forward
            assert counts.get("specbench_native::panels", 0) == calls // 2 * 9, counts
    finally:
        cc.disable(target.model)


def test_a_bfloat16_compiled_model_runs_it_once_a_layer(built, tmp_path, monkeypatch):
    """In bfloat16 `auto` takes the operator too (it was the two products before): every compiled decode forward of a
    2-layer random Llama calls it once per layer, none runs eager. (Its sums against float32 SDPA's: the bfloat16
    test above; eager bfloat16's tokens are not compared, its linears round differently on each CPU kind.)"""
    from specbench.core.model import compile as cc

    monkeypatch.delenv(ga.ENV, raising=False)
    target = _wide_heads_llama(tmp_path, "bfloat16")
    method = get_method("ar")(target, {})
    state = cc.enable(target.model, 128)
    try:
        method.generate(prompt_ids(0), 4, Sampling(), None)
        state.finish_warm_up()
        with torch.profiler.profile() as prof:
            tokens = method.generate(prompt_ids(1), 4, Sampling(), None).tokens
        assert state.eager_steps == 0 and len(tokens) == 4
        calls = {e.key: e.count for e in prof.key_averages()}.get("specbench_native::attention", 0)
        assert calls and calls % 2 == 0, calls
    finally:
        cc.disable(target.model)
