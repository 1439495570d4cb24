"""PPD's hardware-aware dynamic sparse tree search (PPD paper §4.2, Definition 4.1, Propositions 4.1-4.4).

Notation. acc[d][r] = probability that the rank-r guess of prompt token d+1 is accepted given its parent was
(estimated on validation data, hardware-independent). A candidate node is a path of ranks (r_1, ..., r_d); its
acceptance probability is p(v) = prod_j acc[j][r_j]. With m prompt tokens the tree has m states: state k is the
number of prompt tokens the last accepted node carried, which bounds the next candidate tree's depth by k.
  f(T_k)  = sum over candidates v of p(v)                        expected accepted candidates (Prop. 4.1)
  e(v)    = p(v) - sum over children c of p(c)                   probability the accepted path ends at v
  P[k, i] = sum over v in T_k carrying i prompt tokens of e(v)    state transitions (the root carries m)
  pi P = pi, sum pi = 1                                          stationary distribution (Prop. 4.4)
  R(T)    = sum_k pi_k f(T_k),  tau = 1 + R                     (+1: the target's own token every step)
Size n counts candidate nodes plus the prompt tokens attached to them (the root and its m prompt tokens are
always there and not counted, as in the authors' published trees); a forward's input width is n + 1 + m.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..errors import SpecbenchError

Path = tuple[int, ...]


@dataclass
class StateTree:
    """One state's tree: candidate paths (parents before children) and the prompt tokens each carries."""

    paths: list[Path]
    prompt_tokens: list[int]

    @property
    def size(self) -> int:
        return len(self.paths) + sum(self.prompt_tokens)


def path_prob(path: Path, acc) -> float:
    prob = 1.0
    for depth, rank in enumerate(path):
        prob *= acc[depth][rank]
    return prob


@lru_cache(maxsize=4096)
def _optimal_candidates_cached(acc: tuple, n_c: int, max_depth: int) -> tuple[Path, ...]:
    return tuple(optimal_candidates(acc, n_c, max_depth))


def optimal_candidates(acc, n_c: int, max_depth: int) -> list[Path]:
    """The n_c paths of depth <= max_depth with the largest p(v) (best-first; maximises f, Prop. 4.1).

    A child's probability never exceeds its parent's, so the best n_c paths always form a tree; ties are broken
    towards shallower, lower-rank paths so parents come first."""
    ranks = len(acc[0])
    heap = [(-acc[0][r], (r,)) for r in range(ranks)]
    heapq.heapify(heap)
    chosen: list[Path] = []
    while heap and len(chosen) < n_c:
        neg, path = heapq.heappop(heap)
        chosen.append(path)
        if len(path) < min(max_depth, len(acc)):
            for r in range(len(acc[len(path)])):
                heapq.heappush(heap, (neg * acc[len(path)][r], path + (r,)))
    return sorted(chosen, key=lambda p: (len(p), p))


def f_value(paths: list[Path], acc) -> float:
    return sum(path_prob(p, acc) for p in paths)


def end_probs(paths: list[Path], acc) -> tuple[float, list[float]]:
    """(root end probability, end probability of each path): P(accepted path ends exactly there)."""
    probs = {p: path_prob(p, acc) for p in paths}
    child_mass = {p: 0.0 for p in paths}
    root_children = 0.0
    for p, prob in probs.items():
        if len(p) == 1:
            root_children += prob
        else:
            child_mass[p[:-1]] += prob
    return 1.0 - root_children, [probs[p] - child_mass[p] for p in paths]


@lru_cache(maxsize=65536)
def _stats(acc_key: tuple, paths: tuple[Path, ...]) -> tuple[float, float, tuple[float, ...]]:
    root_end, ends = end_probs(list(paths), acc_key)
    return f_value(list(paths), acc_key), root_end, tuple(ends)


def tree_stats(paths: list[Path], acc) -> tuple[float, float, tuple[float, ...]]:
    """(f, root end probability, end probabilities) of a candidate tree, memoised (the search asks often)."""
    return _stats(tuple(tuple(row) for row in acc), tuple(paths))


