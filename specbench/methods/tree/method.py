"""TreeMethod: one decoding step for every tree method (ppd, medusa, hidden-transfer, eagle, parallelspec),
at every batch size: batch 1 is the batch loop (methods/batch_loop.py) with one slot on the single-sequence engine.

A method is this class plus its family's three roles, which supply what differs: the artefact (guesser.py: Guesser),
the tree shapes it takes (shapes.py: TreeShapes) and the decode-time proposer (proposer.py: Proposer: the inputs
attached to nodes, the drafts, the next guesses); the step passes the proposer the batch size's tree and keeps the
acceptance rule (accept_rule.py) it verifies with.
Each step: 0. newcomers' prefill (the prompt, its last token carrying the root's node inputs); 1. draft every active
sample's tree tokens; 2. one target forward over every newcomer's prompt and every active sample's root, candidates
and node inputs (core/tree.py masks and positions them; the engine packs, pads or appends them); 3. accept the
longest verified path (step.py), per sample on its own random stream; 4. keep only the root and that path in the
cache. Counters: `drafted` counts the tree depth per step (the longest run that could be accepted).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from rich.markup import escape

from ... import families
from ...core.model.load import model_slug
from ...core.batch.ragged import Segment
from ...core.machine.timing import now
from ...core.tree import position_ids
from ...progress import console
from ..base import DecodeMethod
from ..batch_loop import Batchable, share_drafting
from ..options import ARTIFACT, TREE
from . import batch_trees
from . import accept_rule
from .guesser import Guesser
from .layout import TreeLayout
from .pricing import DraftPricing
from .proposer import Proposer
from .step import verify_and_accept


class TreeMethod(Batchable, DecodeMethod):
    """A tree method: the step composed with its family's roles (the class attribute `guesser_type`, the artefact,
    names the other two; `proposer_type` replaces its proposer)."""

    kind = "tree"
    option_specs = (TREE, ARTIFACT)
    guesser_type: ClassVar[type[Guesser]]  # what this method guesses with (its own file)
    proposer_type: ClassVar[type[Proposer] | None] = None  # None: the guesser's proposer_type
    typical = False  # the `-typical` variants: Medusa's typical acceptance at T > 0 (lossy)
    said_when_loaded = ("tree", "drafter")  # chosen() keys the load line below already printed (run says the rest)

    def __init_subclass__(cls, **kwargs):
        """A registered method's family and needs are its guesser's, its tree shape its family's declaration."""
        super().__init_subclass__(**kwargs)
        guesser = cls.__dict__.get("guesser_type")
        if guesser is not None:
            cls.family, cls.needs = guesser.family, ("target", guesser.artifact)
            cls.one_state = families.get(guesser.family).one_state

    def __init__(self, target, options=None, drafter=None):
        super().__init__(target, options, drafter)
        self.guesser = self.guesser_type(target, self.options.artifact)  # the artefact, loaded
        self.shapes = self.guesser.shapes_type(self.guesser, self.name)  # the trees it takes
        self.proposer = (self.proposer_type or self.guesser.proposer_type)(target, self.guesser)  # decode time
        # the rule the step accepts with: the proposer's, or Medusa's typical rule for a `-typical` twin (a run's
        # --synthetic-acceptance sets acceptance_rule, which the step takes instead)
        self.tree_rule = accept_rule.typical if self.typical else self.proposer.accept_rule
        # rows: token distances the guesses cover; ept: ensemble copies; table: embeddings of the node inputs
        self.rows, self.ept, self.table = self.guesser.rows, self.guesser.ept, self.guesser.table
        self.tree_spec = batch_trees.tree_spec(self.options)  # --tree, parsed once
        # per-rank probabilities the tree is searched and predicted with (acceptance_source: run.yaml, report.md)
        self.acceptance, self.acceptance_file, self.acceptance_source = batch_trees.per_rank_acceptance(
            self, self.rows, model_slug(target.spec))
        self.pricing = DraftPricing(self.time_drafting, target, self.family)  # the drafting's cost per step
        # batch size -> its BatchTree (batch_trees.py); `batch_tree`: the one the step decodes with (start_batch)
        self.trees: dict[int, batch_trees.BatchTree] = {1: batch_trees.first_tree(self)}
        self.batch_tree = self.trees[1]
        console.print(f"[dim]{self.name}: tree {escape(self.tree_source)} (size {self.tree_file.size}), "
                      f"{escape(self.guesser.description)}[/]")

    def time_drafting(self, tree=None) -> float | None:
        """The proposer's drafting of `tree` timed, in ms per drafting forward (pricing.DraftPricing); tree None:
        the one the step decodes with once chosen, else the family's searched tree of the default size (a tree
        being built is not known yet). None where nothing drafts beside the target's forward."""
        if not (self.proposer.drafter_model or self.proposer.advance_drafts):
            return None
        if tree is None:
            tree = (self.batch_tree.tree_file if getattr(self, "trees", None) else self.shapes.searched_tree(
                self.acceptance, batch_trees.DEFAULT_SIZE, "", "priced")).tree(0)
        return self.proposer.time_drafting(tree, self.acceptance)

    # the active batch tree's parts, as the step and the records read them
    tree_file = property(lambda self: self.batch_tree.tree_file)
    tree_source = property(lambda self: self.batch_tree.source)
    layouts = property(lambda self: self.batch_tree.layouts)
    m = property(lambda self: self.batch_tree.tree_file.prompt_tokens)  # prompt tokens the root carries

    def chosen(self) -> dict:
        return {**self.guesser.chosen(self.tree_source), **batch_trees.chosen(self)}

    def draft_cost(self, profile):
        """depth -> the drafter's ms per step on `profile`'s machine, for predicted speedups (None: no drafter): on
        this machine, the step's drafting of the tree it decodes with, timed as the step runs it."""
        tree = self.batch_tree.tree_file.tree(0) if self.one_state else None
        return self.pricing.cost(self.acceptance_file, profile, tree)

    def choose_per_batch_size(self, sizes: list[int]) -> None:
        batch_trees.choose(self, sizes)  # --tree auto: each batch size's tree from L(B, w)

    def _placed(self, layout: TreeLayout, past: int, prefix: int = 0) -> None:
        """A segment is about to be verified: `layout`'s root at position past + prefix (after `prefix` causal
        tokens of a prefill). Nothing by default; a test's oracle reads where its guesses land."""

    # the step (methods/batch_loop.py drives it): the proposer's calls (proposer.py), verify and accept (step.py);
    # each sample's state between steps is the proposer's dataclass, in sample.state

    def start_batch(self, mode: str, slots: int) -> None:
        self.batch_tree = self.trees.get(slots, self.trees[1])  # this batch size's, before the proposer's batch state
        self.proposer.start_batch(mode, slots)

    def leave(self, sample):
        self.proposer.leave(sample)

    def _proposed(self, samples, sampling) -> list:
        """proposer.propose; where it drafts with a model, each sample gets the forwards it took part in and an
        equal share of the drafting time (so the rows' draft_s add up to the batch's, as their wall_s do)."""
        if not samples:  # a step of newcomers only
            return []
        states = [s.state for s in samples]
        if not self.proposer.drafter_model:
            return self.proposer.propose(samples, states, self.batch_tree, sampling)
        d0 = now(self.target.device)
        drafts = self.proposer.propose(samples, states, self.batch_tree, sampling)
        share_drafting(samples, now(self.target.device) - d0)
        for s, d in zip(samples, drafts):
            s.gen.draft_forwards += d.forwards
        return drafts

    def decode_step(self, target, joining, active, max_new_tokens, sampling):
        """Newcomers' prefill (the prompt, its last token carrying the root's node inputs) and every active sample's
        tree (root, candidates, node inputs; its tree mask and positions) in one forward of the batch engine."""
        stop_ids = self.target.tokenizer.stop_ids
        proposer = self.proposer
        placed = {}  # id(segment) -> (layout, prefix): what the proposer's hook around the forward reads
        joined = []
        for s in joining:  # 0. prefill (proposer.join)
            seg, layout, prefix = proposer.join(s, self.batch_tree)
            self._placed(layout, 0, prefix)
            placed[id(seg)] = (layout, prefix)
            joined.append(seg)
        # 1. draft: every active sample's tree tokens, root first [N] (and q [N, V] at T > 0 where the rule needs
        # it), with the layout the target verifies (the batch tree's, or EAGLE-2's drafted this step)
        drafts = self._proposed(active, sampling)
        steps, pasts = [], []
        for s, d in zip(active, drafts):
            past = target.lengths[s.slot]
            self._placed(d.layout, past)
            pasts.append(past)
            steps.append(Segment(s.slot, d.tokens.tolist(), positions=position_ids(d.layout.offsets, past)[0].tolist(),
                                 mask=d.layout.visible, embeds=proposer.embed(d.tokens, d.layout)[0]))
            placed[id(steps[-1])] = (d.layout, 0)

        def around(segments, places):  # the proposer's hook, told where each segment's inputs lie
            return proposer.around([(*placed[id(seg)], at) for seg, at in zip(segments, places)])

        # 2. verify: one forward over every newcomer's prefill and every active sample's tree
        first, hidden = target.forward(joined, steps, hidden=True, around=around)
        finished = []
        for s, h in zip(joining, first):
            keep = (lambda path, s=s: target.keep_offsets(s.slot, len(s.history) - 1, path))
            root, s.state = proposer.joined(s, h, keep, sampling, self.batch_tree)
            s.history.append(root)
            if s.gen.emit([root], stop_ids, max_new_tokens):
                finished.append(s)
        rule = self.tree_rule if self.acceptance_rule is None else accept_rule.stated(self.acceptance_rule)
        for s, h, d, past in zip(active, hidden, drafts, pasts):
            # 3. accept and 4. update cache (step.py), on this sample's own random stream
            emitted, s.state = verify_and_accept(
                self.target.model, proposer, rule, s.state, d, h,
                lambda path, s=s, past=past: target.keep_offsets(s.slot, past, path), sampling, s.generator, s.gen)
            s.history += emitted
            if s.gen.emit(emitted, stop_ids, max_new_tokens):
                finished.append(s)
        return finished
