"""Every registered method: greedy output identical to `ar` in float32 (the lossless test), plus per-method checks."""

from __future__ import annotations

import pytest
import torch

from specbench.core.verify import Sampling
from specbench.methods.sd.drafter import layer_drafter
from specbench.methods import REGISTRY, get_method
from specbench.methods.pld import lookup_draft

from .conftest import artifact_options, prompt_ids


def build(name: str, target, options: dict | None = None):
    """Instantiate a method with what it needs on the tiny model."""
    cls = get_method(name)
    # drafter methods: one of the target's two layers as the drafter (another model, so acceptance is partial)
    drafter = layer_drafter(target, [0]) if "drafter" in cls.needs else None
    if (options or {}).get("artifact") is None:  # ppd, medusa, hidden-transfer: random artefacts
        options = {**(options or {}), **artifact_options(name, target)}
    return cls(target, options or {}, drafter)


@pytest.mark.parametrize("name", sorted(REGISTRY))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_output_equals_ar(tiny, name, seed):
    ids = prompt_ids(seed)
    reference = build("ar", tiny).generate(ids, 48, Sampling(), None)
    got = build(name, tiny).generate(ids, 48, Sampling(), None)
    assert got.tokens == reference.tokens
    assert len(got.tokens) <= 48
    assert got.target_forwards >= 1
    assert sum(got.accepted_lengths) == len(got.tokens)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_sampling_is_reproducible_with_a_seed(tiny, name):
    ids = prompt_ids(5)
    sampling = Sampling(temperature=1.0, top_k=20)
    runs = [build(name, tiny).generate(ids, 24, sampling, torch.Generator().manual_seed(7)).tokens
            for _ in range(2)]
    assert runs[0] == runs[1]
    assert len(runs[0]) > 0


def test_ar_matches_hf_generate(tiny):
    ids = prompt_ids(3)
    ours = build("ar", tiny).generate(ids, 40, Sampling(), None).tokens
    hf = tiny.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=False,
                              eos_token_id=None, pad_token_id=0)
    assert ours == hf[0, ids.shape[1]:].tolist()[: len(ours)]


def test_ar_stops_at_stop_token(tiny):
    ids = prompt_ids(0)
    full = build("ar", tiny).generate(ids, 30, Sampling(), None).tokens
    stop_at = full[5]
    first = full.index(stop_at)
    tiny_stop = tiny.tokenizer.stop_ids
    try:
        tiny.tokenizer.stop_ids = (stop_at,)
        gen = build("ar", tiny).generate(ids, 30, Sampling(), None)
        assert gen.tokens == full[: first + 1] and gen.stopped
    finally:
        tiny.tokenizer.stop_ids = tiny_stop


def test_lookup_draft_copies_after_latest_match():
    history = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert lookup_draft(history, 3, 2) == [7, 8]  # latest earlier "1 2 3" is followed by 7 8
    assert lookup_draft([4, 5, 6], 3, 5) == []
    assert lookup_draft([1, 2, 1], 3, 3) == [2, 1]  # falls back to a 1-gram


def test_pld_drafts_and_saves_forwards_on_repetitive_prompts(tiny):
    ids = prompt_ids(0)
    gen = build("pld", tiny).generate(ids, 48, Sampling(), None)
    assert gen.drafted > 0
    assert gen.accepted_drafts > 0, "the tiny model repeats itself: prompt lookup should hit"
    assert gen.target_forwards < len(gen.tokens)


def test_register_refuses_a_second_method_under_a_taken_name():
    """A registry name is never silently replaced: another class under `pld` is refused, naming both."""
    from specbench.methods.base import REGISTRY, DecodeMethod, register

    class Impostor(DecodeMethod):
        name, kind = "pld", "draft-free"

    with pytest.raises(ValueError, match="taken by specbench.methods.pld"):
        register(Impostor)
    assert REGISTRY["pld"] is not Impostor
    assert register(REGISTRY["pld"]) is REGISTRY["pld"]  # the same class again is harmless