def transition_matrix(trees: dict[int, StateTree], acc, m: int) -> np.ndarray:
    """P[k-1, i-1] = probability that state k leads to state i (the root carries m prompt tokens)."""
    P = np.zeros((m, m))
    for k, tree in trees.items():
        _, root_end, ends = tree_stats(tree.paths, acc)
        P[k - 1, m - 1] += root_end
        for e, count in zip(ends, tree.prompt_tokens):
            P[k - 1, count - 1] += e
    return P


def stationary(P: np.ndarray) -> np.ndarray:
    """Exact stationary distribution of a row-stochastic matrix: solve pi (P - I) = 0 with sum(pi) = 1."""
    m = P.shape[0]
    A = np.vstack([(P - np.eye(m)).T, np.ones((1, m))])
    b = np.zeros(m + 1)
    b[-1] = 1.0
    pi, *_ = np.linalg.lstsq(A, b, rcond=None)
    pi = np.clip(pi, 0.0, None)
    return pi / pi.sum()


def removal_loss(tree: StateTree, index: int, ends: list[float], f_by_state: dict[int, float]) -> float:
    """Delta F of removing one prompt token from candidate `index` (Prop. 4.3): p(c) (f(T_i) - f(T_{i-1})).

    p(c) is taken as c's end probability e(c): the next state depends on c's prompt tokens only when the
    accepted path ends at c. The authors' published trees agree with this reading (with e(c) our search
    reproduces their Vicuna-7B size-50 and size-105 trees; with the plain acceptance probability it does not)."""
    i = tree.prompt_tokens[index]
    return ends[index] * (f_by_state[i] - f_by_state[i - 1])


def remove_prompt_tokens(tree: StateTree, budget: int, acc, f_by_state: dict[int, float]) -> StateTree:
    """Greedily remove the prompt token with the smallest loss until the tree's size is within budget
    (every candidate keeps at least one prompt token)."""
    counts = list(tree.prompt_tokens)
    work = StateTree(tree.paths, counts)
    _, _, ends = tree_stats(tree.paths, acc)
    # a node's loss depends only on its own count, so a heap of each node's next loss gives the greedy order
    heap = [(removal_loss(work, j, ends, f_by_state), j) for j, c in enumerate(counts) if c > 1]
    heapq.heapify(heap)
    excess = work.size - budget
    while excess > 0 and heap:
        _, j = heapq.heappop(heap)
        counts[j] -= 1
        excess -= 1
        if counts[j] > 1:
            heapq.heappush(heap, (removal_loss(work, j, ends, f_by_state), j))
    return work


def max_candidates(acc, depth: int) -> int:
    total, level = 0, 1
    for d in range(min(depth, len(acc))):
        level *= len(acc[d])
        total += level
    return total


def build_states(acc, m: int, n_c: dict[int, int], n: int) -> dict[int, StateTree]:
    """Trees for every state with the given candidate counts, prompt tokens greedily removed to size n."""
    key = tuple(tuple(row) for row in acc)
    cands = {k: list(_optimal_candidates_cached(key, min(n_c[k], max_candidates(acc, k)), k))
             for k in range(1, m + 1)}
    f_by_state = {k: tree_stats(c, acc)[0] for k, c in cands.items()}
    f_by_state[0] = 0.0
    return {k: remove_prompt_tokens(StateTree(c, [m] * len(c)), n, acc, f_by_state) for k, c in cands.items()}


def amortized(trees: dict[int, StateTree], acc, m: int) -> tuple[float, np.ndarray]:
    """(R(T), stationary distribution) of a dynamic tree."""
    pi = stationary(transition_matrix(trees, acc, m))
    return float(sum(pi[k - 1] * tree_stats(t.paths, acc)[0] for k, t in trees.items())), pi


@dataclass
class DynamicTree:
    size: int
    trees: dict[int, StateTree]
    R: float
    pi: list[float]

    @property
    def tau(self) -> float:
        return 1.0 + self.R


