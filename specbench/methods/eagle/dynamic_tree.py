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
is drafted greedily as above, which depends only on the committed context, and then the static drafting
(drafting.draft_tree_eagle) samples that shape's tokens: lossless, at twice the drafter's work.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...core.tree import additive
from ...core.batch.cache import crop_to
from ...core.tree import Tree
from .drafting import DrafterState

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
def draft_dynamic(state: DrafterState, root: int, m: int, depth: int, top_k: int = DEFAULT_TOP_K) -> DynamicShape:
    """EAGLE-2's expansion and reranking from the drafter's state (its pending pairs fed here and committed):
    a tree of m candidates at most `depth` deep, greedy (top-k tokens, values from the drafter's probabilities)."""
    drafter, device = state.drafter, state.drafter.norm.weight.device
    k = max(1, min(top_k, m))
    base_feature = state.feed()[-1]  # [H]: the root's predicted feature
    base = state.length  # committed length; drafted inputs go after it and leave the cache at the end
    nodes: list[_Node] = []
    features: dict[int, torch.Tensor] = {}  # expanded drafted node -> its predicted feature [H]
    appended: list[int] = []  # drafted nodes already in the drafter's cache (in this order)

    def grow(parents: list[int], feats: torch.Tensor, d: int) -> list[int]:
        """Each parent's top-k tokens as new nodes at depth d; returns their indices."""
        # over the drafter's own head rows [P, K] (the full row's -inf entries add nothing), ids mapped to [0, V)
        top = torch.log_softmax(drafter.head_logits(feats).float(), -1).topk(k, -1)  # [P, k]
        ids = top.indices if drafter.vocab_ids is None else drafter.vocab_ids[top.indices]
        values, indices = top.values.tolist(), ids.tolist()  # one copy out, not 2 P k item() calls
        new = []
        for row, p in enumerate(parents):
            start = nodes[p].value if p >= 0 else 0.0
            for r in range(k):
                nodes.append(_Node(p, r, indices[row][r], start + values[row][r], d))
                new.append(len(nodes) - 1)
        return new

    frontier = grow([-1], base_feature[None], 1)
    forwards = 1
    for d in range(2, depth + 1):
        expand = sorted(sorted(frontier, key=lambda i: (-nodes[i].value, i))[:k])  # the depth's k best
        x = drafter.fuse(torch.stack([features[nodes[i].parent] if nodes[i].parent >= 0 else base_feature
                                      for i in expand]),
                         torch.tensor([nodes[i].token for i in expand], device=device))  # [G, H]
        # each input sees the committed context, its ancestors' inputs (all expanded earlier) and itself
        vis = torch.zeros(len(expand), base + len(appended) + len(expand), dtype=torch.bool)
        vis[:, :base] = True
        slot = {node: base + j for j, node in enumerate(appended)}
        for r, i in enumerate(expand):
            a = nodes[i].parent
            while a >= 0:
                vis[r, slot[a]] = True
                a = nodes[a].parent
            vis[r, base + len(appended) + r] = True
        pos = torch.full((1, len(expand)), base + d - 2, device=device)
        out = drafter.run(x[None], pos, state.cache, additive(vis.to(device), x.dtype))  # [G, H]
        forwards += 1
        for r, i in enumerate(expand):
            features[i] = out[r]
        appended += expand
        frontier = grow(expand, out, d)
    crop_to(state.cache, base)
    kept = select(nodes, m)
    tree, tokens = shape_of(nodes, kept)
    return DynamicShape(tree, torch.tensor([root] + tokens, device=device), tuple(nodes[i].value for i in kept),
                        forwards)
