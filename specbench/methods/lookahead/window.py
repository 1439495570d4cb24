"""Lookahead decoding's state and one-forward layout (Fu et al. 2024, "Break the Sequential Dependency of LLM
Inference Using Lookahead Decoding", ICML, §3.1-3.3 and Fig. 3): the 2D window of the lookahead branch, the n-gram
pool, and the candidates of the verification branch as a trie, laid out in one input with its visibility and
positions.

The window holds N - 1 levels of W tokens. Level l, column i sits at position root + l + i (level 0, column 0 is
the root: the last emitted token, not yet in the cache). Each level is one Jacobi iteration further along a
diagonal: input (l, i) sees the context, level 0's columns 0..i and column i of levels 1..l, so its output guesses
position root + l + i + 1 from the guesses before it. The last level's outputs (argmax) become the next level; with
level 0 .. N - 2 column i they close the n-gram (level 0[i], ..., level N-2[i], new[i]) that the pool keeps under
its first token. After each step the levels move down one (level 1 becomes level 0, ...), as the authors' code
does whatever the step accepted.

Verification: up to G n-grams of the pool whose first token is the root, each N - 1 tokens after it, as a trie
under the root (n-grams sharing a prefix share its nodes): a node sees the context, the root and its ancestors,
at position root + depth. One forward's input (width at most (W + G)(N - 1)):
    [root, level 0 columns 1..W-1, level 1 columns 0..W-1, ..., level N-2 columns 0..W-1 | trie nodes]
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache

import torch


@dataclass(frozen=True)
class Shape:
    """W, N, G: the window's columns, the n-gram size (levels + 1), the n-grams verified a step."""

    window: int
    ngram: int
    guesses: int

    @property
    def branch(self) -> int:
        """Inputs of the lookahead branch, the root included: W (N - 1)."""
        return self.window * (self.ngram - 1)

    @property
    def width(self) -> int:
        """The widest forward: (W + G)(N - 1) (every n-gram a full path of its own)."""
        return (self.window + self.guesses) * (self.ngram - 1)

    @property
    def last_level(self) -> range:
        """Input indices of the last level, whose outputs become the next level."""
        return range(self.branch - self.window, self.branch)


@lru_cache(maxsize=32)
def branch_layout(window: int, ngram: int) -> tuple[torch.Tensor, tuple[int, ...]]:
    """The lookahead branch's visibility [b, b] (bool, True = may attend) and position offsets from the root, for
    b = W (N - 1) inputs; input l * W + i is level l, column i."""
    b = window * (ngram - 1)
    vis = torch.zeros(b, b, dtype=torch.bool)
    offsets = []
    for level in range(ngram - 1):
        for col in range(window):
            row = level * window + col
            vis[row, : col + 1] = True  # level 0, columns 0..i (the root and the window's first row)
            vis[row, [m * window + col for m in range(1, level + 1)]] = True  # column i of levels 1..l
            offsets.append(level + col)
    return vis, tuple(offsets)


def trie(grams: list[tuple[int, ...]], depth: int) -> tuple[list[int], list[int], list[int]]:
    """n-grams (the tokens after the root) cut to `depth`, merged where they share a prefix -> (token of each node,
    parent of each node (0 = the root, k = node k - 1), depth of each node), nodes in the n-grams' order."""
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    index: dict[tuple[int, ...], int] = {(): 0}  # prefix -> its node (root 0, node k at k)
    for gram in grams:
        for d in range(1, min(depth, len(gram)) + 1):
            prefix = tuple(gram[:d])
            if prefix not in index:
                tokens.append(prefix[-1])
                parents.append(index[prefix[:-1]])
                depths.append(d)
                index[prefix] = len(tokens)
    return tokens, parents, depths


def rank_paths(parents: list[int]) -> list[tuple[int, ...]]:
    """Each trie node's ranks from the root (its place among its siblings at every depth, in the order they are
    tried): the candidates' paths as a tree's, for --synthetic-acceptance's stated draws."""
    seen: dict[int, int] = {}
    paths: list[tuple[int, ...]] = []
    for parent in parents:
        rank = seen.get(parent, 0)
        seen[parent] = rank + 1
        paths.append((paths[parent - 1] if parent else ()) + (rank,))
    return paths


def layout(shape: Shape, root: int, levels: list[list[int]], tokens: list[int], parents: list[int],
           depths: list[int]) -> tuple[list[int], list[int], torch.Tensor]:
    """One step's input: (token ids [q], position offsets from the root [q], visibility [q, q]) for the root, the
    window's levels and the trie's nodes (trie(): parents 0 = the root)."""
    vis_branch, offsets = branch_layout(shape.window, shape.ngram)
    b, k = shape.branch, len(tokens)
    ids = [root, *levels[0][1:]] + [t for level in levels[1:] for t in level] + tokens
    vis = torch.zeros(b + k, b + k, dtype=torch.bool)
    vis[:b, :b] = vis_branch
    for node in range(1, k + 1):
        row = b + node - 1
        parent = parents[node - 1]
        vis[row, 0] = True  # the root
        if parent:
            vis[row] |= vis[b + parent - 1]  # the parent's ancestors
        vis[row, row] = True
    return ids, list(offsets) + depths, vis


class NgramPool:
    """n-grams by first token, at most G a key, least recently added dropped first (the authors' code keeps each
    key's list so: a repeated n-gram moves to the end)."""

    def __init__(self, size: int):
        self.size = size
        self.grams: dict[int, list[tuple[int, ...]]] = {}

    def add(self, key: int, gram: tuple[int, ...]) -> None:
        kept = self.grams.setdefault(key, [])
        if gram in kept:
            kept.remove(gram)
        elif len(kept) >= self.size:
            del kept[0]
        kept.append(gram)

    def get(self, key: int) -> list[tuple[int, ...]]:
        return self.grams.get(key, [])


class Window:
    """One sample's lookahead state: the N - 1 levels of W tokens, its pool, the steps it has taken."""

    def __init__(self, shape: Shape, context: list[int]):
        self.shape = shape
        # the authors' code starts the window with tokens drawn from the prompt (a fixed seed here: runs repeat)
        draw = random.Random(len(context))
        self.levels = [[draw.choice(context) for _ in range(shape.window)] for _ in range(shape.ngram - 1)]
        self.pool = NgramPool(shape.guesses)
        self.steps = 0

    def advance(self, root: int, new: list[int]) -> None:
        """After a step: keep its n-grams (once every level after the first is the model's own output, N - 2 steps
        after the random start) and move the levels down one, `new` (the last level's argmax) last."""
        levels = self.levels
        if self.steps >= self.shape.ngram - 2:
            for col in range(self.shape.window):
                key = root if col == 0 else levels[0][col]
                self.pool.add(key, tuple(level[col] for level in levels[1:]) + (new[col],))
        self.levels = levels[1:] + [list(new)]
        self.steps += 1
