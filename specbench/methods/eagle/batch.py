"""Batch > 1 for the feature drafters (`eagle`, `parallelspec`): every sample's drafter KV cache is a row (slot) of
one batch engine of the drafter, in the target's mode (core/batch/ragged.py unpadded, core/batch/padded.py padded; as sd's
drafter), and every sample's tree is drafted in batched drafter forwards: EAGLE one forward per tree depth over
every sample's nodes of that depth, ParallelSpec one forward over every sample's pending pairs and masks.

Per sample the inputs, positions, masks and random draws are batch 1's (drafting.py): the pending pairs at
the slot's committed length; EAGLE's depth-d nodes at committed length + d - 1, seeing the committed context,
their ancestors (earlier depths of this step, in the cache: a tail mask, core/batch/ragged.Segment.mask) and
themselves; ParallelSpec's masks after the pairs, causal. Drafted inputs leave each slot's cache after drafting.
A sample's state between steps is its PendingPairs (the accepted path's features and tokens, not fed yet).
"""

from __future__ import annotations

import torch

from .artifact import FeatureDrafter
from ...core.batch.ragged import Segment
from ...core.tree import Tree
from ...core.verify import Sampling
from .drafting import PendingPairs, eagle_plan, parallel_candidates, pick_children, stack_q


def feed(batch, drafter: FeatureDrafter, samples, extra: torch.Tensor | None = None) -> list[torch.Tensor]:
    """One batched drafter forward over every sample's pending pairs (a newcomer's: its whole prompt, joining the
    drafter's batch) and `extra` inputs [e, H] after them -> per sample the predicted features of its last pair
    and the extras [1 + e, H]. The pairs stay in each slot's cache; the extras too, until the caller truncates."""
    e = 0 if extra is None else extra.shape[0]
    segments = []
    for s in samples:
        pending: PendingPairs = s.scratch["guesses"]
        x, _ = pending.take(drafter, extra)  # [m + e, H]
        segments.append(Segment(s.slot, [], keep=1 + e, embeds=x))  # positions: the slot's length onward
    joining = [seg for seg in segments if seg.slot not in batch.rows]
    stepping = [seg for seg in segments if seg.slot in batch.rows]
    first, out = batch.forward(joining, stepping, hidden=True)
    by_slot = {seg.slot: o for seg, o in zip(joining + stepping, first + out)}
    return [by_slot[s.slot] for s in samples]


def draft_trees_eagle(batch, drafter: FeatureDrafter, samples, tree: Tree,
                      sampling: Sampling) -> tuple[list[tuple[torch.Tensor, torch.Tensor | None]], int]:
    """EAGLE's tree drafting (drafting.draft_tree_eagle) for every sample at once -> (per sample: tokens
    [N] root first and draft q [N, V] or None; the batched drafter forwards, each of which every sample took part
    in)."""
    device = drafter.norm.weight.device
    plan = eagle_plan(tree)
    roots = feed(batch, drafter, samples)  # [1, H] each
    base = [batch.lengths[s.slot] for s in samples]  # committed lengths, the pending pairs now fed
    feature = [{0: r[-1]} for r in roots]  # per sample: node -> its predicted feature [H]
    token_of = [{0: s.history[-1]} for s in samples]
    q_rows: list[dict[int, torch.Tensor]] = [{} for _ in samples]
    forwards = 1
    frontier: tuple[int, ...] = (0,)
    for depth in range(len(plan.levels) + 1):
        # the children of this depth's nodes: one head call over every sample's frontier [B * F, V]
        logits = drafter.logits(torch.stack([f[u] for f in feature for u in frontier]))
        for i, s in enumerate(samples):  # on each sample's own random stream, in batch 1's order
            rows = logits[i * len(frontier):(i + 1) * len(frontier)]  # [F, V]
            pick_children(plan, frontier, rows, token_of[i], q_rows[i], sampling, s.generator)
        if depth == len(plan.levels):
            break
        # one batched forward over every sample's next-depth nodes that have children: [G, H] each, at base + depth,
        # mask [G, earlier inputs of this step + G] (the earlier inputs are the slot's last cache entries)
        grow, tree_vis = plan.levels[depth]
        segments = []
        for i, s in enumerate(samples):
            x = drafter.fuse(torch.stack([feature[i][tree.parents[v]] for v in grow]),
                             torch.tensor([token_of[i][v] for v in grow], device=device))  # [G, H]
            segments.append(Segment(s.slot, [], positions=[base[i] + depth] * len(grow), mask=tree_vis, embeds=x))
        _, out = batch.forward([], segments, hidden=True)
        forwards += 1
        for i, o in enumerate(out):
            for r, v in enumerate(grow):
                feature[i][v] = o[r]
        frontier = grow
    for s, b in zip(samples, base):  # the drafted inputs leave the cache
        batch.truncate(s.slot, b)
    drafts = [(torch.tensor([t[n] for n in range(tree.nodes)], device=device), stack_q(q, tree.nodes))
              for t, q in zip(token_of, q_rows)]
    return drafts, forwards


def draft_trees_parallel(batch, drafter: FeatureDrafter, samples, tree: Tree,
                         sampling: Sampling) -> tuple[list[tuple[torch.Tensor, torch.Tensor | None]], int]:
    """ParallelSpec's drafting (drafting.draft_tree_parallel) for every sample in one batched forward."""
    k = drafter.mask_tokens
    out = feed(batch, drafter, samples, drafter.masks)  # [1 + k, H] each
    for s in samples:  # the masks leave the cache
        batch.truncate(s.slot, batch.lengths[s.slot] - k)
    logits = drafter.logits(torch.cat([o[:tree.depth] for o in out]))  # [B * D, V]
    drafts = [parallel_candidates(logits[i * tree.depth:(i + 1) * tree.depth], tree, s.history[-1], sampling,
                                  s.generator) for i, s in enumerate(samples)]
    return drafts, 1
