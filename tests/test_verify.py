"""Verification math: greedy prefix match and the distribution-preserving speculative sampling rule."""

from __future__ import annotations

import pytest
import torch

from specbench.core.verify import (
    Sampling,
    greedy_accept,
    next_token,
    sample,
    sample_children,
    speculative_accept,
    tree_greedy_accept,
    tree_sampled_accept,
    tree_speculative_accept,
    tree_typical_accept,
    uniform,
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
    draft_q = torch.softmax(logits.flip(-1), -1)  # [N, V]
    out = []
    for seed in range(20):
        generator.manual_seed(seed)
        out += [speculative_accept(draft, p, q, generator), speculative_accept(draft, p, None, generator),
                tree_speculative_accept(tokens, parents, logits, hot, generator),
                tree_sampled_accept(tokens, parents, logits, draft_q, hot, generator),
                sample_children(draft_q[0], 3, generator).tolist(),
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



# ----------------------------------------------------------------- tree_sampled_accept (children drawn from q)
# The fixed tree of the distribution test: root -> 1, 2, 3 (drawn from q at the root), 1 -> 4, 5 (drawn from q
# after node 1's token). The target is a consistent model: its logits after a path are a row of a table indexed by
# the path (root; depth 1 by token; depth 2 by token), and so is the draft q.
_PARENTS = [-1, 0, 0, 0, 1, 1]
_VOCAB = 5


def _tables(seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """(target logits, draft q), [1 + 2V, V] each: row 0 the root, 1 + x after x at depth 1, 1 + V + x at depth 2."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(1 + 2 * _VOCAB, _VOCAB, generator=g) * 1.5
    q = torch.softmax(torch.randn(1 + 2 * _VOCAB, _VOCAB, generator=g) * 1.5, -1)
    return logits, q


def _exact_pairs() -> torch.Tensor:
    """The target's joint distribution [V, V] of the first two tokens: p(x1 | root) p(x2 | root, x1)."""
    target = torch.softmax(_tables()[0], -1)
    return target[0][:, None] * target[1:1 + _VOCAB]


def _run_tree(accept_fn, trials: int, seed: int = 0) -> tuple[torch.Tensor, float]:
    """(empirical joint distribution [V, V] of the first two tokens emitted by accept_fn on the fixed tree, mean
    number of accepted drafts).

    Every trial re-draws the children from q (sample_children). When a step emits one token only (every root child
    rejected) the second is drawn from the target after it, as the next decoding step would emit it."""
    table, q_table = _tables()
    target, hot = torch.softmax(table, -1), Sampling(temperature=1.0)
    g = torch.Generator().manual_seed(seed)
    zero = torch.zeros(1, dtype=torch.long)
    counts, accepted = torch.zeros(_VOCAB, _VOCAB), 0
    for _ in range(trials):
        first = sample_children(q_table[0], 3, g)  # [3] nodes 1..3
        second = sample_children(q_table[1 + int(first[0])], 2, g)  # [2] nodes 4, 5 (children of node 1)
        tokens = torch.cat([zero, first, second])  # [6]
        rows = torch.cat([zero, 1 + first, 1 + _VOCAB + second])  # [6] table row of each node's path
        path, nxt = accept_fn(tokens, _PARENTS, table[rows], q_table[rows], hot, g)
        emitted = tokens[path[1:]].tolist() + [nxt]
        accepted += len(path) - 1
        if len(emitted) < 2:
            emitted.append(sample(target[1 + emitted[0]], g))
        counts[emitted[0], emitted[1]] += 1
    return counts / trials, accepted / trials


def _no_residual_accept(tokens, parents, logits, draft_q, sampling, generator):
    """Wrong rule: min(1, p/q) acceptance, but a rejection leaves p as it was (no residual)."""
    return _broken_accept(tokens, parents, logits, draft_q, sampling, generator, residual=False)


def _remove_only_accept(tokens, parents, logits, draft_q, sampling, generator):
    """Wrong rule: min(1, p/q) acceptance with the deterministic-draft residual (p(x) = 0, renormalise)."""
    return _broken_accept(tokens, parents, logits, draft_q, sampling, generator, residual=True)


def _broken_accept(tokens, parents, logits, draft_q, sampling, generator, residual):
    toks, path = tokens.tolist(), [0]
    while True:
        p, q = warp_probs(logits[path[-1]], sampling), draft_q[path[-1]]
        for child in [i for i in range(1, len(toks)) if parents[i] == path[-1]]:
            x = toks[child]
            if uniform(generator) < min(1.0, float(p[x] / q[x])):
                path.append(child)
                break
            if residual:
                p[x] = 0.0
                p = p / p.sum()
        else:
            return path, sample(p, generator)


def _deterministic_rule(tokens, parents, logits, draft_q, sampling, generator):
    """tree_speculative_accept (accept with p(x), remove x) on drafts sampled from q: exact for every drafted token,
    hence lossless whatever the drafts' distribution, only less often accepted than min(1, p/q)."""
    return tree_speculative_accept(tokens, parents, logits, sampling, generator)


@pytest.mark.parametrize("rule", [tree_sampled_accept, _deterministic_rule])
def test_tree_sampled_accept_preserves_target_distribution(rule):
    """First token ~ p(. | root) and first two tokens ~ p(x1 | root) p(x2 | root, x1). With n = 20000 trials each
    cell's standard error is at most sqrt(0.25 / n) = 0.0035: a 0.02 bound is over 5 standard errors."""
    (emp, _), exact = _run_tree(rule, 20000), _exact_pairs()
    assert (emp.sum(1) - exact.sum(1)).abs().max() < 0.02, (emp.sum(1), exact.sum(1))
    assert (emp - exact).abs().max() < 0.02, (emp - exact).abs().max()
    # the draft is far from the target (what is drafted is not what is emitted)
    table, q_table = _tables()
    assert 0.5 * (q_table[0] - torch.softmax(table[0], -1)).abs().sum() > 0.2


@pytest.mark.parametrize("broken", [_no_residual_accept, _remove_only_accept])
def test_tree_sampled_distribution_test_detects_wrong_rules(broken):
    """Negative control: the same check, run on a wrong rule, sees a deviation well past its 0.02 bound (5000
    trials: standard error at most 0.007 per cell; the deviations are about 0.19 and 0.15)."""
    emp, _ = _run_tree(broken, 5000)
    assert (emp - _exact_pairs()).abs().max() > 0.05


def test_tree_sampled_accept_accepts_more_than_the_deterministic_rule():
    """min(1, p/q) >= p q: the rule that knows q accepts more of the drafts sampled from q (about 0.95 vs 0.38)."""
    _, with_q = _run_tree(tree_sampled_accept, 3000)
    _, without_q = _run_tree(_deterministic_rule, 3000)
    assert with_q > without_q + 0.1, (with_q, without_q)


def test_tree_sampled_accept_greedy_is_tree_greedy_accept():
    torch.manual_seed(4)
    parents = [-1, 0, 0, 1, 1, 2, 3]
    logits = torch.randn(7, 8)  # [N, V]
    draft_q = torch.softmax(torch.randn(7, 8), -1)
    choice = logits.argmax(-1)
    for tokens in [torch.randint(0, 8, (7,)), torch.cat([choice[:1], choice[torch.tensor(parents[1:])]])]:
        got = tree_sampled_accept(tokens, parents, logits, draft_q, Sampling(), torch.Generator().manual_seed(0))
        assert got == tree_greedy_accept(tokens, parents, logits)
    assert got[0] == [0, 1, 3, 6]  # the all-argmax tree is accepted down its deepest path


def test_tree_sampled_accept_leaf_root_samples_the_target():
    logits, hot = torch.randn(1, 6), Sampling(temperature=0.7, top_k=4)
    for seed in range(10):
        got = tree_sampled_accept(torch.tensor([3]), [-1], logits, torch.full((1, 6), 1 / 6), hot,
                                  torch.Generator().manual_seed(seed))
        assert got == ([0], sample(warp_probs(logits[0], hot), torch.Generator().manual_seed(seed)))


def test_tree_sampled_accept_q_equal_to_p_accepts_the_first_child():
    torch.manual_seed(5)
    parents, hot = [-1, 0, 0, 1, 1], Sampling(temperature=1.0)
    logits = torch.randn(5, 6)
    draft_q = warp_probs(logits, hot)  # q == p everywhere: min(1, p/q) = 1
    tokens = torch.tensor([0, 4, 1, 2, 5])
    for seed in range(50):
        path, _ = tree_sampled_accept(tokens, parents, logits, draft_q, hot, torch.Generator().manual_seed(seed))
        assert path == [0, 1, 3]


def test_tree_sampled_accept_zero_q_child_is_rejected_and_p_kept():
    """A child with q(x) = 0 could not have been drawn from q: it is rejected and p is left as it was."""
    logits = torch.tensor([[30.0, 0.0, 0.0, 0.0]])  # p(0) = 1 (to float precision)
    logits = logits.repeat(2, 1)
    draft_q = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.25] * 4])
    for seed in range(20):
        got = tree_sampled_accept(torch.tensor([2, 0]), [-1, 0], logits, draft_q, Sampling(1.0),
                                  torch.Generator().manual_seed(seed))
        assert got == ([0], 0)


