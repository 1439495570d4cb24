"""`--compile` on sliding-window models: the static engine's masks apply each layer's window as the single engine and
transformers do, so a prompt longer than the window decodes to eager's tokens, and samples at T > 0 follow the
target's distribution.

Tiny random shapes, window 16, every prompt 60 tokens (past the window from the first step): Mistral (every layer
slides: one windowed mask), Gemma 2 and Gemma 3 (sliding and full layers alternate: a mask per layer kind; Gemma 2
with its attention and final logit soft-capping, on eager attention). sd's layer drafter cannot run Gemma 3 (its
rotary embedding takes a layer kind the drafter does not pass, eager or compiled): there sd is left out."""

from __future__ import annotations

import json

import pytest
import torch

from specbench.core.batch import static
from specbench.core.batch.ragged import Segment
from specbench.core.model import compile as cc
from specbench.core.model.load import load_model
from specbench.core.verify import Sampling
from specbench.methods import get_method
from specbench.methods.sd.drafter import layer_drafter

from .conftest import artifact_options, prompt_ids
from .test_compile_methods import _Counted
from .test_sd import SAMPLING, exact_distribution, sampled_distribution, tv

WINDOW = 16
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=260, max_position_embeddings=512)
SHAPES = {
    "mistral": dict(SMALL, model_type="mistral", sliding_window=WINDOW),
    "gemma2": dict(SMALL, model_type="gemma2", sliding_window=WINDOW, head_dim=16, query_pre_attn_scalar=16),
    "gemma3": dict(SMALL, model_type="gemma3_text", sliding_window=WINDOW, head_dim=16, query_pre_attn_scalar=16,
                   layer_types=["sliding_attention", "full_attention"]),
}
NEW_TOKENS = 16


def _load(folder, name: str):
    path = folder / f"{name}.json"
    path.write_text(json.dumps(SHAPES[name]))
    target = load_model(f"random:{path}", "float32", "cpu")
    target.tokenizer.stop_ids = ()  # every generation runs to its cap
    return target


@pytest.fixture(scope="module", params=sorted(SHAPES))
def windowed(request, tmp_path_factory):
    target = _load(tmp_path_factory.mktemp("win"), request.param)
    yield target
    cc.disable(target.model)


def _prompt(seed: int) -> torch.Tensor:
    ids = prompt_ids(seed, length=24)  # [1, 60]
    assert ids.shape[1] > 3 * WINDOW
    return ids


def _uncompiled_state(model, capacity=128):
    state = cc.Compiled(model, capacity)
    state.fn = static.step  # the static step's masks and padding, without compiling
    return state


@torch.inference_mode()
def test_static_step_logits_equal_the_models_past_the_window(windowed):
    """Prefill, a padded plain segment, a single token and a tree segment (compacted after): every row's logits
    equal `model(x).logits` of the whole sequence."""
    model = windowed.model
    assert {w for w in cc.Compiled(model, 128).windows} >= {WINDOW}
    ids = _prompt(0)[0]
    full = model(ids[None]).logits[0].float()  # [60, V]
    state = _uncompiled_state(model)
    state.declare(4)
    engine = static.StaticSequence(model, state)
    prefill = engine.forward([Segment(0, ids[:40].tolist(), keep=40)], [])[0][0]
    torch.testing.assert_close(prefill, full[:40], rtol=1e-4, atol=1e-4)
    plain = engine.forward([], [Segment(0, ids[40:43].tolist())])[1][0]  # width 3 at bucket 4
    torch.testing.assert_close(plain, full[40:43], rtol=1e-4, atol=1e-4)
    one = engine.forward([], [Segment(0, ids[43:44].tolist())])[1][0]
    torch.testing.assert_close(one, full[43:44], rtol=1e-4, atol=1e-4)
    # a tree: root ids[44], a wrong child and the right one (ids[45]) at the same depth; the right path is kept
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    past = engine.lengths[0]
    seg = Segment(0, [int(ids[44]), int(ids[45]) ^ 1, int(ids[45])], positions=[past, past + 1, past + 1],
                  mask=tree)
    out = engine.forward([], [seg])[1][0]
    torch.testing.assert_close(out[[0, 2]], full[44:46], rtol=1e-4, atol=1e-4)
    engine.keep_offsets(0, past, [0, 2])
    after = engine.forward([], [Segment(0, ids[46:50].tolist())])[1][0]
    torch.testing.assert_close(after, full[46:50], rtol=1e-4, atol=1e-4)


