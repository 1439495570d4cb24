"""Drafting with a feature drafter (methods/eagle/artifact.py), one path at every batch size: every sample's drafter
KV cache is a slot of one drafter engine in the target's mode (core/batch/engine.py: the single-sequence engine at
batch 1, ragged.py unpadded, padded.py padded; as sd's drafter), reached through core/batch/decoder.DraftModule.
`eagle` runs the drafter once per tree depth on its own predicted features (EAGLE §4.2, tree drafting as EAGLE's
Figure 6: every node that has children is one input at its depth), one batched forward per depth over every
sample's nodes of that depth; `parallelspec` runs it once over the new inputs plus k masks (ParallelSpec §4.1), one
batched forward over every sample's pending pairs and masks, and reads k + 1 distributions, one per depth. EAGLE-2's
dynamic tree (dynamic_tree.py) drafts on the same engine.

Sequence bookkeeping: the drafter's input at position i pairs the target's feature f_i with token x_{i+1}. After
a step a slot's cache holds the pairs of every verified position before the root; the new pairs (the accepted path's
features with the tokens after them, the last one ending in the new root) wait in the sample's FeatureState until
the next draft. Per sample the inputs, positions and masks: the pending pairs at the slot's committed length;
EAGLE's depth-d nodes at committed length + d - 1, seeing the committed context, their ancestors (earlier depths of
this step, in the cache: a tail mask, core/batch/ragged.Segment.mask) and themselves; ParallelSpec's masks after the
pairs, causal. Drafted inputs (tree nodes, masks) leave each slot's cache after drafting.

Children of a node: its top-c tokens at T = 0; at T > 0, c i.i.d. samples of its warped draft distribution q,
which the tree acceptance needs per node (verify.tree_sampled_accept, ParallelSpec Algorithm 1), drawn on each
sample's own random stream in node order, whatever the batch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from .artifact import FeatureDrafter
from ...core.batch.engine import engine
from ...core.batch.ragged import Segment
from ...core.tree import Tree
from ...core.verify import Sampling, sample_children, warp_probs
from ...planning.treesearch import optimal_candidates
from ..tree.layout import TreeLayout


@dataclass
class FeatureState:
    """A sample's state between steps: the pairs (f_i, x_{i+1}) the target verified that the drafter has not fed
    yet, and the tree this step drafted (EAGLE-2's dynamic tree; None: the batch tree's static tree)."""

    features: list[torch.Tensor] = field(default_factory=list)  # pending f_i [m_i, H]
    tokens: list[torch.Tensor] = field(default_factory=list)  # pending x_{i+1} [m_i]
    drafted: TreeLayout | None = None
    root: torch.Tensor | None = None  # the last fed pair's predicted feature [H] (the current root's)

    def commit(self, features: torch.Tensor, tokens: torch.Tensor) -> None:
        """Queue pairs: the target's features [m, H] and the token after each [m]."""
        self.features.append(features)
        self.tokens.append(tokens)

    def take(self, drafter: FeatureDrafter, extra: torch.Tensor | None = None) -> torch.Tensor:
        """The drafter's inputs for the pending pairs and `extra` inputs [e, H] after them (masks) [m + e, H]; the
        pairs are no longer pending."""
        x = drafter.fuse(torch.cat(self.features), torch.cat(self.tokens))  # [m, H]
        if extra is not None:
            x = torch.cat([x, extra.to(x.dtype)])
        self.features, self.tokens = [], []
        return x


@dataclass(frozen=True)
class Draft:
    """One sample's drafted tree: tokens [N] root first, draft q [N, V] or None (T = 0), batched drafter forwards
    it took part in."""

    tokens: torch.Tensor
    q: torch.Tensor | None
    forwards: int


def feed(batch, drafter: FeatureDrafter, samples, states: list[FeatureState],
         extra: torch.Tensor | None = None) -> list[torch.Tensor]:
    """One batched drafter forward over every sample's pending pairs (a newcomer's: its whole prompt, joining the
    drafter's engine) and `extra` inputs [e, H] after them -> per sample the predicted features of its last pair
    and the extras [1 + e, H]. The pairs stay in each slot's cache; the extras too, until the caller truncates.
    A sample with nothing pending and no extras (a second drafting in one step: EAGLE-2's sampled tokens) takes
    its last pair's feature again, without a forward."""
    e = 0 if extra is None else extra.shape[0]
    fed = [(s, st) for s, st in zip(samples, states) if st.features or extra is not None]
    segments = [Segment(s.slot, [], keep=1 + e, embeds=st.take(drafter, extra)) for s, st in fed]
    joining = [seg for seg in segments if seg.slot not in batch.rows]
    stepping = [seg for seg in segments if seg.slot in batch.rows]
    first, out = batch.forward(joining, stepping, hidden=True) if segments else ([], [])
    by_slot = {seg.slot: o for seg, o in zip(joining + stepping, first + out)}
    for s, st in fed:
        st.root = by_slot[s.slot][0]
    return [by_slot[s.slot] if s.slot in by_slot else st.root[None] for s, st in zip(samples, states)]


