"""Issue 41 §1: targets whose logits or attention need more than a plain LM head and SDPA.

- Final logit soft-capping (Gemma 2: logits = cap * tanh(logits / cap) after the LM head) and the other final
  scalings (Cohere's logit_scale, Granite's logits_scaling): every method reads the target's logits through
  core/batch/forward.target_logits, so tree methods keep the target's distribution at T > 0.
- Attention logit soft-capping (Gemma 2) and attention sinks (gpt-oss) in both batch engines: their logits equal the
  plain transformers forward `model(ids)`, with hybrid sliding windows in both.
Tiny random-weight models built in process; weights drawn large enough that every feature changes the outputs (each
test checks that it does, so a dropped feature cannot pass unnoticed)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from specbench.core.batch.attention import attend
from specbench.core.batch.forward import target_logits
from specbench.core.batch.padded import PaddedBatch
from specbench.core.batch.ragged import RaggedCache, Segment, ragged_forward
from specbench.core.model.load import load_model
from specbench.core.verify import Sampling, warp_probs
from specbench.methods import REGISTRY, get_method
from specbench.methods.batch_loop import generate_batch
from specbench.methods.sd.drafter import layer_drafter

from .conftest import artifact_options, prompt_ids
from .test_sd import SAMPLING, exact_distribution, sampled_distribution, tv

SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 260, "max_position_embeddings": 512}
# Gemma 2: layers alternate a 4-token sliding window and full attention; weights std 0.5 make the raw logits
# (std ~3) and attention scores large enough that both caps change the outputs
GEMMA = {**SMALL, "model_type": "gemma2", "sliding_window": 4, "attn_logit_softcapping": 5.0,
         "final_logit_softcapping": 3.0, "query_pre_attn_scalar": 8, "initializer_range": 0.5}
# gpt-oss: a learned sink logit per head (set to 1.0 below: ~e / (e + row sum) of the attention goes nowhere), two
# experts, the same alternating windows
GPT_OSS = {**SMALL, "model_type": "gpt_oss", "sliding_window": 4, "num_local_experts": 2, "num_experts_per_tok": 1,
           "initializer_range": 0.2, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
LOSSLESS_TREES = sorted(n for n, c in REGISTRY.items() if c.kind == "tree" and c.lossless)


def _load(tmp_path_factory, name: str, config: dict):
    path = tmp_path_factory.mktemp(name) / f"{name}.json"
    path.write_text(json.dumps(config))
    target = load_model(f"random:{path}", "float32", "cpu")
    target.tokenizer.stop_ids = ()  # every generation runs to its cap (the exact distribution has no stop)
    return target


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    return _load(tmp_path_factory, "gemma2", GEMMA)


@pytest.fixture(scope="module")
def gemma_one_window(tmp_path_factory):
    """Every layer slides (one window for all: the padded engine used to run it, dropping the softcap silently)."""
    return _load(tmp_path_factory, "gemma2_slides", {**GEMMA, "layer_types": ["sliding_attention"] * 2})


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    target = _load(tmp_path_factory, "gpt_oss", GPT_OSS)
    with torch.no_grad():
        for layer in target.model.model.layers:
            layer.self_attn.sinks.fill_(1.0)
    return target


def _build(name: str, target, options: dict | None = None):
    cls = get_method(name)
    drafter = layer_drafter(target, [0]) if "drafter" in cls.needs else None
    return cls(target, {**artifact_options(name, target), **(options or {})}, drafter)


# ------------------------------------------------------------------------------------- the target's final logits

@pytest.mark.parametrize("model_type,extra", [
    ("gemma2", {"final_logit_softcapping": 3.0, "query_pre_attn_scalar": 8}),
    ("cohere", {"logit_scale": 0.25}),
    ("granite", {"logits_scaling": 4.0}),
])
def test_target_logits_are_the_models_own(tmp_path_factory, model_type, extra):
    """target_logits(model, hidden states) equals the logits the model's own forward returns, final processing and
    all (and that processing changes them here)."""
    target = _load(tmp_path_factory, model_type, {**SMALL, "model_type": model_type, "initializer_range": 0.5, **extra})
    model, ids = target.model, prompt_ids(0)[:, :12]
    with torch.no_grad():
        h = model.get_decoder()(input_ids=ids).last_hidden_state[0]  # [T, H]
        own = model(ids).logits[0]  # [T, V]
        got = target_logits(model, h)
        assert got.dtype == torch.float32 and got.shape == own.shape
        torch.testing.assert_close(got, own.float(), atol=1e-5, rtol=1e-5)
        assert (model.get_output_embeddings()(h) - own).abs().max() > 0.1  # the bare head is not the model's logits


def test_the_softcap_changes_the_sampled_distribution(gemma):
    """The premise of the distribution tests: capped and uncapped logits give clearly different samples."""
    ids = prompt_ids(0)[:, :20]
    with torch.no_grad():
        h = gemma.model.get_decoder()(input_ids=ids).last_hidden_state[0, -1]
        capped, bare = warp_probs(target_logits(gemma.model, h), SAMPLING), warp_probs(
            gemma.model.get_output_embeddings()(h), SAMPLING)
    assert 0.5 * (capped - bare).abs().sum() > 0.3


@pytest.mark.parametrize("name", LOSSLESS_TREES)
def test_tree_methods_keep_a_softcapped_targets_distribution(gemma, name):
    """T > 0 on a Gemma-2-style target: 2-token samples of every lossless tree method follow the target's exact
    distribution (its own capped logits), as tests/test_sd.py's check does for the tiny Llama."""
    method = _build(name, gemma, {"tree": "size=6"})
    ids = prompt_ids(0)[:, :20]
    exact = exact_distribution(gemma.model, ids, SAMPLING, 2)
    distance = tv(sampled_distribution(method, ids, 2, 800), exact)
    assert distance < 0.1, f"{name}: TV {distance:.3f} from the softcapped target's distribution"


