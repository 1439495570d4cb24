"""The decode-time side of a tree family: its Proposer, which the tree step (method.py) calls at every batch size.
The step passes in what it decides (this batch size's tree, batch_trees.BatchTree; the acceptance rule:
accept_rule.py) and keeps each sample's state, a dataclass of the family's (here GuessRows); the proposer never
reads the method.

The calls, in step order: start_batch (per-batch state: a drafter's engine), join / joined (a newcomer's prefill
segment, then its first token and state), propose (every active sample's tree: tokens, draft q, the layout the
target verifies, drafter forwards), around (a hook around the target's forward: Hidden Transfer's pseudo
positions), advance (the next state from the accepted path), leave (a sample left the batch); time_drafting prices
one step's drafting (pricing.py). The defaults are those of families whose guesses come from inputs attached to
tree nodes (PPD's prompt tokens and their kin): the node's rows enter the target's forward and their logits at the
accepted node give the next candidates (top-k per distance)."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch

from ..ppd import artifact as pt
from ...core.batch.forward import target_logits
from ...core.batch.ragged import Segment
from ...core.tree import Tree, position_ids, visibility
from ...core.verify import next_token
from . import accept_rule
from .layout import TreeLayout


@dataclass
class GuessRows:
    """A sample's state between steps where the guesses ride in the target's forward: the accepted node's guess
    logits [c, V], one row per token distance (c also picks the tree state: a node that carried c inputs)."""

    logits: torch.Tensor


@dataclass(frozen=True)
class Drafted:
    """One sample's proposal: tokens [N] root first, draft q [N, V] or None (T = 0, or deterministic drafts), the
    layout the target verifies them with, and the drafter forwards the sample took part in."""

    tokens: torch.Tensor
    q: torch.Tensor | None
    layout: TreeLayout
    forwards: int = 0


class Proposer:
    """A family's decode-time proposals from its loaded artefact `guesser` (guesser.py) on `target`."""

    drafter_model = False  # drafts with a model of its own: the step counts its time and forwards
    advance_drafts = False  # `advance` runs a model of its own (Medusa's heads): step.py times it as drafting
    edits_layers = False  # `around` edits the target's layers (Hidden Transfer): compiled with its edits in the graph
    taps_layers = False  # `around` reads the target's layer inputs (EAGLE-3): compiled with them as the step's output
    accept_rule = staticmethod(accept_rule.speculative)  # the family's rule (a `-typical` twin: the method's)

    def __init__(self, target, guesser):
        self.target, self.guesser = target, guesser

    def start_batch(self, mode: str, slots: int) -> None:
        """Per-batch state (a feature drafter: its own engine in the target's mode)."""

    def leave(self, sample) -> None:
        """A sample left the batch (a feature drafter: its drafter slot goes too)."""

    def embed(self, tokens: torch.Tensor, layout: TreeLayout) -> torch.Tensor:
        """Input embeddings of [prefix tokens, root, candidates | rows attached to nodes] [1, prefix + q, H]."""
        return pt.embed(self.target.model, tokens, layout.rows)

    def join(self, sample, batch_tree) -> tuple[Segment, TreeLayout, int]:
        """A newcomer's prefill as batch 1's: the prompt [T], its last token carrying the root's node inputs ->
        (its segment, the layout and prefix length its inputs follow: where `around` finds its node inputs)."""
        layout, prefix = batch_tree.layouts[0], len(sample.history) - 1
        ids = torch.tensor(sample.history, device=self.target.device)  # [T]
        return Segment(sample.slot, sample.history, keep=layout.visible.shape[0],
                       positions=position_ids(layout.offsets, 0, prefix)[0].tolist(),
                       mask=visibility(layout.visible, 0, prefix), embeds=self.embed(ids, layout)[0]), layout, prefix

    def joined(self, sample, h: torch.Tensor, keep, sampling, batch_tree) -> tuple[int, object]:
        """The newcomer's hidden states [q_0, H] (root, node inputs) -> (first token, first state); `keep(offsets)`
        compacts its cache from the root on (the root's node inputs leave it)."""
        keep([0])
        root = next_token(target_logits(self.target.model, h[0]), sampling, sample.generator)
        return root, GuessRows(self.next_guesses(h, batch_tree.layouts[0], 0))  # [m, V]

    def propose(self, samples, states: list, batch_tree, sampling) -> list[Drafted]:
        """Every active sample's tree, on its own random stream: here the top-k guesses of the accepted node's
        guess rows by rank, no model run (the layout: the state's, c guess rows -> state c)."""
        out = []
        for s, state in zip(samples, states):
            layout = batch_tree.layouts[state.logits.shape[0]]
            out.append(Drafted(self.candidates(state.logits, layout.tree, s.history[-1]), None, layout))
        return out

    @staticmethod
    def candidates(guesses: torch.Tensor, tree: Tree, root: int) -> torch.Tensor:
        """Candidate tokens [N] root first: the top-k of guess rows [c, V] by rank per depth."""
        topk = guesses[: tree.depth].topk(max(tree.top_ranks, 1), dim=-1).indices  # [D, K]
        root_t = torch.tensor([root], device=topk.device)  # the rows' device (the LM head's under a device map)
        return torch.cat([root_t, tree.candidate_tokens(topk)])  # [N]

    def compiled_calls(self) -> dict:
        """name -> (module, function (module, *args) -> tensor): the small forwards of its own that a --compile run
        compiles beside the target's step (core/model/compile_call.py: Medusa's heads); none by default."""
        return {}

    def around(self, parts: list[tuple[TreeLayout, int, torch.Tensor]]):
        """A context manager around one batched target forward, given per segment (its layout, its prefix length,
        where its inputs lie: places [w] in the hidden states flattened to [B * q, H]). Nothing by default."""
        return nullcontext()

    def next_guesses(self, h: torch.Tensor, layout: TreeLayout, node: int,
                     all_logits: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [c, V] of the c node inputs of `node`, averaged over their ensemble copies (PPD §3.2); taken
        from all_logits [q, V] when the step already computed the head over every input."""
        slots = layout.tree.prompt_slots[node]
        if not slots:
            return h.new_zeros(0, self.target.vocab_size)
        idx = torch.tensor(slots, device=h.device)  # [c, E]
        if all_logits is not None:
            return all_logits[idx].mean(1)
        return target_logits(self.target.model, h[idx]).mean(1)

    def advance(self, state, h: torch.Tensor, layout: TreeLayout, path: list[int], emitted: list[int],
                all_logits: torch.Tensor | None):
        """The next state from the accepted path: the accepted node's guesses [c, V] (c is the next tree state)."""
        return GuessRows(self.next_guesses(h, layout, path[-1], all_logits))

    def time_drafting(self, tree: Tree, acceptance) -> float | None:
        """Median milliseconds per drafting forward (the cost law's unit: its family's Family.cost_law) of one
        step's drafting of `tree` as the step runs it, with per-rank `acceptance` (how many pairs a step accepts);
        None: nothing drafts beside the target's forward. The method prices its drafting with it (pricing.py)."""
        return None
