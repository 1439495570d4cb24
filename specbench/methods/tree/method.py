"""TreeMethod: one decoding step for every tree method (ppd, medusa, hidden-transfer, eagle, parallelspec),
at every batch size: batch 1 is the batch loop (methods/batch_loop.py) with one slot on the single-sequence engine.

A method is this class plus a Guesser (guesser.py) that supplies what differs: the artefact, the inputs attached
to nodes, the drafts, the next guesses, the tree shapes it takes and its acceptance rule.
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
from . import plan
from .guesser import Guesser
from .layout import TreeLayout
from .pricing import DraftPricing
from .step import verify_and_accept


class TreeMethod(Batchable, DecodeMethod):
    """A tree method: the step composed with its guesser (the class attribute `guesser_type`)."""

    kind = "tree"
    option_specs = (TREE, ARTIFACT)
    guesser_type: ClassVar[type[Guesser]]  # what this method guesses with (its own file)
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
        self.guesser = self.guesser_type(self)
        # rows: token distances the guesses cover; ept: ensemble copies; table: embeddings of the node inputs
        self.rows, self.ept, self.table, artifact = self.guesser.load()
        self.tree_spec = plan.tree_spec(self.options)  # --tree, parsed once
        # per-rank probabilities the tree is searched and predicted with (acceptance_source: run.yaml, report.md)
        self.acceptance, self.acceptance_file, self.acceptance_source = plan.per_rank_acceptance(
            self, self.rows, model_slug(target.spec))
        self.pricing = DraftPricing(self.guesser.time_drafting, target, self.family)  # the drafting's cost per step
        # batch size -> its TreePlan (plan.py); `plan` is the one the step decodes with (start_batch picks it)
        self.plans: dict[int, plan.TreePlan] = {1: plan.first_plan(self)}
        self.plan = self.plans[1]
        console.print(f"[dim]{self.name}: tree {escape(self.tree_source)} (size {self.tree_file.size}), "
                      f"{escape(artifact)}[/]")

    # the active plan's parts, as the step and the records read them
    tree_file = property(lambda self: self.plan.tree_file)
    tree_source = property(lambda self: self.plan.source)
    layouts = property(lambda self: self.plan.layouts)
    m = property(lambda self: self.plan.tree_file.prompt_tokens)  # prompt tokens the root carries

    def chosen(self) -> dict:
        return {**self.guesser.chosen(), **plan.chosen(self)}

    def draft_cost(self, profile):
        """depth -> the drafter's ms per step on `profile`'s machine, for predicted speedups (None: no drafter): on
        this machine, the step's drafting of the tree it decodes with, timed as the step runs it."""
        return self.pricing.cost(self.acceptance_file, profile, self.plan.tree_file.tree(0) if self.one_state else None)

    def plan_batches(self, sizes: list[int]) -> None:
        plan.plan_batches(self, sizes)  # --tree auto: each batch size's tree from L(B, w)

    def _placed(self, layout: TreeLayout, past: int, prefix: int = 0) -> None:
        """A segment is about to be verified: `layout`'s root at position past + prefix (after `prefix` causal
        tokens of a prefill). Nothing by default; a test's oracle reads where its guesses land."""

    # the step (methods/batch_loop.py drives it): the guesser's hooks (guesser.py), verify and accept (step.py)

    def start_batch(self, mode: str, slots: int) -> None:
        self.plan = self.plans.get(slots, self.plans[1])  # this batch size's tree, before the guesser's batch state
        self.guesser.start_batch(mode, slots)

    def leave(self, sample):
        self.guesser.leave(sample)

    def _drafted_batch(self, samples, sampling) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """guesser.draft_batch; where it drafts with a model, each sample gets the forwards it took part in and an
        equal share of the drafting time (so the rows' draft_s add up to the batch's, as their wall_s do)."""
        if not samples:  # a step of newcomers only
            return []
        if not self.guesser.drafter_model:
            return [d[:2] for d in self.guesser.draft_batch(samples, sampling)]
        d0 = now(self.target.device)
        drafts = self.guesser.draft_batch(samples, sampling)
        share_drafting(samples, now(self.target.device) - d0)
        for s, (_, _, forwards) in zip(samples, drafts):
            s.gen.draft_forwards += forwards
        return [d[:2] for d in drafts]

    def decode_step(self, target, joining, active, max_new_tokens, sampling):
        """Newcomers' prefill (the prompt, its last token carrying the root's node inputs) and every active sample's
        tree (root, candidates, node inputs; its tree mask and positions) in one forward of the batch engine."""
        stop_ids = self.target.tokenizer.stop_ids
        placed = {}  # id(segment) -> (layout, prefix): what the guesser's hook around the forward reads
        joined = []
        for s in joining:  # 0. prefill (guesser.join)
            seg, layout, prefix = self.guesser.join(s)
            self._placed(layout, 0, prefix)
            placed[id(seg)] = (layout, prefix)
            joined.append(seg)
        # 1. draft: every active sample's tree tokens, root first [N] (and q [N, V] at T > 0 where the rule needs it)
        drafts = self._drafted_batch(active, sampling)
        steps = []
        for s, (tokens, q) in zip(active, drafts):
            layout = self.guesser.layout_for(s.scratch["guesses"])
            layout = self.guesser.drafted_layout(s.scratch["guesses"], layout)  # EAGLE-2: drafted this step
            past = target.lengths[s.slot]
            self._placed(layout, past)
            s.scratch.update(layout=layout, tokens=tokens, q=q, past=past)
            steps.append(Segment(s.slot, tokens.tolist(), positions=position_ids(layout.offsets, past)[0].tolist(),
                                 mask=layout.visible, embeds=self.guesser.embed(tokens, layout)[0]))
            placed[id(steps[-1])] = (layout, 0)

        def around(segments, places):  # the guesser's hook, told where each segment's inputs lie
            return self.guesser.around([(*placed[id(seg)], at) for seg, at in zip(segments, places)])

        # 2. verify: one forward over every newcomer's prefill and every active sample's tree
        first, hidden = target.forward(joined, steps, hidden=True, around=around)
        finished = []
        for s, h in zip(joining, first):
            root, s.scratch["guesses"] = self.guesser.joined(
                s, h, lambda path, s=s: target.keep_offsets(s.slot, len(s.history) - 1, path), sampling)
            s.history.append(root)
            if s.gen.emit([root], stop_ids, max_new_tokens):
                finished.append(s)
        for s, h in zip(active, hidden):
            # 3. accept and 4. update cache (step.py), on this sample's own random stream
            past = s.scratch["past"]
            emitted, s.scratch["guesses"] = verify_and_accept(
                self, s.scratch["guesses"], s.scratch["tokens"], s.scratch["q"], h, s.scratch["layout"],
                lambda path, s=s, past=past: target.keep_offsets(s.slot, past, path), sampling, s.generator, s.gen)
            s.history += emitted
            if s.gen.emit(emitted, stop_ids, max_new_tokens):
                finished.append(s)
        return finished