@pytest.mark.parametrize("name", ["ppd", "eagle"])
@pytest.mark.parametrize("mode", ["unpadded", "padded"])
def test_batched_tree_methods_keep_a_softcapped_targets_distribution(gemma, name, mode):
    """The same at batch size 8 on either engine (the batched step reads hidden states, then target_logits)."""
    method = _build(name, gemma, {"tree": "size=6"})
    ids = prompt_ids(0)[:, :20]
    counts: dict[tuple, int] = {}
    for b in range(50):
        gens, _ = generate_batch(method, [ids] * 8, 8, mode, False, 2, SAMPLING,
                                 [torch.Generator().manual_seed(b * 8 + i) for i in range(8)])
        for g in gens:
            counts[tuple(g.tokens)] = counts.get(tuple(g.tokens), 0) + 1
    distance = tv({k: v / 400 for k, v in counts.items()}, exact_distribution(gemma.model, ids, SAMPLING, 2))
    assert distance < 0.12, f"{name} ({mode}): TV {distance:.3f}"


BATCHABLE = sorted(n for n, c in REGISTRY.items() if c.batchable and c.lossless)


@pytest.mark.parametrize("name", sorted(n for n, c in REGISTRY.items() if c.lossless))
def test_greedy_is_lossless_on_a_softcapped_target(gemma, name):
    """T = 0, batch 1: every lossless method emits ar's tokens on the Gemma-2-style target (past its window)."""
    ids = prompt_ids(1, length=12)
    reference = _build("ar", gemma).generate(ids, 24, Sampling(), None).tokens
    assert _build(name, gemma).generate(ids, 24, Sampling(), None).tokens == reference


@pytest.mark.parametrize("name", BATCHABLE)
@pytest.mark.parametrize("mode", ["unpadded", "padded"])
def test_batches_are_lossless_on_gemma2(gemma, name, mode):
    """T = 0, batch 2 on either engine: per sample ar's tokens (softcapped attention, alternating windows)."""
    prompts = [prompt_ids(seed, length=6 + 3 * seed) for seed in range(3)]
    reference = [_build("ar", gemma).generate(p, 16, Sampling(), None).tokens for p in prompts]
    gens, _ = generate_batch(_build(name, gemma), prompts, 2, mode, True, 16, Sampling(), [None] * 3)
    assert [g.tokens for g in gens] == reference


# ------------------------------------------------------------------------ the batch engines against model(ids)

