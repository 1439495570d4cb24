"""Verification math: greedy prefix match and the distribution-preserving speculative sampling rule."""

from __future__ import annotations

import pytest
import torch

from specbench.core.verify import (
    Sampling,
    greedy_accept,
    next_token,
    sample,
    speculative_accept,
    tree_speculative_accept,
    tree_typical_accept,
    warp_probs,
)


def test_greedy_accept_prefix_and_bonus():
    logits = torch.full((4, 8), -1.0)
    for pos, tok in enumerate([3, 5, 1, 7]):
        logits[pos, tok] = 1.0
    assert greedy_accept(torch.tensor([3, 5, 2]), logits) == (2, 1)  # mismatch at 2: correction = argmax there
    assert greedy_accept(torch.tensor([3, 5, 1]), logits) == (3, 7)  # all accepted: bonus token
    assert greedy_accept(torch.tensor([4, 5, 1]), logits) == (0, 3)
    assert greedy_accept(torch.tensor([], dtype=torch.long), logits[:1]) == (0, 3)


def _first_token_distribution(p, q, trials, one_hot_draft=None, seed=0):
    """Empirical distribution of the first emitted token when drafts come from q (or are fixed)."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(p.shape[-1])
    for _ in range(trials):
        if one_hot_draft is None:
            x = torch.multinomial(q[0], 1, generator=g)
            n, tok = speculative_accept(x, p, q, g)
        else:
            x = torch.tensor([one_hot_draft])
            n, tok = speculative_accept(x, p, None, g)
        counts[int(x[0]) if n >= 1 else tok] += 1
    return counts / trials


@pytest.mark.parametrize("one_hot", [False, True])
def test_speculative_sampling_preserves_target_distribution(one_hot):
    torch.manual_seed(1)
    vocab = 6
    p = torch.softmax(torch.randn(2, vocab) * 1.5, -1)
    q = torch.softmax(torch.randn(1, vocab) * 1.5, -1)
    emp = _first_token_distribution(p, q, 20000, one_hot_draft=2 if one_hot else None)
    tv = 0.5 * (emp - p[0]).abs().sum()
    assert tv < 0.02, f"TV distance {tv:.4f} to the target distribution"
    # the draft distribution itself is far from p: the test can tell the two apart
    assert 0.5 * (q[0] - p[0]).abs().sum() > 0.1


def test_naive_acceptance_would_fail_the_distribution_test():
    """Negative control: accepting every draft yields q, which the TV check rejects."""
    torch.manual_seed(1)
    p = torch.softmax(torch.randn(2, 6) * 1.5, -1)
    q = torch.softmax(torch.randn(1, 6) * 1.5, -1)
    g = torch.Generator().manual_seed(0)
    draws = torch.multinomial(q[0], 20000, replacement=True, generator=g)
    emp = torch.bincount(draws, minlength=6).float() / 20000
    assert 0.5 * (emp - p[0]).abs().sum() > 0.05


def test_warp_probs_top_k_and_top_p():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0])
    assert (warp_probs(logits, Sampling(1.0, top_k=2)) > 0).tolist() == [True, True, False, False]
    probs = torch.softmax(logits, -1)  # [0.64, 0.24, 0.09, 0.03]
    kept = warp_probs(logits, Sampling(1.0, top_p=0.8)) > 0
    assert kept.tolist() == [True, True, False, False]
    assert torch.allclose(warp_probs(logits, Sampling(1.0)), probs)


def _sampled_draws(generator, inputs):
    """Results of every verify function that draws at random, for seeds 0..19 of `generator`."""
    p, q, logits, tokens, draft = inputs
    parents, hot = [-1, 0, 0, 1], Sampling(temperature=1.0)
    out = []
    for seed in range(20):
        generator.manual_seed(seed)
        out += [speculative_accept(draft, p, q, generator), speculative_accept(draft, p, None, generator),
                tree_speculative_accept(tokens, parents, logits, hot, generator),
                tree_typical_accept(tokens, parents, logits, hot, generator), next_token(logits[0], hot, generator)]
    return out


def test_random_draws_happen_on_the_generators_device():
    """A draw made on the default device instead of the generator's fails (on a GPU: a CUDA generator given a CPU
    tensor). Here the default device is `meta` and the generator a CPU one: every draw must still be on the CPU."""
    torch.manual_seed(2)
    p, q = torch.softmax(torch.randn(3, 6), -1), torch.softmax(torch.randn(2, 6), -1)  # [k+1, V], [k, V]
    logits = torch.randn(4, 6)  # [N, V]: tree root -> 1 -> 3, root -> 2
    inputs = (p, q, logits, torch.tensor([0, 1, 2, 3]), torch.tensor([1, 4]))
    expected = _sampled_draws(torch.Generator(), inputs)
    with torch.device("meta"):
        assert _sampled_draws(torch.Generator(device="cpu"), inputs) == expected


def test_sample_moves_probs_to_the_generators_device(monkeypatch):
    class OtherDeviceGenerator:  # stands for a CUDA generator given CPU probabilities
        device = torch.device("meta")

    seen = []

    def multinomial(probs, n, generator=None):
        seen.append((probs.device, generator.device))
        return torch.zeros(n, dtype=torch.long)

    monkeypatch.setattr(torch, "multinomial", multinomial)
    assert sample(torch.tensor([0.5, 0.5]), OtherDeviceGenerator()) == 0
    assert seen == [(torch.device("meta"), torch.device("meta"))]
