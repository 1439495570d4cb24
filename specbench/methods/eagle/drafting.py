"""Drafting with a feature drafter (methods/eagle/artifact.py): its KV cache over the committed sequence, and the
two ways it proposes a tree. `eagle` runs it once per tree depth on its own predicted features (EAGLE §4.2, tree
drafting as EAGLE's Figure 6: every node that has children is one input at its depth); `parallelspec` runs it
once over the new inputs plus k masks (ParallelSpec §4.1) and reads k + 1 distributions, one per depth.

Sequence bookkeeping: the drafter's input at position i pairs the target's feature f_i with token x_{i+1}. After
a step the cache holds the pairs of every verified position before the root; the new pairs (the accepted path's
features with the tokens after them, the last one ending in the new root) wait in `pending` until the next draft.
Drafted inputs (tree nodes, masks) are dropped from the cache after each draft.

Children of a node: its top-c tokens at T = 0; at T > 0, c i.i.d. samples of its warped draft distribution q,
which the tree acceptance needs per node (verify.tree_sampled_accept, ParallelSpec Algorithm 1).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .artifact import FeatureDrafter
from ...core.tree import additive
from ...core.batch.cache import crop_to, new_cache
from ...core.tree import Tree
from ...core.verify import Sampling, sample_children, warp_probs
from ...planning.treesearch import optimal_candidates
from ..tree.layout import TreeLayout


class PendingPairs:
    """The pairs (f_i, x_{i+1}) the target verified that the drafter has not fed yet (batch > 1's state per sample:
    its cache is a row of the drafter's batch engine, batch.py)."""

    def __init__(self):
        self.features: list[torch.Tensor] = []  # pending f_i [m_i, H]
        self.tokens: list[torch.Tensor] = []  # pending x_{i+1} [m_i]

    def commit(self, features: torch.Tensor, tokens: torch.Tensor) -> None:
        """Queue pairs: the target's features [m, H] and the token after each [m]."""
        self.features.append(features)
        self.tokens.append(tokens)

    def take(self, drafter: FeatureDrafter, extra: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
        """The drafter's inputs for the pending pairs and `extra` inputs [e, H] after them (masks) [m + e, H], and
        m; the pairs are no longer pending."""
        x = drafter.fuse(torch.cat(self.features), torch.cat(self.tokens))  # [m, H]
        m = x.shape[0]
        if extra is not None:
            x = torch.cat([x, extra.to(x.dtype)])
        self.features, self.tokens = [], []
        return x, m


class DrafterState(PendingPairs):
    """The drafter's cache over committed pairs (positions 0..length-1) and the pairs not fed yet (batch 1)."""

    def __init__(self, drafter: FeatureDrafter):
        super().__init__()
        self.drafter = drafter
        self.cache = new_cache(drafter)
        self.length = 0
        self.last: torch.Tensor | None = None  # the last fed pair's predicted feature [1, H]
        self.drafted = None  # this step's drafted tree layout (EAGLE-2's dynamic tree; None: the static tree)

    def feed(self, extra: torch.Tensor | None = None) -> torch.Tensor:
        """One drafter forward over the pending pairs (committed by it) and `extra` inputs [e, H] after them
        (masks; dropped again by the caller) -> predicted features of the last pair and the extras [1 + e, H].
        With nothing pending and no extras (a second draft in one step), the last pair's feature again."""
        if not self.features and extra is None and self.last is not None:
            return self.last
        x, m = self.take(self.drafter, extra)
        pos = torch.arange(self.length, self.length + x.shape[0], device=x.device)[None]
        out = self.drafter.run(x[None], pos, self.cache)
        self.length += m
        self.last = out[m - 1:m]
        return out[m - 1:]


def choose(logits: torch.Tensor, count: int, sampling: Sampling, generator) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A node's children from its draft logits [V]: (top-count ids, None) at T = 0; else (count i.i.d. samples of
    the warped q, q [V])."""
    if sampling.greedy:
        return logits.topk(count).indices, None
    q = warp_probs(logits, sampling)
    return sample_children(q, count, generator), q


@dataclass(frozen=True)
class EaglePlan:
    """What EAGLE's drafting of one static tree needs every step, computed once per tree: per node how many
    choices its children take (highest child rank + 1), each node's rank among its siblings, and per inner depth
    the nodes that are one drafter input there with the tree part of their mask [G, earlier inputs + G]."""

    counts: tuple[int, ...]
    ranks: tuple[int, ...]
    children: tuple[tuple[int, ...], ...]
    levels: tuple[tuple[tuple[int, ...], torch.Tensor], ...]


@functools.lru_cache(maxsize=16)
def eagle_plan(tree: Tree) -> EaglePlan:
    counts = [0] * tree.nodes
    for i, p in enumerate(tree.paths, start=1):
        counts[tree.parents[i]] = max(counts[tree.parents[i]], p[-1] + 1)
    levels, appended = [], []
    for depth in range(1, tree.depth):
        grow = [v for v in range(1, tree.nodes) if tree.depths[v] == depth and counts[v]]
        if not grow:
            break
        vis = torch.zeros(len(grow), len(appended) + len(grow), dtype=torch.bool)
        for r, v in enumerate(grow):  # an input sees its ancestors' inputs and itself
            seen = set(tree.ancestors[v])
            vis[r, : len(appended)] = torch.tensor([w in seen for w in appended], dtype=torch.bool)
            vis[r, len(appended) + r] = True
        levels.append((tuple(grow), vis))
        appended += grow
    return EaglePlan(tuple(counts), (0,) + tuple(p[-1] for p in tree.paths), tuple(map(tuple, tree.children)),
                     tuple(levels))


def draft_tree_eagle(state: DrafterState, tree: Tree, root: int, sampling: Sampling,
                     generator) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """EAGLE's tree drafting: (tokens of every node [N] root first, draft q [N, V] or None, drafter forwards).
    Depth d's nodes that have children are one drafter forward (their pair: the parent's predicted feature and
    the node's token, at position length - 1 + d; each sees the committed context, its ancestors and itself)."""
    drafter, device = state.drafter, state.drafter.norm.weight.device
    plan = eagle_plan(tree)
    feature = {0: state.feed()[-1]}  # node -> its predicted feature [H] (the root's: from the last pair)
    base = state.length  # committed length, the pending pairs now fed
    q_rows: dict[int, torch.Tensor] = {}
    token_of = {0: root}
    forwards = 1
    frontier: tuple[int, ...] = (0,)
    for depth in range(len(plan.levels) + 1):
        # the children of this depth's nodes, from each node's draft distribution
        feats = torch.stack([feature[u] for u in frontier])  # [F, H]
        if sampling.greedy:  # every frontier node's top choices at once: one top-k, one copy to the host
            picks = drafter.top_ids(feats, max(plan.counts[u] for u in frontier)).tolist()  # [F, c]
            for row, u in enumerate(frontier):
                for child in plan.children[u]:
                    token_of[child] = picks[row][plan.ranks[child]]
        else:
            pick_children(plan, frontier, drafter.logits(feats), token_of, q_rows, sampling, generator)
        if depth == len(plan.levels):
            break
        # one forward over the next depth's nodes that have children
        grow, tree_vis = plan.levels[depth]
        x = drafter.fuse(torch.stack([feature[tree.parents[v]] for v in grow]),
                         torch.tensor([token_of[v] for v in grow], device=device))  # [G, H]
        vis = torch.cat([torch.ones(len(grow), base, dtype=torch.bool), tree_vis], 1).to(device)
        pos = torch.full((1, len(grow)), base + depth, device=device)
        out = drafter.run(x[None], pos, state.cache, additive(vis, x.dtype))
        forwards += 1
        for r, v in enumerate(grow):
            feature[v] = out[r]
        frontier = grow
    crop_to(state.cache, base)
    tokens = torch.tensor([token_of[i] for i in range(tree.nodes)], device=device)
    return tokens, stack_q(q_rows, tree.nodes), forwards


def pick_children(plan: EaglePlan, frontier: tuple[int, ...], logits: torch.Tensor, token_of: dict[int, int],
                  q_rows: dict[int, torch.Tensor], sampling: Sampling, generator) -> None:
    """The children's tokens of every frontier node from its draft logits (logits [F, V], frontier order, which
    is the order of the random draws), into token_of; each node's q [V] into q_rows at T > 0."""
    for row, u in enumerate(frontier):
        ids, q = choose(logits[row], plan.counts[u], sampling, generator)
        if q is not None:
            q_rows[u] = q
        picks = ids.tolist()
        for child in plan.children[u]:  # the child of rank r takes the r-th choice
            token_of[child] = picks[plan.ranks[child]]


def draft_tree_parallel(state: DrafterState, tree: Tree, root: int, sampling: Sampling,
                        generator, dynamic: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """ParallelSpec's drafting: one forward over the pending pairs and the k masks gives q_1..q_{k+1}; depth d's
    candidates are the top (or sampled) choices of q_d, shared by every parent at depth d - 1 (as Medusa's).
    dynamic = m: the tree is this step's m most probable candidate paths under the drafter's own top
    probabilities per depth (EAGLE-2's reranking where every depth is drafted at once), left in state.drafted; it
    depends on the distributions only, never on sampled tokens, so T > 0 stays lossless."""
    drafter = state.drafter
    out = state.feed(drafter.masks)  # [1 + k, H]
    crop_to(state.cache, state.length)  # the masks leave the cache
    if dynamic is not None:
        # over the drafter's own head rows: the -inf entries of the full row add nothing to a softmax
        probs = torch.softmax(drafter.head_logits(out).float(), -1).topk(min(dynamic, 8), -1).values  # [1 + k, W]
        tree = Tree(tuple(optimal_candidates(probs.tolist(), dynamic, probs.shape[0])))
        state.drafted = TreeLayout(tree, None, out.device)
    if sampling.greedy:  # one top-k over every depth on the drafter's own head rows (drafter.top_ids)
        topk = drafter.top_ids(out[:tree.depth], max(max((p[-1] for p in tree.paths), default=-1) + 1, 1))
        return torch.cat([torch.tensor([root], device=topk.device), tree.candidate_tokens(topk)]), None, 1
    return (*parallel_candidates(drafter.logits(out[:tree.depth]), tree, root, sampling, generator), 1)


def parallel_candidates(logits: torch.Tensor, tree: Tree, root: int, sampling: Sampling,
                        generator) -> tuple[torch.Tensor, torch.Tensor | None]:
    """ParallelSpec's tree from its k + 1 draft distributions (logits [D, V], one per depth) -> (tokens [N] root
    first, q [N, V] or None)."""
    depth = tree.depth
    width = max((p[-1] for p in tree.paths), default=-1) + 1
    if sampling.greedy:  # one top-k over every depth
        topk, qs = logits.topk(max(width, 1), -1).indices, []  # [D, W]
    else:
        drawn = [choose(logits[d], max(width, 1), sampling, generator) for d in range(depth)]
        topk, qs = torch.stack([ids for ids, _ in drawn]), [q for _, q in drawn]
    tokens = torch.cat([torch.tensor([root], device=topk.device), tree.candidate_tokens(topk)])
    q_rows = {}
    if not sampling.greedy:
        for node in range(tree.nodes):
            if tree.depths[node] < depth:
                q_rows[node] = qs[tree.depths[node]]
    return tokens, stack_q(q_rows, tree.nodes)


def stack_q(q_rows: dict[int, torch.Tensor], nodes: int) -> torch.Tensor | None:
    """Per-node draft distributions -> [N, V] (zero rows for leaves), or None at T = 0."""
    if not q_rows:
        return None
    some = next(iter(q_rows.values()))
    out = some.new_zeros(nodes, some.shape[-1])
    for node, q in q_rows.items():
        out[node] = q
    return out


@torch.inference_mode()
def step_drafting_ms(drafter: FeatureDrafter, draft, pending: int, context: int = 256, repeats: int = 10) -> float:
    """Median milliseconds of one step's drafting as the batch-1 step runs it (what DraftPricing prices a tree
    with): on a drafter cache of `context` committed pairs, `pending` verified pairs wait (the last accepted path:
    about tau of them), then draft(state) feeds them and drafts the tree (its widths, top-k, gathers and host
    copies); the cache is cut back after each call. Random features and tokens: the cost does not depend on them."""
    weight = drafter.norm.weight
    hidden, device, dtype = weight.shape[0], weight.device, weight.dtype
    state = DrafterState(drafter)
    state.commit(torch.randn(context, hidden, device=device, dtype=dtype),
                 torch.randint(drafter.vocab_size, (context,), device=device))
    state.feed()
    features = torch.randn(pending, hidden, device=device, dtype=dtype)  # [P, H]
    tokens = torch.randint(drafter.vocab_size, (pending,), device=device)  # [P]

    def reset():
        crop_to(state.cache, context)
        state.length, state.features, state.tokens = context, [features], [tokens]

    from ...core.machine.timing import median_call_ms

    reset()
    return median_call_ms(lambda: draft(state), device, repeats, reset=reset)
