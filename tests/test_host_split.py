"""A turn's time split into target forwards, drafting and host overhead (issue 44 §2): forward_s is timed inside
count_fed_tokens (core/machine/forward_clock.py), host_s = wall_s - forward_s - draft_s (run/records.host_split)."""

from __future__ import annotations

import math

import pytest
import torch

from specbench.core.batch.forward import count_fed_tokens, forward
from specbench.core.batch.cache import new_cache
from specbench.run.config import RunConfig
from specbench.run.records import TurnResult, host_split
from specbench.run.own_methods import OwnMethods

from .conftest import prompt_ids


@pytest.fixture(scope="module")
def runner(tiny):
    cfg = RunConfig(methods=("ar", "pld", "ppd", "sd"), model="random:tiny", max_new_tokens=24, repeats=3,
                    options={"artifact": "untrained"})
    from specbench.methods.sd.drafter import layer_drafter

    return OwnMethods(cfg, tiny, layer_drafter(tiny, [0]))


@pytest.mark.parametrize("label", ["ar", "pld", "ppd", "sd"])
def test_forward_and_drafting_fit_in_the_wall_time(runner, label):
    gen, seconds, _ = runner.run_method(runner.methods[label], prompt_ids(3), seed=0)
    assert gen.forward_s > 0 and gen.target_forwards >= 1
    assert gen.forward_s + gen.draft_s <= seconds  # the median call's own parts (runner.timed keeps them together)
    if label == "sd":
        assert gen.draft_s > 0  # the drafter's forwards: drafting, not the target's (it shares the target's head)
    split = host_split(TurnResult(label, 0, prompt_ids(3), gen, seconds, 0.0, {}, 0))
    assert split["forward_s"] == round(gen.forward_s, 6)
    assert split["host_s"] >= 0 and math.isclose(split["forward_s"] + split["host_s"] + gen.draft_s, seconds,
                                                 abs_tol=2e-6)


def test_batched_rows_and_untimed_turns_are_nan(runner):
    gen, seconds, _ = runner.run_method(runner.methods["ar"], prompt_ids(1), seed=0)
    batched = host_split(TurnResult("ar", 0, prompt_ids(1), gen, seconds, 0.0, {}, 0, batch={"batch_size": 2}))
    assert math.isnan(batched["forward_s"]) and math.isnan(batched["host_s"])
    gen.forward_s = 0.0  # an engine that timed no forward
    assert math.isnan(host_split(TurnResult("ar", 0, prompt_ids(1), gen, seconds, 0.0, {}, 0))["forward_s"])


def test_clock_counts_decoder_and_its_head_only(tiny):
    """Forwards are timed (decoder + the head on its output); a head call on other hidden states is not a forward
    of the target (a drafter sharing the head), and nothing is timed outside the block."""
    cache = new_cache(tiny.model)
    with torch.inference_mode(), count_fed_tokens(tiny.model) as fed:
        forward(tiny.model, prompt_ids(0), cache)
    one = fed.forward_s
    assert one > 0 and fed.tokens == prompt_ids(0).shape[1]

    with torch.inference_mode(), count_fed_tokens(tiny.model) as fed:
        other = torch.randn(4096, tiny.model.config.hidden_size)
        for _ in range(50):  # the head on states that are no output of the decoder: not timed
            tiny.model.get_output_embeddings()(other)
    assert fed.forward_s == 0.0 and fed.tokens == 0


def test_timeline_host_is_the_step_time_neither_span_covers():
    from specbench.report.timeline import host_gaps, totals

    sd = {"mode": "sd", "t0": 0.0, "t1": 1.0, "draft": [0.1, 0.4], "target": [0.5, 0.9], "emitted": 2, "sampled": 1}
    assert [x for gap in host_gaps(sd) for x in gap] == pytest.approx([0.0, 0.1, 0.4, 0.1, 0.9, 0.1])
    pearl = {**sd, "mode": "pre", "draft": [0.0, 0.6], "target": [0.2, 1.0]}  # overlapping: no host left
    assert host_gaps(pearl) == []
    both = totals([sd, pearl])
    assert both["host_s"] == pytest.approx(0.3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (CUDA event pairs)")
def test_gpu_forwards_timed_with_event_pairs_read_at_the_end():
    from specbench.core.model.load import load_model
    from specbench.core.machine.forward_clock import ForwardClock

    gpu = load_model("random:tiny", dtype="float32", device="cuda")
    assert ForwardClock(gpu.model).mode == "events"
    cache = new_cache(gpu.model)
    with torch.inference_mode(), count_fed_tokens(gpu.model) as fed:
        for _ in range(3):
            forward(gpu.model, prompt_ids(0).cuda(), cache)
    assert fed.forward_s > 0 and fed.tokens == 3 * prompt_ids(0).shape[1]


def test_medusa_heads_are_drafting_not_host(tiny):
    """Medusa's next guesses are its heads' forward (and the LM head on them): timed as draft_s (step.py), so they
    leave host_s; a proposer that runs no model of its own in `advance` (ppd) adds no drafting time."""
    from specbench.core.verify import Sampling
    from specbench.methods import get_method

    from .conftest import artifact_options

    medusa = get_method("medusa")(tiny, artifact_options("medusa", tiny))
    ppd = get_method("ppd")(tiny, {"artifact": "untrained"})
    assert medusa.proposer.advance_drafts and not ppd.proposer.advance_drafts
    with torch.inference_mode():
        gen = medusa.generate(prompt_ids(3), 16, Sampling(), None)
        plain = ppd.generate(prompt_ids(3), 16, Sampling(), None)
    assert gen.target_forwards > 1 and gen.draft_s > 0
    assert plain.draft_s == 0
