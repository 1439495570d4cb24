"""`sd`: the target distribution is preserved when sampling (with a negative control), drafter handling, gamma."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM

from specbench.core.model.load import Tokenizer
from specbench.core.verify import Sampling, warp_probs
from specbench.methods.sd.drafter import layer_drafter
from specbench.errors import SpecbenchError
from specbench.methods import get_method
from specbench.methods.sd.method import expected_speedup

from .conftest import prompt_ids

SAMPLING = Sampling(temperature=1.0, top_k=3)  # 2 tokens of 3 candidates each: 9 outcomes to enumerate


def exact_distribution(model, ids: torch.Tensor, sampling: Sampling, n: int) -> dict[tuple, float]:
    """P(first n generated tokens) of `model` under `sampling`, by enumerating every continuation."""
    dist = {(): 1.0}
    with torch.inference_mode():
        for _ in range(n):
            grown = {}
            for prefix, prob in dist.items():
                seq = torch.cat([ids, torch.tensor([prefix], dtype=torch.long).view(1, -1)], 1)
                p = warp_probs(model(seq).logits[0, -1], sampling)  # [V]
                for tok in p.nonzero().flatten().tolist():
                    grown[prefix + (tok,)] = prob * float(p[tok])
            dist = grown
    return dist


def sampled_distribution(method, ids, n: int, trials: int) -> dict[tuple, float]:
    g = torch.Generator().manual_seed(0)
    counts: dict[tuple, int] = {}
    for _ in range(trials):
        key = tuple(method.generate(ids, n, SAMPLING, g).tokens)
        counts[key] = counts.get(key, 0) + 1
    return {k: v / trials for k, v in counts.items()}


def tv(p: dict, q: dict) -> float:
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in set(p) | set(q))


def check_distribution(method, target, trials: int = 800) -> float:
    """TV distance between sampled 2-token continuations and the target's exact distribution (the prompt is one
    where the drafter's first-token distribution is 0.33 in TV from the target's: acceptance is partial)."""
    ids = prompt_ids(0)[:, :20]
    exact = exact_distribution(target.model, ids, SAMPLING, 2)
    return tv(sampled_distribution(method, ids, 2, trials), exact)


def test_sd_sampling_preserves_target_distribution(tiny):
    sd = get_method("sd")(tiny, {"gamma": 2}, layer_drafter(tiny, [0]))
    distance = check_distribution(sd, tiny)
    assert distance < 0.1, f"TV {distance:.3f} between sd samples and the target distribution"


def test_sd_negative_control_accepting_every_draft_fails(tiny, monkeypatch):
    """Accepting drafts without the p/q test yields the drafter's distribution: the check must catch it."""
    import specbench.methods.batch_loop as step_module  # the one step every chain method decodes with

    monkeypatch.setattr(step_module, "accept", lambda draft, logits, sampling, q, g: (
        len(draft), int(torch.multinomial(warp_probs(logits[-1], sampling), 1, generator=g))))
    sd = get_method("sd")(tiny, {"gamma": 2}, layer_drafter(tiny, [0]))
    assert check_distribution(sd, tiny, trials=400) > 0.2


def test_identical_drafter_accepts_everything(tiny):
    """A drafter equal to the target: every draft kept, gamma + 1 tokens per target forward (caches stay in step)."""
    sd = get_method("sd")(tiny, {"gamma": 4}, layer_drafter(tiny, [0, 1]))
    gen = sd.generate(prompt_ids(1), 40, Sampling(), None)
    assert gen.accepted_drafts == gen.drafted > 0
    assert gen.accepted_lengths[:7] == [5] * 7


def test_any_hf_model_with_the_same_tokenizer_drafts(tiny):
    torch.manual_seed(3)
    other = AutoModelForCausalLM.from_config(tiny.model.config, attn_implementation="sdpa").eval()
    drafter = dataclasses.replace(tiny, model=other, spec="random:tiny-seed3")
    ids = prompt_ids(2)
    ar = get_method("ar")(tiny, {}).generate(ids, 32, Sampling(), None)
    got = get_method("sd")(tiny, {"gamma": 3}, drafter).generate(ids, 32, Sampling(), None)
    assert got.tokens == ar.tokens


def test_foreign_vocabulary_is_refused(tiny):
    class OtherVocab:
        def get_vocab(self):
            return {"a": 0, "b": 1}

    drafter = dataclasses.replace(tiny, tokenizer=Tokenizer(OtherVocab(), ()), spec="other")
    with pytest.raises(SpecbenchError, match="different vocabulary"):
        get_method("sd")(tiny, {"gamma": 2}, drafter)


@pytest.mark.parametrize("name", ["sd", "pearl"])
def test_no_drafter_and_none_shipped_is_a_clear_error(tiny, name):
    with pytest.raises(SpecbenchError, match="--drafter"):
        get_method(name)(tiny, {"gamma": 2}, None)


def test_gamma_grows_with_acceptance_and_cheap_drafts():
    target_s = {1: 1.0, 2: 1.0, 4: 1.1, 6: 1.2, 9: 1.4}

    def best(alpha, draft_s):
        return max(range(1, 9), key=lambda g: expected_speedup(g, alpha, draft_s, target_s))

    assert best(0.9, 0.05) > best(0.5, 0.05) >= 1
    assert best(0.8, 0.02) >= best(0.8, 0.3)
    assert all(expected_speedup(g, 0.0, 0.1, target_s) < 1 for g in range(1, 9))  # useless drafter: slower


def test_measured_forward_times_are_per_width_and_never_fall_with_width(tiny):
    from specbench.core.machine.forward_cost import measure_forward_times

    costs = measure_forward_times(tiny.model, tiny.device, (1, 2, 4, 9), rounds=3)
    assert list(costs) == [1, 2, 4, 9]
    values = list(costs.values())
    assert all(v > 0 for v in values) and values == sorted(values)


def with_stop_token(model, stop: int):
    """The model with `stop` as its only stop token."""
    return dataclasses.replace(model, tokenizer=Tokenizer(model.tokenizer.backend, (stop,)))


def test_timeline_counts_tokens_emitted_after_a_stop_token_cut(tiny):
    """A stop token inside a step cuts it: the timeline's emitted tokens add up to the generation's tokens, and
    its mean accepted tokens equals tau (timeline.py)."""
    from specbench.report.timeline import totals

    ids = prompt_ids(1)
    free = get_method("ar")(tiny, {}).generate(ids, 8, Sampling(), None).tokens
    assert free[2] not in free[:2]
    sd = get_method("sd")(with_stop_token(tiny, free[2]), {"gamma": 4}, layer_drafter(tiny, [0, 1]))
    gen = sd.generate(ids, 40, Sampling(), None)
    assert gen.stopped and gen.tokens == free[:3] and gen.accepted_drafts == 4  # one step of 5, cut to 3
    assert sum(s["emitted"] for s in gen.timeline) == len(gen.tokens)
    assert totals(gen.timeline)["mean_accepted_tokens"] == len(gen.tokens) / gen.target_forwards
