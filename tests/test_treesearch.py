"""PPD dynamic sparse tree search: optimality, Markov chain, greedy removal, and the authors' published trees."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from specbench.errors import SpecbenchError
from specbench.planning.treesearch import (
    StateTree,
    end_probs,
    f_value,
    optimal_candidates,
    removal_loss,
    remove_prompt_tokens,
    search,
    static_tree,
    stationary,
    transition_matrix,
)

# The PPD authors' facts for Vicuna-7B (hmarkc/parallel-prompt-decoding @2ba3a1c,
# prompt/inference/dynamic_sparse_trees_3_vicuna_7b.py): per-rank acceptance of the 3 prompt tokens, recovered from
# their stored size-500 dynamic sparse tree, and their trees of sizes 50 and 105 (state -> [path of ranks, end
# probability, prompt tokens appended]). Kept beside this file so the test never depends on the working directory.
AUTHORS = json.loads((Path(__file__).resolve().parent / "data" / "ppd-vicuna7b-dynamic-trees.json").read_text())
VICUNA7B = AUTHORS["acceptance"]
SMALL = [[0.5, 0.2, 0.1], [0.4, 0.3, 0.05], [0.35, 0.2, 0.1]]


def _all_paths(acc, depth):
    paths = []
    for d in range(1, depth + 1):
        paths += list(itertools.product(*(range(len(acc[j])) for j in range(d))))
    return paths


def _is_tree(paths):
    s = set(paths)
    return all(len(p) == 1 or p[:-1] in s for p in paths)


@pytest.mark.parametrize("n_c, depth", [(1, 1), (3, 2), (4, 2), (5, 3), (6, 3)])
def test_optimal_candidates_equal_brute_force(n_c, depth):
    best = max(f_value(list(c), SMALL) for c in itertools.combinations(_all_paths(SMALL, depth), n_c)
               if _is_tree(c))
    got = optimal_candidates(SMALL, n_c, depth)
    assert _is_tree(got) and len(got) == n_c and max(len(p) for p in got) <= depth
    assert f_value(got, SMALL) == pytest.approx(best)


def test_stationary_distribution_solves_pi_p_equals_pi():
    for m in (2, 3, 5):
        rng = np.random.default_rng(m)
        P = rng.random((m, m))
        P /= P.sum(1, keepdims=True)
        pi = stationary(P)
        assert pi.sum() == pytest.approx(1.0)
        assert np.allclose(pi @ P, pi, atol=1e-10)
    trees = search(VICUNA7B, 3, 50).trees
    P = transition_matrix(trees, VICUNA7B, 3)
    assert np.allclose(P.sum(1), 1.0)  # every state's end probabilities (root included) sum to one


def test_end_probabilities_sum_to_one():
    paths = optimal_candidates(SMALL, 6, 3)
    root, ends = end_probs(paths, SMALL)
    assert root + sum(ends) == pytest.approx(1.0) and min(ends) >= 0


def test_each_greedy_removal_takes_the_smallest_loss():
    paths = optimal_candidates(SMALL, 5, 3)
    f_by_state = {0: 0.0, **{k: f_value(optimal_candidates(SMALL, 5, k), SMALL) for k in (1, 2, 3)}}
    _, ends = end_probs(paths, SMALL)
    tree = StateTree(paths, [3] * len(paths))
    for budget in range(tree.size - 1, len(paths) * 2 - 1, -1):
        before = list(tree.prompt_tokens)
        tree = remove_prompt_tokens(tree, budget, SMALL, f_by_state)
        changed = [j for j, (a, b) in enumerate(zip(before, tree.prompt_tokens)) if a != b]
        assert len(changed) == 1
        probe = StateTree(paths, before)
        losses = [removal_loss(probe, j, ends, f_by_state) for j, c in enumerate(before) if c > 1]
        assert removal_loss(probe, changed[0], ends, f_by_state) == pytest.approx(min(losses))


@pytest.mark.parametrize("size", [50, 105])
def test_search_reproduces_the_authors_vicuna7b_trees(size):
    result = search(VICUNA7B, 3, size)
    assert all(t.size <= size for t in result.trees.values())
    published = AUTHORS["trees"][str(size)]
    for state, nodes in published.items():
        mine = result.trees[int(state)]
        assert dict(zip(mine.paths, mine.prompt_tokens)) == {tuple(p): k for p, _, k in nodes}


def test_dynamic_beats_static_and_tau_grows_with_size():
    taus = [search(VICUNA7B, 3, n).tau for n in (8, 16, 32, 64)]
    assert taus == sorted(taus) and taus[0] > 1.0
    assert search(VICUNA7B, 3, 64).R >= static_tree(VICUNA7B, 3, 64).R


def test_bad_sizes_and_tables():
    with pytest.raises(SpecbenchError, match="too small"):
        search(VICUNA7B, 3, 1)
    with pytest.raises(SpecbenchError, match="prompt-token rows"):
        search(VICUNA7B[:2], 3, 20)