def _switch(model, on: bool) -> None:
    """Turn the attention feature under test (Gemma 2's softcap, gpt-oss's sinks) off or back on."""
    for layer in model.model.layers:
        attn = layer.self_attn
        if hasattr(attn, "sinks"):
            attn.sinks.data.fill_(1.0 if on else -1e4)  # e^-1e4: no sink at all
        else:
            attn.attn_logit_softcapping = model.config.attn_logit_softcapping if on else None


def _engine_logits(model, mode: str, prompts: list[list[int]], more: list[list[int]]) -> list[torch.Tensor]:
    """Each sample's logits over its prompt then its `more` tokens [len(p) + len(m), V], from one engine: the
    prompts joined in one forward, then one step of every sample's extra tokens."""
    if mode == "unpadded":
        cache = RaggedCache(len(prompts))
        first = ragged_forward(model, cache, [Segment(i, p) for i, p in enumerate(prompts)])
        second = ragged_forward(model, cache, [Segment(i, m) for i, m in enumerate(more)])
    else:
        batch = PaddedBatch(model, torch.device("cpu"))
        first = batch.admit([Segment(i, p) for i, p in enumerate(prompts)])
        second = batch.step([Segment(i, m) for i, m in enumerate(more)])
    return [torch.cat([a, b]).float() for a, b in zip(first, second)]


@pytest.mark.parametrize("mode", ["unpadded", "padded"])
@pytest.mark.parametrize("which", ["gemma", "gemma_one_window", "gpt_oss"])
def test_engines_equal_the_plain_forward(request, which, mode):
    """Three samples of different lengths (past the 4-token window), a prompt forward then a step of 1 to 3 tokens:
    every logit equals model(ids)'s for that sample alone; the feature (attention softcap, sinks) matters here."""
    target = request.getfixturevalue(which)
    model = target.model
    prompts = [prompt_ids(seed, length=4 + 2 * seed)[0, :9 + 3 * seed].tolist() for seed in range(3)]
    more = [[5, 6, 7], [8], [9, 10]]
    with torch.no_grad():
        expected = [model(torch.tensor([p + m])).logits[0] for p, m in zip(prompts, more)]
        got = _engine_logits(model, mode, prompts, more)
        _switch(model, False)
        try:
            without = model(torch.tensor([prompts[2] + more[2]])).logits[0]
        finally:
            _switch(model, True)
    assert (without - expected[2]).abs().max() > 0.05, "the feature under test does not change this model's logits"
    for slot, (e, g) in enumerate(zip(expected, got)):
        torch.testing.assert_close(g, e.float(), atol=1e-4, rtol=1e-4, msg=lambda m: f"{which} {mode} slot {slot}: {m}")


# ------------------------------------------------------------------------------ the explicit attention's math

def _reference(query, key, value, allowed, scaling, softcap, sinks):
    """Naive attention: query [B, H, q, D], key / value [B, kv, k, D], allowed [B, 1, q, k] bool -> [B, H, q, D]."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    scores = query @ key.transpose(-1, -2) * scaling  # [B, H, q, k]
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        scores = torch.cat([scores, sinks.view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)], -1)
    probs = scores.softmax(-1)
    return probs[..., :key.shape[2]] @ value


@pytest.mark.parametrize("softcap,sinks", [(None, None), (2.0, None), (None, True), (3.0, True)])
def test_explicit_attention_matches_a_naive_reference(softcap, sinks):
    g = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(shape, generator=g) * 2 for shape in ((3, 4, 5, 8), (3, 2, 7, 8), (3, 2, 7, 8)))
    allowed = torch.rand(3, 1, 5, 7, generator=g) > 0.4
    allowed[..., 0] = True  # never an empty row
    sink = torch.randn(4, generator=g) if sinks else None
    got = attend(query, key, value, allowed, 8 ** -0.5, softcap, sink)
    torch.testing.assert_close(got, _reference(query, key, value, allowed, 8 ** -0.5, softcap, sink))
    if softcap is None and sinks is None:  # the fast path is SDPA's own
        torch.testing.assert_close(got, F.scaled_dot_product_attention(query, key, value, attn_mask=allowed,
                                                                       enable_gqa=True))
