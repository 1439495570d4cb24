"""Verification math: greedy prefix match and the distribution-preserving speculative sampling rule."""

from __future__ import annotations

import pytest
import torch

from specbench.core.verify import (
    Sampling,
    greedy_accept,
    speculative_accept,
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