def search(acc, m: int, n: int, refine_rounds: int = 3) -> DynamicTree:
    """Best dynamic sparse tree of size <= n: every split of n into candidates and prompt tokens (the same
    candidate count in every state), then coordinate ascent on each state's candidate count."""
    if n < 2:
        raise SpecbenchError(f"tree size {n} is too small: every candidate needs at least one prompt token (n >= 2)")
    if m < 1 or len(acc) < m:
        raise SpecbenchError(f"acceptance table has {len(acc)} prompt-token rows; need at least {m}")

    def evaluate(n_c: dict[int, int]) -> tuple[float, dict[int, StateTree], np.ndarray]:
        trees = build_states(acc, m, n_c, n)
        if any(t.size > n for t in trees.values()):
            return -1.0, trees, np.zeros(m)
        R, pi = amortized(trees, acc, m)
        return R, trees, pi

    best = max((evaluate({k: c for k in range(1, m + 1)}) + (c,) for c in range(1, n // 2 + 1)),
               key=lambda x: x[0])
    R, trees, pi, c = best
    counts = {k: c for k in range(1, m + 1)}
    window = range(max(1, c - n // 8 - 2), min(n // 2, c + n // 8 + 2) + 1)  # per-state optima lie near c
    for _ in range(refine_rounds):
        improved = False
        for k in range(1, m + 1):
            for alt in window:
                trial = {**counts, k: alt}
                r2, t2, p2 = evaluate(trial)
                if r2 > R + 1e-12:
                    R, trees, pi, counts, improved = r2, t2, p2, trial, True
        if not improved:
            break
    unreachable = {k: c for k in counts if pi[k - 1] < 1e-9}  # R ignores them: keep the joint choice
    if unreachable:
        counts.update(unreachable)
        R, trees, pi = evaluate(counts)
    return DynamicTree(n, trees, R, [float(x) for x in pi])


def static_tree(acc, m: int, n: int) -> DynamicTree:
    """Ablation (PPD Fig. 8a): every candidate carries all m prompt tokens, n_c = n // (m + 1) in every state."""
    n_c = max(1, n // (m + 1))
    trees = {k: StateTree(optimal_candidates(acc, min(n_c, max_candidates(acc, k)), k),
                          [m] * min(n_c, max_candidates(acc, k))) for k in range(1, m + 1)}
    R, pi = amortized(trees, acc, m)
    return DynamicTree(n, trees, R, [float(x) for x in pi])


def random_tree(acc, m: int, n: int, seed: int = 0) -> DynamicTree:
    """Ablation: random candidate trees (random growth), prompt tokens allocated as in the dynamic tree."""
    rng = random.Random(seed)
    n_c = max(1, n // (m + 1))
    trees = {}
    f_by_state = {0: 0.0}
    cands = {}
    for k in range(1, m + 1):
        paths: list[Path] = []
        frontier: list[Path] = [(r,) for r in range(len(acc[0]))]
        while frontier and len(paths) < n_c:
            p = frontier.pop(rng.randrange(len(frontier)))
            paths.append(p)
            if len(p) < min(k, len(acc)):
                frontier += [p + (r,) for r in range(len(acc[len(p)]))]
        cands[k] = sorted(paths, key=lambda p: (len(p), p))
        f_by_state[k] = f_value(cands[k], acc)
    for k, c in cands.items():
        trees[k] = remove_prompt_tokens(StateTree(c, [m] * len(c)), n, acc, f_by_state)
    R, pi = amortized(trees, acc, m)
    return DynamicTree(n, trees, R, [float(x) for x in pi])


@dataclass
class CandidateTree:
    """A one-state tree whose guesses cost no input width (Medusa heads): candidate paths and tau = 1 + f(T)."""

    paths: list[Path]
    tau: float

    @property
    def size(self) -> int:
        return len(self.paths)


def static_candidates(acc, n: int) -> CandidateTree:
    """The n most probable candidate paths (depth <= len(acc)): the best one-state tree of n candidates (Prop. 4.1:
    f is maximised best-first); every step is the same state, so tau = 1 + f(T)."""
    paths = list(_optimal_candidates_cached(tuple(tuple(r) for r in acc), n, len(acc)))
    return CandidateTree(paths, 1.0 + f_value(paths, acc))
