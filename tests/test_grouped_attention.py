"""--compile's attention on the key / value heads (core/model/grouped_attention.py): the same outputs as
transformers' SDPA path (repeat_kv), with a mask at any query width; switched on and back with a compile state, CPUs
only; and the compile settings per device (CUDA's branch checked without a GPU)."""

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


@pytest.mark.parametrize("width, batch, dtype", [(1, 1, torch.float32), (5, 2, torch.float32), (1, 1, torch.bfloat16),
                                                (16, 1, torch.bfloat16)])
def test_products_equal_sdpa_and_run_only_inside_a_compile(width, batch, dtype, monkeypatch):
    """The compiled CPU path's two products and softmax (grouped_products) equal SDPA with enable_gqa, a fully masked
    key column and the dtype's min included; grouped_sdpa takes them only while compiling, below float32 unless
    SPECBENCH_COMPILE_ATTENTION says otherwise (eager keeps SDPA)."""
    gen = torch.Generator().manual_seed(width)
    heads, kv_heads, keys, dim = 6, 2, 40, 16
    module = types.SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True)
    q = torch.randn(batch, heads, width, dim, generator=gen).to(dtype)
    k, v = (torch.randn(batch, kv_heads, keys, dim, generator=gen).to(dtype) for _ in range(2))
    visible = torch.rand(batch, width, keys, generator=gen) > 0.3
    visible[..., 0], visible[..., -1] = True, False
    mask = torch.zeros(batch, width, keys, dtype=dtype).masked_fill(~visible, torch.finfo(dtype).min)[:, None]
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.25, enable_gqa=True)
    got = ga.grouped_products(q, k, v, mask, 0.25)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)
    taken = []
    monkeypatch.setattr(ga, "grouped_products", lambda *a: taken.append(1) or want)
    ga.grouped_sdpa(module, q, k, v, mask, scaling=0.25)
    assert not taken  # eager: SDPA
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    monkeypatch.delenv(ga.ENV, raising=False)
    ga.grouped_sdpa(module, q, k, v, mask, scaling=0.25)
    assert taken == ([] if dtype == torch.float32 else [1])  # auto: products below float32
    monkeypatch.setenv(ga.ENV, "products")
    ga.grouped_sdpa(module, q, k, v, mask, scaling=0.25)
    monkeypatch.setenv(ga.ENV, "sdpa")
    ga.grouped_sdpa(module, q, k, v, mask, scaling=0.25)
    assert len(taken) == (1 if dtype == torch.float32 else 2)


def test_switched_with_the_compile_state_and_back():
    model = load_model("random:tiny", dtype="float32", device="cpu").model
    assert model.config._attn_implementation == "sdpa"
    cc.enable(model, 64)
    try:
        assert model.config._attn_implementation == ga.NAME
    finally:
        cc.disable(model)
    assert model.config._attn_implementation == "sdpa"


def test_cuda_models_keep_transformers_attention(monkeypatch):
    """On CUDA the grouped path would take SDPA's math kernel (mask + enable_gqa): a CUDA model is left alone."""
    from specbench.core.model import placement

    model = load_model("random:tiny", dtype="float32", device="cpu").model
    monkeypatch.setattr(placement, "input_device", lambda m: torch.device("cuda"))
    ga.use(model)
    assert model.config._attn_implementation == "sdpa"


def test_compile_settings_per_device(monkeypatch):
    """CUDA: CUDA graphs (reduce-overhead's options), no C++ wrapper; CPU: the C++ wrapper unless switched off, built
    with its kernels unless a quick build is asked for. The compiled step is built lazily, so the CUDA branch's
    options are checked here without a GPU."""
    cuda, cpu = cc.settings(torch.device("cuda")), cc.settings(torch.device("cpu"))
    assert cuda["mode"] == "reduce-overhead" and not cuda["cpp_wrapper"]
    assert cpu["mode"] == "default" and cpu["cpp_wrapper"]
    assert cpu["wrapper_build"] == "together" and "wrapper_build" not in cuda
    seen = {}
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.update(kw, fn=fn) or fn)
    cc.compile_step(torch.device("cpu"), "probe")
    assert seen["options"]["cpp_wrapper"] is True and "cpp_wrapper_build_separate" not in seen["options"]
    monkeypatch.setenv(cc.QUICK_BUILD, "1")  # the wrapper built apart from its kernels, at -O1: a quicker compile
    assert cc.settings(torch.device("cpu"))["wrapper_build"] == "apart"
    cc.compile_step(torch.device("cpu"), "probe")
    assert seen["options"]["cpp_wrapper_build_separate"] is True
    monkeypatch.setenv(cc.CPP_WRAPPER, "0")
    assert not cc.settings(torch.device("cpu"))["cpp_wrapper"]
    fn = cc.compile_step(torch.device("cuda"), "probe")
    assert seen["options"]["triton.cudagraphs"] is True and "cpp_wrapper" not in seen["options"]
    assert seen["options"]["guard_filter_fn"] is torch.compiler.skip_guard_on_all_nn_modules_unsafe
    assert fn.__code__ is not cc.step.__code__ and fn.__code__.co_name == "step_probe"  # a code object of its own