def choose(logits: torch.Tensor, count: int, sampling: Sampling, generator) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A node's children from its draft logits [V]: (top-count ids, None) at T = 0; else (count i.i.d. samples of
    the warped q, q [V])."""
    if sampling.greedy:
        return logits.topk(count).indices, None
    q = warp_probs(logits, sampling)
    return sample_children(q, count, generator), q


@dataclass(frozen=True)
class DraftOrder:
    """What EAGLE's drafting of one tree needs every step, computed once per tree: per node how many choices its
    children take (highest child rank + 1), each node's rank among its siblings, and per inner depth the nodes that
    are one drafter input there with the tree part of their mask [G, earlier inputs + G]."""

    counts: tuple[int, ...]
    ranks: tuple[int, ...]
    children: tuple[tuple[int, ...], ...]
    levels: tuple[tuple[tuple[int, ...], torch.Tensor], ...]


@functools.lru_cache(maxsize=16)
def draft_order(tree: Tree) -> DraftOrder:
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
    return DraftOrder(tuple(counts), (0,) + tuple(p[-1] for p in tree.paths), tuple(map(tuple, tree.children)),
                     tuple(levels))


def draft_trees_eagle(batch, drafter: FeatureDrafter, samples, states: list[FeatureState], trees: list[Tree],
                      sampling: Sampling) -> list[Draft]:
    """EAGLE's tree drafting for every sample at once, each its own tree (a static tree: the same for all; EAGLE-2:
    the shape drafted this step). Per depth, one head call over every sample's frontier and one batched drafter
    forward over every sample's next-depth nodes that have children: [G, H] each at committed length + depth, mask
    [G, earlier inputs of this step + G] (the earlier inputs are the slot's last cache entries)."""
    device = drafter.norm.weight.device
    orders = [draft_order(t) for t in trees]
    forwards = [1 if st.features else 0 for st in states]  # the pending pairs' forward (none: fed this step)
    roots = feed(batch, drafter, samples, states)  # [1, H] each
    base = [batch.lengths[s.slot] for s in samples]  # committed lengths, the pending pairs now fed
    feature = [{0: r[-1]} for r in roots]  # per sample: node -> its predicted feature [H]
    token_of = [{0: s.history[-1]} for s in samples]
    q_rows: list[dict[int, torch.Tensor]] = [{} for _ in samples]
    frontier: list[tuple[int, ...]] = [(0,) for _ in samples]
    for depth in range(max(len(p.levels) for p in orders) + 1):
        # the children of this depth's nodes, from each node's draft distribution [sum F, H]
        live = [i for i, p in enumerate(orders) if depth <= len(p.levels)]
        feats = torch.stack([feature[i][u] for i in live for u in frontier[i]])
        if sampling.greedy:  # every frontier's top choices at once: one top-k, one copy to the host
            picks = drafter.top_ids(feats, max(orders[i].counts[u] for i in live for u in frontier[i])).tolist()
            row = 0
            for i in live:
                order = orders[i]
                for u in frontier[i]:
                    for child in order.children[u]:
                        token_of[i][child] = picks[row][order.ranks[child]]
                    row += 1
        else:  # on each sample's own random stream, in batch 1's order
            logits, row = drafter.logits(feats), 0  # [sum F, V]
            for i in live:
                rows = logits[row:row + len(frontier[i])]
                row += len(frontier[i])
                pick_children(orders[i], frontier[i], rows, token_of[i], q_rows[i], sampling, samples[i].generator)
        growing = [i for i in live if depth < len(orders[i].levels)]
        if not growing:
            break
        segments = []
        for i in growing:
            grow, tree_vis = orders[i].levels[depth]
            x = drafter.fuse(torch.stack([feature[i][trees[i].parents[v]] for v in grow]),
                             torch.tensor([token_of[i][v] for v in grow], device=device))  # [G, H]
            segments.append(Segment(samples[i].slot, [], positions=[base[i] + depth] * len(grow), mask=tree_vis,
                                    embeds=x))
        _, out = batch.forward([], segments, hidden=True)
        for i, o in zip(growing, out):
            forwards[i] += 1
            for r, v in enumerate(orders[i].levels[depth][0]):
                feature[i][v] = o[r]
            frontier[i] = orders[i].levels[depth][0]
    for s, b in zip(samples, base):  # the drafted inputs leave the cache
        batch.truncate(s.slot, b)
    return [Draft(torch.tensor([t[n] for n in range(tree.nodes)], device=device), stack_q(q, tree.nodes), f)
            for t, q, tree, f in zip(token_of, q_rows, trees, forwards)]


def pick_children(order: DraftOrder, frontier: tuple[int, ...], logits: torch.Tensor, token_of: dict[int, int],
                  q_rows: dict[int, torch.Tensor], sampling: Sampling, generator) -> None:
    """The children's tokens of every frontier node from its draft logits (logits [F, V], frontier order, which
    is the order of the random draws), into token_of; each node's q [V] into q_rows at T > 0."""
    for row, u in enumerate(frontier):
        ids, q = choose(logits[row], order.counts[u], sampling, generator)
        if q is not None:
            q_rows[u] = q
        picks = ids.tolist()
        for child in order.children[u]:  # the child of rank r takes the r-th choice
            token_of[child] = picks[order.ranks[child]]


def draft_trees_parallel(batch, drafter: FeatureDrafter, samples, states: list[FeatureState], tree: Tree,
                         sampling: Sampling, dynamic: int | None = None) -> list[Draft]:
    """ParallelSpec's drafting for every sample in one batched forward over its pending pairs and the k masks:
    q_1..q_{k+1}; depth d's candidates are the top (or sampled) choices of q_d, shared by every parent at depth
    d - 1 (as Medusa's). dynamic = m: a sample's tree is this step's m most probable candidate paths under the
    drafter's own top probabilities per depth (EAGLE-2's reranking where every depth is drafted at once), left in
    its state's `drafted`; it depends on the distributions only, never on sampled tokens, so T > 0 stays lossless."""
    k = drafter.mask_tokens
    out = feed(batch, drafter, samples, states, drafter.masks)  # [1 + k, H] each
    for s in samples:  # the masks leave the cache
        batch.truncate(s.slot, batch.lengths[s.slot] - k)
    trees = [tree] * len(samples)
    if dynamic is not None:
        # over the drafter's own head rows: the -inf entries of the full row add nothing to a softmax
        probs = torch.softmax(drafter.head_logits(torch.cat(out)).float(), -1).topk(min(dynamic, 8), -1).values
        for i, st in enumerate(states):
            p = probs[i * (1 + k):(i + 1) * (1 + k)]  # [1 + k, W]
            trees[i] = Tree(tuple(optimal_candidates(p.tolist(), dynamic, p.shape[0])))
            st.drafted = TreeLayout(trees[i], None, out[i].device)
    if sampling.greedy:  # one top-k over every sample's depths on the drafter's own head rows (drafter.top_ids)
        width = max(max((p[-1] for p in t.paths), default=-1) + 1 for t in trees)
        topk = drafter.top_ids(torch.cat(out), max(width, 1))  # [B * (1 + k), W]
        return [Draft(torch.cat([torch.tensor([s.history[-1]], device=topk.device),
                                   t.candidate_tokens(topk[i * (1 + k):i * (1 + k) + t.depth])]), None, 1)
                for i, (s, t) in enumerate(zip(samples, trees))]
    return [Draft(*parallel_candidates(drafter.logits(o[:t.depth]), t, s.history[-1], sampling, s.generator), 1)
            for s, o, t in zip(samples, out, trees)]


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


@dataclass
class Probe:
    """The fields of a sample the drafting reads (slot, history's last token, random stream), for timing."""

    slot: int = 0
    history: list[int] = field(default_factory=lambda: [0])
    generator: torch.Generator | None = None


@torch.inference_mode()
def step_drafting_ms(drafter: FeatureDrafter, draft, pending: int, context: int = 256, repeats: int = 10) -> float:
    """Median milliseconds of one step's drafting as the batch-1 step runs it (what DraftPricing prices a tree
    with): on batch 1's drafter engine holding `context` committed pairs, `pending` verified pairs wait (the last
    accepted path: about tau of them), then draft(engine, [sample], [state]) feeds them and drafts the tree (its
    widths, top-k, gathers and host copies); the slot is cut back after each call. Random features and tokens: the
    cost does not depend on them."""
    from ...core.machine.timing import median_call_ms

    weight = drafter.norm.weight
    hidden, device, dtype = weight.shape[0], weight.device, weight.dtype
    batch, probe, state = engine(drafter, "single", 1, device), Probe(), FeatureState()
    state.commit(torch.randn(context, hidden, device=device, dtype=dtype),
                 torch.randint(drafter.vocab_size, (context,), device=device))
    feed(batch, drafter, [probe], [state])  # the slot joins with `context` pairs
    features = torch.randn(pending, hidden, device=device, dtype=dtype)  # [P, H]
    tokens = torch.randint(drafter.vocab_size, (pending,), device=device)  # [P]

    def reset():
        batch.truncate(probe.slot, context)
        state.features, state.tokens = [features], [tokens]

    reset()
    return median_call_ms(lambda: draft(batch, [probe], [state]), device, repeats, reset=reset)