def test_windowless_static_masks_differ_on_these_models(windowed):
    """The check above is not vacuous: the same static step without windows gives other logits past the window."""
    model = windowed.model
    ids = _prompt(0)[0]
    with torch.inference_mode():
        full = model(ids[None]).logits[0].float()
        state = _uncompiled_state(model)
        state.kv.windows = ()
        out = static.StaticSequence(model, state).forward([Segment(0, ids[:40].tolist(), keep=40)], [])[0][0]
    assert (out[WINDOW + 4:] - full[WINDOW + 4:40]).abs().max() > 1e-2


def _drafter_runs(target) -> bool:
    return target.model.config.model_type != "gemma3_text"


def _methods(target):
    drafter = layer_drafter(target, [0])
    ppd = dict(artifact_options("ppd", target), tree="size=6")
    methods = {"ar": get_method("ar")(target, {}), "ppd": get_method("ppd")(target, ppd)}
    if _drafter_runs(target):
        methods["sd"] = get_method("sd")(target, {"gamma": 2}, drafter)
    return drafter, methods


def test_compiled_tokens_equal_eager_past_the_window(windowed):
    """The issue's bar: greedy tokens under torch.compile (ar, a tree method, sd with its drafter compiled too)
    equal eager's on a prompt longer than the window, every forward after warm-up compiled."""
    target = windowed
    drafter, methods = _methods(target)
    check = _prompt(1)
    eager = {name: m.generate(check, NEW_TOKENS, Sampling(), None).tokens for name, m in methods.items()}
    assert all(tokens == eager["ar"] for tokens in eager.values())
    states = {"target": cc.enable(target.model, 128), "drafter": cc.enable(drafter.model, 128)}
    try:
        counters = {}
        for role, state in states.items():
            state.fn = counters[role] = _Counted(state.fn)
            for method in methods.values():
                state.declare(cc.declared_width(method))
        for method in methods.values():  # warm-up
            method.generate(_prompt(0), NEW_TOKENS, Sampling(), None)
        for state in states.values():
            state.finish_warm_up()
        before = {role: c.calls for role, c in counters.items()}
        for name, method in methods.items():
            assert method.generate(check, NEW_TOKENS, Sampling(), None).tokens == eager[name], name
        assert all(s.eager_steps == 0 for s in states.values())
        assert counters["target"].calls > before["target"]
        assert counters["drafter"].calls > before["drafter"] or not _drafter_runs(target)
    finally:
        cc.disable(target.model)
        cc.disable(drafter.model)


def test_compiled_sd_samples_the_targets_distribution_past_the_window(windowed):
    """T > 0 under torch.compile: sd's two-token samples (target and drafter compiled) follow the target's exact
    distribution over a prompt longer than the window (total variation distance)."""
    target = windowed
    if not _drafter_runs(target):
        pytest.skip("sd's layer drafter cannot run Gemma 3 (the module docstring says why)")
    drafter = layer_drafter(target, [0])
    sd = get_method("sd")(target, {"gamma": 2}, drafter)
    ids = _prompt(0)
    states = [cc.enable(target.model, 128), cc.enable(drafter.model, 128)]
    try:
        for state in states:
            state.declare(cc.declared_width(sd))
        sd.generate(ids, 2, SAMPLING, torch.Generator().manual_seed(0))  # warm-up
        for state in states:
            state.finish_warm_up()
        sampled = sampled_distribution(sd, ids, 2, 800)
        assert all(s.eager_steps == 0 for s in states)
    finally:
        cc.disable(target.model)
        cc.disable(drafter.model)
    distance = tv(sampled, exact_distribution(target.model, ids, SAMPLING, 2))
    assert distance < 0.1, f"TV {distance:.3f} between compiled sd samples and the target distribution"
