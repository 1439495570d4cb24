"""EAGLE-2's dynamic draft tree (Li et al. 2024, "EAGLE-2: Faster Inference of Language Models with Dynamic Draft
Trees", §4): the tree is grown per step from the drafter's own confidence instead of fixed in advance.

Value of a drafted node: the product of the drafter's probabilities along its path from the root (EAGLE-2's
"global acceptance probability" estimate, Eq. 1); kept here as a sum of log probabilities.
1. Expansion: the root's top-k tokens are depth 1. At every further depth the k highest-valued nodes of the depth
   just drafted are one drafter forward (each sees the committed context, its ancestors and itself, as in static
   EAGLE drafting), and each adds its top-k tokens to the next depth: k + (depth - 1) k^2 drafted nodes in all.
2. Reranking: every drafted node is ranked by value and the top m become the tree the target verifies. A child's
   value never exceeds its parent's (a probability is <= 1), and ties keep drafting order, so the top m always
   contain every kept node's ancestors: the selection is a tree.
m, the verify width, is the hardware's choice (the size `--tree auto` picks from this machine's latency profile),
so the tree adapts to the context and its size to the machine.

At T > 0 the shape must not depend on the sampled tokens (multi-candidate speculative sampling needs each node's
children to be i.i.d. draws from its q, which a value-based selection of sampled tokens would bias). So the shape
is drafted greedily as above, which depends only on the committed context, and then the tree drafting
(drafting.draft_trees_eagle) samples that shape's tokens: lossless, at twice the drafter's work. Every sample draws
its own shape, each on its own slot of the drafter's engine, in batched forwards (batch 1: one slot).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...core.batch.ragged import Segment
from ...core.tree import Tree
from .artifact import FeatureDrafter
from .drafting import FeatureState, feed

DEFAULT_TOP_K = 8  # EAGLE-2 expands 8-10 nodes per depth with their top 8-10 tokens; capped by m here


@dataclass(frozen=True)
class DynamicShape:
    """A drafted tree: its shape (ranks = order among the parent's top-k), node tokens [N] root first, each
    candidate's value (log draft probability of its path, node order), drafter forwards it took."""

    tree: Tree
    tokens: torch.Tensor
    values: tuple[float, ...]
    forwards: int


@dataclass
class _Node:
    parent: int  # index into the drafted list (-1: the root)
    rank: int  # among the parent's top-k tokens
    token: int
    value: float  # log of the path's draft probability
    depth: int


def select(nodes: list[_Node], m: int) -> list[int]:
    """The m highest-valued drafted nodes (indices), ties in drafting order: always closed under parents."""
    order = sorted(range(len(nodes)), key=lambda i: (-nodes[i].value, i))
    return sorted(order[:m])


def shape_of(nodes: list[_Node], kept: list[int]) -> tuple[Tree, list[int]]:
    """The kept drafted nodes as a Tree (parents first) and their tokens; ranks renumbered 0.. per parent in
    drafting order (the verifier reads ranks only as child order)."""
    path_of: dict[int, tuple[int, ...]] = {-1: ()}
    next_rank: dict[int, int] = {}
    paths, tokens = [], []
    for i in kept:  # drafting order: every parent before its children
        parent = nodes[i].parent
        r = next_rank.get(parent, 0)
        next_rank[parent] = r + 1
        path_of[i] = path_of[parent] + (r,)
        paths.append(path_of[i])
        tokens.append(nodes[i].token)
    return Tree(tuple(paths)), tokens


@torch.inference_mode()
def draft_dynamic(batch, drafter: FeatureDrafter, samples, states: list[FeatureState], m: int, depth: int,
                  top_k: int = DEFAULT_TOP_K) -> list[DynamicShape]:
    """EAGLE-2's expansion and reranking for every sample at once on the drafter's engine (drafting.py; each
    sample's pending pairs fed here and committed): per sample a tree of m candidates at most `depth` deep, greedy
    (top-k tokens, values from the drafter's probabilities). Per depth one head call over every sample's expanded
    nodes and one batched drafter forward: each sample's k best nodes of the depth just drafted [k, H] at committed
    length + depth - 2, each seeing the committed context, its ancestors' inputs (expanded earlier this step: the
    slot's last cache entries, a tail mask) and itself."""
    device = drafter.norm.weight.device
    k = max(1, min(top_k, m))
    roots = feed(batch, drafter, samples, states)  # [1, H] each: the root's predicted feature last
    base = [batch.lengths[s.slot] for s in samples]  # committed lengths; drafted inputs go after and leave at the end
    nodes: list[list[_Node]] = [[] for _ in samples]
    features: list[dict[int, torch.Tensor]] = [{} for _ in samples]  # expanded drafted node -> its feature [H]
    appended: list[list[int]] = [[] for _ in samples]  # drafted nodes in each slot's cache (in this order)

    def grow(parents: list[list[int]], feats: torch.Tensor, d: int) -> list[list[int]]:
        """Each sample's parents' top-k tokens as new nodes at depth d (feats: every sample's parents' features in
        order [sum P, H]); returns each sample's new indices."""
        # over the drafter's own head rows [P, K] (the full row's -inf entries add nothing), ids mapped to [0, V)
        top = torch.log_softmax(drafter.head_logits(feats).float(), -1).topk(k, -1)  # [sum P, k]
        ids = top.indices if drafter.vocab_ids is None else drafter.vocab_ids[top.indices]
        values, indices = top.values.tolist(), ids.tolist()  # one copy out, not 2 P k item() calls
        new, row = [], 0
        for own, ps in zip(nodes, parents):
            mine = []
            for p in ps:
                start = own[p].value if p >= 0 else 0.0
                for r in range(k):
                    own.append(_Node(p, r, indices[row][r], start + values[row][r], d))
                    mine.append(len(own) - 1)
                row += 1
            new.append(mine)
        return new

    root_features = [r[-1] for r in roots]
    frontier = grow([[-1] for _ in samples], torch.stack(root_features), 1)
    forwards = 1
    for d in range(2, depth + 1):
        segments, expanded = [], []
        for i, s in enumerate(samples):
            own = nodes[i]
            expand = sorted(sorted(frontier[i], key=lambda j: (-own[j].value, j))[:k])  # the depth's k best
            x = drafter.fuse(torch.stack([features[i][own[j].parent] if own[j].parent >= 0 else root_features[i]
                                          for j in expand]),
                             torch.tensor([own[j].token for j in expand], device=device))  # [k, H]
            vis = torch.zeros(len(expand), len(appended[i]) + len(expand), dtype=torch.bool)
            slot = {node: c for c, node in enumerate(appended[i])}
            for r, j in enumerate(expand):
                a = own[j].parent
                while a >= 0:
                    vis[r, slot[a]] = True
                    a = own[a].parent
                vis[r, len(appended[i]) + r] = True
            segments.append(Segment(s.slot, [], positions=[base[i] + d - 2] * len(expand), mask=vis, embeds=x))
            expanded.append(expand)
        _, out = batch.forward([], segments, hidden=True)
        forwards += 1
        for i, (expand, o) in enumerate(zip(expanded, out)):
            for r, j in enumerate(expand):
                features[i][j] = o[r]
            appended[i] += expand
        frontier = grow(expanded, torch.cat(out), d)
    shapes = []
    for i, s in enumerate(samples):
        batch.truncate(s.slot, base[i])  # the drafted inputs leave the cache
        kept = select(nodes[i], m)
        tree, tokens = shape_of(nodes[i], kept)
        shapes.append(DynamicShape(tree, torch.tensor([s.history[-1]] + tokens, device=device),
                                   tuple(nodes[i][j].value for j in kept), forwards))
    return shapes
