"""The decode-time side of the feature drafters (`eagle`, `parallelspec`): every sample's drafter cache is a slot of
one drafter engine in the target's mode at every batch size (drafting.py; batch 1: the single-sequence engine), and a
sample's state between steps is its FeatureState (the verified pairs the drafter has not fed yet)."""

from __future__ import annotations

import torch

from ...core.batch.engine import engine
from ...core.batch.forward import target_logits
from ...core.batch.ragged import Segment
from ...core.tree import Tree
from ...core.verify import Sampling, next_token
from ...planning.treesearch import f_value
from ..tree import accept_rule
from ..tree.layout import TreeLayout
from ..tree.proposer import Drafted, Proposer
from .drafting import Draft, FeatureState, draft_trees_eagle, draft_trees_parallel, step_drafting_ms
from .dynamic_tree import draft_dynamic


class FeatureProposer(Proposer):
    """What eagle and parallelspec share at decode time: the prompt's features as the drafter's first pairs, the
    accepted path's as the next, verification with the draft q. A family supplies how it drafts every sample's
    tree (draft: the batch tree's static tree or --tree dynamic's; draft_static: a static tree's, what the pricing
    times) and whether its price is per depth."""

    drafter_model = True
    accept_rule = staticmethod(accept_rule.with_draft_q)
    per_depth = True  # one drafter forward per inner depth (its family's cost law), else one a step

    def __init__(self, target, guesser):
        super().__init__(target, guesser)
        self.drafter = guesser.art.drafter
        self._batch = None

    def start_batch(self, mode, slots):
        self._batch = engine(self.drafter, mode, slots, self.target.output_device)

    def leave(self, sample):
        if sample.slot in self._batch.rows:
            self._batch.release(sample.slot)

    def join(self, sample, batch_tree):
        """The prompt [T], causal: the target's features of every position (the drafter's first pairs)."""
        return Segment(sample.slot, sample.history), batch_tree.layouts[-1], len(sample.history) - 1

    def joined(self, sample, h, keep, sampling, batch_tree):
        """h [T, H] -> (first token, the pending pairs (f_i, x_{i+1}), the last pairing with the first token)."""
        root = next_token(target_logits(self.target.model, h[-1]), sampling, sample.generator)
        state = FeatureState()
        state.commit(h, torch.tensor(sample.history[1:] + [root], device=h.device))
        return root, state

    def propose(self, samples, states, batch_tree, sampling):
        """Every sample's tree in batched drafter forwards; its layout the batch tree's static one, or with --tree
        dynamic the one drafted this step."""
        drafts = self.draft(self._batch, samples, states, batch_tree, sampling)
        static = batch_tree.dynamic is None
        return [Drafted(d.tokens, d.q, batch_tree.layouts[0] if static else st.drafted, d.forwards)
                for d, st in zip(drafts, states)]

    def draft(self, batch, samples, states, batch_tree, sampling):
        """Every sample's tree (drafting.Draft each); a dynamic tree's layout left in its state's `drafted`."""
        raise NotImplementedError

    def draft_static(self, batch, samples, states, tree: Tree, sampling):
        """Every sample's drafting of one static tree (what the pricing times)."""
        raise NotImplementedError

    def advance(self, state, h, layout, path, emitted, all_logits):
        """The drafter gets its true features next step: the accepted path's, each with the token after it."""
        state.commit(h[path], torch.tensor(emitted, device=h.device))
        return state

    def time_drafting(self, tree, acceptance) -> float:
        """One step's drafting of `tree` as the batch-1 step runs it (drafting.step_drafting_ms: the pending pairs
        of about tau accepted tokens, the tree's widths, top-k and host copies), per drafter forward of the cost
        law (eagle: divided by the tree's depth; parallelspec drafts once a step)."""
        pending = max(1, round(1 + f_value(list(tree.paths), acceptance)))  # tau: the path's pairs
        ms = step_drafting_ms(self.drafter, lambda batch, samples, states: self.draft_static(
            batch, samples, states, tree, Sampling()), pending)
        return ms / max(tree.depth, 1) if self.per_depth else ms


class EagleProposer(FeatureProposer):
    """EAGLE's drafter: one forward per tree depth on its own predicted features."""

    def draft(self, batch, samples, states, batch_tree, sampling):
        """With --tree dynamic the drafter first drafts each sample's tree (dynamic_tree.py), greedily; at T > 0
        that shape's tokens are then sampled as a static tree's are, so the shape never depends on the samples
        (lossless)."""
        if batch_tree.dynamic is None:
            return self.draft_static(batch, samples, states, batch_tree.layouts[0].tree, sampling)
        m, depth, top_k = batch_tree.dynamic
        shapes = draft_dynamic(batch, self.drafter, samples, states, m, depth, top_k)
        for state, shape in zip(states, shapes):
            state.drafted = TreeLayout(shape.tree, None, shape.tokens.device)
        if sampling.greedy:
            return [Draft(shape.tokens, None, shape.forwards) for shape in shapes]
        drafts = draft_trees_eagle(batch, self.drafter, samples, states, [x.tree for x in shapes], sampling)
        return [Draft(d.tokens, d.q, shape.forwards + d.forwards) for d, shape in zip(drafts, shapes)]

    def draft_static(self, batch, samples, states, tree, sampling):
        return draft_trees_eagle(batch, self.drafter, samples, states, [tree] * len(samples), sampling)


class ParallelProposer(FeatureProposer):
    """ParallelSpec's drafter: k [MASK] inputs, k + 1 depths drafted in one forward."""

    per_depth = False

    def draft(self, batch, samples, states, batch_tree, sampling):
        dynamic = batch_tree.dynamic
        return draft_trees_parallel(batch, self.drafter, samples, states, batch_tree.layouts[0].tree, sampling,
                                    dynamic and dynamic[0])

    def draft_static(self, batch, samples, states, tree, sampling):
        return draft_trees_parallel(batch, self.drafter, samples, states, tree, sampling)
