"""The tree engine: one decoding loop for every tree method (ppd, medusa, hidden-transfer, eagle, parallelspec).

A method is this class plus a Guesser (guesser.py) that supplies what differs: the artefact, the inputs attached
to nodes, how the forward runs, the drafts, the next guesses, the tree shapes it takes and its acceptance rule.
Each step: 1. draft the tree's tokens; 2. one target forward over the root and every candidate (and the inputs
attached to nodes; core/tree.py masks them); 3. accept the longest verified path (step.py); 4. keep only the root
and that path in the cache. Batch 1 is `generate`; batch > 1 (methods/batch_loop.py) is `decode_step`, every
sample's tree in one forward and the same step.py per sample; the guesser's batch hooks give a newcomer's prefill,
every sample's drafts at once (a drafter model: batched drafter forwards) and a hook around the batched forward.
Counters: `drafted` counts the tree depth per step (the longest run that could be accepted).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from rich.markup import escape

from ...core.batch.cache import cache_length, keep_positions, new_cache
from ...core.model.load import model_slug
from ...core.batch.ragged import Segment
from ...core.machine.timing import now
from ...core.tree import Tree, TreeFile, position_ids
from ...progress import console
from ..base import DecodeMethod, Generation
from ..batch_loop import Batchable
from ..options import ARTIFACT, TREE
from . import batch_trees
from .guesser import Guesser
from .layout import TreeLayout
from .resolution import per_rank_acceptance
from .step import verify_and_accept


class TreeMethod(Batchable, DecodeMethod):
    """A tree method: the engine composed with its guesser (the class attribute `guesser_type`)."""

    kind = "tree"
    option_specs = (TREE, ARTIFACT)
    guesser_type: ClassVar[type[Guesser]]  # what this method guesses with (its own file)
    typical = False  # the `-typical` variants: Medusa's typical acceptance at T > 0 (lossy)

    def __init_subclass__(cls, **kwargs):
        """A registered method's family, tree shape and needs are its guesser's (declared once per guesser)."""
        super().__init_subclass__(**kwargs)
        guesser = cls.__dict__.get("guesser_type")
        if guesser is not None:
            cls.family, cls.one_state, cls.needs = guesser.family, guesser.one_state, ("target", guesser.artifact)

    def __init__(self, target, options=None, drafter=None):
        super().__init__(target, options, drafter)
        self.guesser = self.guesser_type(self)
        rows, ept, table, artifact = self.guesser.load()  # rows: token distances the guesses cover
        model_name = model_slug(target.spec)  # the file-name key every command uses (trees/, acceptance/)
        # acceptance_source: where predicted tau comes from (run.yaml, report.md)
        acc, acc_path, self.acceptance_source = per_rank_acceptance(self, rows, model_name)

        def build(size: int) -> TreeFile:
            return self.guesser.searched_tree(acc, rows, size, model_name,
                                              str(acc_path) if acc_path else "a generic table")

        self.tree_file, self.tree_source = self.guesser.resolve_tree(build, model_name, rows, ept)
        self.guesser.check_tree(rows)
        self.m, self.ept = self.tree_file.prompt_tokens, ept
        self.rows, self.table = rows, table  # what a batch size's own tree is checked and laid out with
        self.layouts: dict[int, TreeLayout] = self.guesser.layouts(table, ept, target.device)
        # batch size -> its tree (batch_trees.py: --tree auto per batch size); batch 1's is the one just resolved
        self.batch_trees = {1: batch_trees.BatchTree(self.tree_file, self.tree_source, self.layouts, "batch 1")}
        self.acceptance = acc  # per-rank probabilities (for predicted tau / speedup in reports)
        console.print(f"[dim]{self.name}: tree {escape(self.tree_source)} (size {self.tree_file.size}), "
                      f"{escape(artifact)}[/]")
        self.acceptance_file = acc_path  # draft_cost(profile) reads the drafter's cost from it

    def chosen(self) -> dict:
        return {**self.guesser.chosen(), **batch_trees.chosen(self)}

    def draft_cost(self, profile):
        """depth -> the drafter's ms per step on `profile`'s machine, for predicted speedups (None: no drafter)."""
        return self.guesser.draft_cost(self.acceptance_file, profile)

    def plan_batches(self, sizes: list[int]) -> None:
        batch_trees.plan(self, sizes)  # --tree auto: each batch size's tree from L(B, w)

    # the two calls a step makes into the guesser that tests (and subclasses) may watch

    def _forward(self, tokens: torch.Tensor, layout: TreeLayout, cache, prefix: int = 0) -> torch.Tensor:
        """One forward of [prefix tokens, root, candidates | node inputs] -> hidden states of the tree [q, H]."""
        return self.guesser.forward(tokens, layout, cache, prefix)

    def _prompt_logits(self, h: torch.Tensor, layout: TreeLayout, node: int,
                       all_logits: torch.Tensor | None = None) -> torch.Tensor:
        """The next step's guesses [c, V] read at `node` (prompt tokens, heads, pseudo positions)."""
        return self.guesser.next_guesses(h, layout, node, all_logits)

    def _draft(self, state, tree: Tree, root: int, sampling, generator):
        """The tree's tokens [N] root first, the draft q [N, V] or None (where the rule needs it), drafter forwards."""
        return self.guesser.draft(state, tree, root, sampling, generator)

    def _drafted(self, gen: Generation, state, tree: Tree, root: int, sampling, generator):
        """_draft, counting the drafter's time and forwards where the guesser drafts with a model of its own."""
        if not self.guesser.drafter_model:
            return self._draft(state, tree, root, sampling, generator)[:2]
        d0 = now(self.target.device)
        tokens, q, forwards = self._draft(state, tree, root, sampling, generator)
        gen.draft_s += now(self.target.device) - d0
        gen.draft_forwards += forwards
        return tokens, q

    @torch.inference_mode()
    def generate(self, input_ids, max_new_tokens, sampling, generator):
        batch_trees.use(self, 1)  # batch 1's tree (a batched job may have made another batch size's active)
        stop_ids = self.target.tokenizer.stop_ids
        gen = Generation()
        cache = new_cache(self.target.model)
        # 0. prefill: the prompt [T]; the first token and the first guesses
        root, state = self.guesser.prefill(input_ids[0], cache, sampling, generator)
        done = gen.emit([root], stop_ids, max_new_tokens)
        while not done:
            layout = self.guesser.layout_for(state)
            # 1. draft: the tree's tokens, root first (and the draft q at T > 0 where the rule needs it)
            tokens, q = self._drafted(gen, state, layout.tree, root, sampling, generator)  # [N], [N, V]
            layout = self.guesser.drafted_layout(state, layout)  # EAGLE-2's dynamic tree: drafted this step
            # 2. verify: one forward over the root, the candidates and the inputs attached to nodes
            past = cache_length(cache)
            h = self._forward(tokens, layout, cache)  # [q, H]
            # 3. accept and 4. update cache (step.py): emitted = accepted path + the target's next token
            emitted, state = verify_and_accept(self, state, tokens, q, h, layout,
                                               lambda path, past=past: keep_positions(cache, past, path),
                                               sampling, generator, gen)
            root = emitted[-1]
            done = gen.emit(emitted, stop_ids, max_new_tokens)
        return gen

    # batch > 1 (methods/batch_loop.py): the guesser's batch hooks (guesser.py), the one step (step.py)

    def start_batch(self, mode: str, slots: int) -> None:
        batch_trees.use(self, slots)  # this batch size's own tree (--tree auto), before the guesser's batch state
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
        share = (now(self.target.device) - d0) / max(len(samples), 1)
        for s, (_, _, forwards) in zip(samples, drafts):
            s.gen.draft_s += share
            s.gen.draft_forwards += forwards
        return [d[:2] for d in drafts]

    def decode_step(self, target, joining, active, max_new_tokens, sampling):
        """Batch > 1: newcomers' prefill (the prompt, its last token carrying the root's node inputs) and every
        active sample's tree (root, candidates, node inputs; its tree mask and positions) in one batched forward."""
        stop_ids = self.target.tokenizer.stop_ids
        placed = {}  # id(segment) -> (layout, prefix): what the guesser's hook around the forward reads
        joined = []
        for s in joining:  # 0. prefill, as batch 1's (guesser.join)
            seg, layout, prefix = self.guesser.join(s)
            placed[id(seg)] = (layout, prefix)
            joined.append(seg)
        # 1. draft: every active sample's tree tokens, root first [N] (and q [N, V] at T > 0 where the rule needs it)
        drafts = self._drafted_batch(active, sampling)
        steps = []
        for s, (tokens, q) in zip(active, drafts):
            layout = self.guesser.layout_for(s.scratch["guesses"])
            layout = self.guesser.drafted_layout(s.scratch["guesses"], layout)  # as batch 1's
            past = target.lengths[s.slot]
            s.scratch.update(layout=layout, tokens=tokens, q=q, past=past)
            steps.append(Segment(s.slot, tokens.tolist(), positions=position_ids(layout.offsets, past)[0].tolist(),
                                 mask=layout.visible, embeds=self.guesser.embed(tokens, layout)[0]))
            placed[id(steps[-1])] = (layout, 0)

        def around(segments, places):  # the guesser's hook, told where each segment's inputs lie
            return self.guesser.around([(*placed[id(seg)], at) for seg, at in zip(segments, places)])

        # 2. verify: one batched forward over every newcomer's prefill and every active sample's tree
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