def test_tree_sampled_accept_zero_residual_keeps_p():
    """max(0, p - q) sums to 0 (here q = 2p, so every rejection leaves nothing): the next token comes from p."""
    logits = torch.tensor([[25.0, 0.0, 0.0, 0.0]]).repeat(3, 1)  # p(0) = 1 (to float precision)
    draft_q = 2 * warp_probs(logits, Sampling(1.0))  # p/q = 1/2: each child is accepted half the time
    paths = set()
    for seed in range(40):
        path, nxt = tree_sampled_accept(torch.tensor([0, 0, 0]), [-1, 0, 0], logits, draft_q, Sampling(1.0),
                                        torch.Generator().manual_seed(seed))
        assert nxt == 0
        paths.add(tuple(path))
    assert paths == {(0,), (0, 1), (0, 2)}


def test_sample_children_draws_iid_from_q():
    q = torch.tensor([0.1, 0.0, 0.6, 0.3])
    draws = sample_children(q, 20000, torch.Generator().manual_seed(0))
    assert draws.shape == (20000,) and draws.dtype == torch.long and draws.device == q.device
    assert (torch.bincount(draws, minlength=4).float() / 20000 - q).abs().max() < 0.02
    assert sample_children(q, 0, None).shape == (0,)
    assert len(set(sample_children(torch.tensor([0.5, 0.5]), 8, torch.Generator().manual_seed(1)).tolist())) <= 2
