"""What a tree method supplies to the tree step (method.py): a Guesser. The defaults are those of methods whose
guesses come from inputs attached to tree nodes (PPD's prompt tokens and their kin): the node's rows enter the
target's forward, their logits at the accepted node give the next step's candidates (top-k per distance), PPD's
dynamic tree is searched, and acceptance is lossless speculative sampling (or Medusa's typical rule).

The step (method.decode_step, at every batch size) asks the guesser for a newcomer's prefill segment and its first
state (join / joined), every active sample's drafts at once (draft_batch: one batched drafter forward where the
guesser drafts with a model), a hook around the target's forward (around: Hidden Transfer's pseudo positions), the
accepted path (accept) and the next state (advance)."""

from __future__ import annotations

from contextlib import nullcontext

import torch

from ..ppd import artifact as pt
from ...core.batch.forward import target_logits
from ...core.batch.ragged import Segment
from ...core.tree import Tree, position_ids, visibility
from ...core.tree_file import TreeFile
from ...core.verify import next_token, tree_speculative_accept, tree_typical_accept
from ...errors import SpecbenchError
from .layout import TreeLayout
from .plan import searched_tree
from .pricing import GuessScorer


class Guesser:
    """One tree method's guesses. `state` is what a step's drafting starts from: here the accepted node's guess
    logits [c, V] (c also picks the tree state); a feature drafter keeps its own (methods/eagle/drafting.py).

    Its parts, by who asks: the artefact (scorer for `estimate`, load for a run); the tree plan's questions
    (searched_tree, check_tree, layouts, dynamic_shape: plan.py); the decode-time protocol the step calls
    (start_batch, join / joined, draft / draft_batch, layout_for / drafted_layout, around, accept, advance, leave);
    time_drafting, which prices its drafting (pricing.py)."""

    family: str  # its declaration's name (specbench/families/): tree shape, cost law, files, scorer, trainer
    artifact: str  # what the method needs beside the target, for `specbench list methods`
    drafter_model = False  # drafts with a model of its own: the engine counts its time and forwards
    advance_drafts = False  # `advance` runs a model of its own (Medusa's heads): step.py times it as drafting

    def __init__(self, method):
        self.method = method
        self.target = method.target

    # ---------------------------------------------------------------- the artefact and the trees it accepts

    @classmethod
    def scorer(cls, target, artifact: str | None, initial: bool = False) -> GuessScorer:
        """The artefact (--artifact, default the shipped one) loaded for `specbench estimate`, without a method."""
        raise NotImplementedError

    def load(self) -> tuple[int, int, torch.Tensor | None, str]:
        """Load the artefact: (token distances guessed, ensemble copies, embedding table [S * E, H] of the inputs
        attached to nodes or None, a description for the console)."""
        raise NotImplementedError

    # the tree plan's questions (plan.py): a tree of a size, whether the artefact can guess a tree, its layouts

    def searched_tree(self, acc, rows: int, size: int, model_name: str, source: str) -> TreeFile:
        """The family's tree of `size` from per-rank probabilities: PPD's dynamic sparse tree by default."""
        return searched_tree(acc, rows, size, model_name, source)

    def check_tree(self, tree_file: TreeFile, source: str, rows: int) -> None:
        """Refuse a tree this artefact cannot guess (SpecbenchError naming both)."""

    def layouts(self, tree_file: TreeFile, table, ept: int, device) -> dict:
        """state -> TreeLayout; state 0 is the prefill (and the step after a node that carried no prompt tokens)."""
        m = tree_file.prompt_tokens
        layouts = {k: TreeLayout(tree_file.tree(k, ept), table, device) for k in tree_file.states}
        layouts[0] = TreeLayout(Tree((), (m,), ept), table, device)
        return layouts

    def dynamic_shape(self, tree_file: TreeFile) -> tuple[int, int, int] | None:
        """--tree dynamic's shape for a static tree of its size: (candidates, depth, top-k); None: no dynamic tree."""
        return None

    def layout_for(self, state) -> TreeLayout:
        return self.method.layouts[state.shape[0]]

    def drafted_layout(self, state, layout: TreeLayout) -> TreeLayout:
        """The layout the step verifies after drafting: the state's, unless the draft chose the tree itself."""
        return layout

    def chosen(self) -> dict:
        return {}

    def time_drafting(self, tree: Tree | None = None) -> float | None:
        """Median milliseconds per drafting forward (the cost law's unit: its family's Family.cost_law) of one step's
        drafting of `tree` as the step runs it (None: priced_tree()); None: nothing drafts beside the target's
        forward. The method prices its drafting with it (pricing.DraftPricing)."""
        return None

    def priced_tree(self) -> Tree:
        """The tree a drafting is priced on when none is named: the one the step decodes with once planned, else
        the family's searched tree of the default size (a tree being built is not known yet)."""
        method = self.method
        if getattr(method, "plans", None):
            return method.plan.tree_file.tree(0)
        from .plan import DEFAULT_SIZE

        return self.searched_tree(method.acceptance, method.rows, DEFAULT_SIZE, "", "priced").tree(0)

    # ---------------------------------------------------------------- the step

    def embed(self, tokens: torch.Tensor, layout: TreeLayout) -> torch.Tensor:
        """Input embeddings of [prefix tokens, root, candidates | rows attached to nodes] [1, prefix + q, H]."""
        return pt.embed(self.target.model, tokens, layout.rows)

    def next_guesses(self, h: torch.Tensor, layout: TreeLayout, node: int,
                     all_logits: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [c, V] of the c prompt tokens of `node`, averaged over their ensemble copies (PPD §3.2); taken
        from all_logits [q, V] when the step already computed the head over every input."""
        slots = layout.tree.prompt_slots[node]
        if not slots:
            return h.new_zeros(0, self.target.vocab_size)
        idx = torch.tensor(slots, device=h.device)  # [c, E]
        if all_logits is not None:
            return all_logits[idx].mean(1)
        return target_logits(self.target.model, h[idx]).mean(1)

    def draft(self, state: torch.Tensor, tree: Tree, root: int, sampling,
              generator) -> tuple[torch.Tensor, torch.Tensor | None, int]:
        """Candidate tokens = top-k guesses of the accepted node's guess rows, by rank -> (tokens [N], q None,
        no drafter forwards)."""
        topk = state[: tree.depth].topk(max(tree.top_ranks, 1), dim=-1).indices  # [D, K]
        root_t = torch.tensor([root], device=topk.device)  # the states' device (the LM head's under a device map)
        return torch.cat([root_t, tree.candidate_tokens(topk)]), None, 0  # [N]

    def accept(self, tokens, parents, logits, q, sampling, generator) -> tuple[list[int], int]:
        """The longest verified path and the target's next token (verify.py)."""
        if self.method.typical:
            return tree_typical_accept(tokens, parents, logits, sampling, generator)
        return tree_speculative_accept(tokens, parents, logits, sampling, generator)

    def advance(self, state, h: torch.Tensor, layout: TreeLayout, path: list[int], emitted: list[int],
                all_logits: torch.Tensor | None):
        """The next state: the accepted node's guesses [c, V] (c is the next tree state)."""
        return self.next_guesses(h, layout, path[-1], all_logits)

    # ---------------------------------------------------------------- joining, drafting, the forward's hook

    def start_batch(self, mode: str, slots: int) -> None:
        """Per-batch state (a feature drafter: its own batch engine in the target's mode)."""

    def leave(self, sample) -> None:
        """A sample left the batch (a feature drafter: its drafter row goes too)."""

    def join(self, sample) -> tuple[Segment, TreeLayout, int]:
        """A newcomer's prefill as batch 1's: the prompt [T], its last token carrying the root's node inputs ->
        (its segment, the layout and prefix length its inputs follow: where `around` finds its node inputs)."""
        layout, prefix = self.method.layouts[0], len(sample.history) - 1
        ids = torch.tensor(sample.history, device=self.target.device)  # [T]
        return Segment(sample.slot, sample.history, keep=layout.visible.shape[0],
                       positions=position_ids(layout.offsets, 0, prefix)[0].tolist(),
                       mask=visibility(layout.visible, 0, prefix), embeds=self.embed(ids, layout)[0]), layout, prefix

    def joined(self, sample, h: torch.Tensor, keep, sampling) -> tuple[int, object]:
        """The newcomer's hidden states [q_0, H] (root, node inputs) -> (first token, first state); `keep(offsets)`
        compacts its cache from the root on (the root's node inputs leave it)."""
        keep([0])
        root = next_token(target_logits(self.target.model, h[0]), sampling, sample.generator)
        return root, self.next_guesses(h, self.method.layouts[0], 0)  # [m, V]

    def draft_batch(self, samples, sampling) -> list[tuple[torch.Tensor, torch.Tensor | None, int]]:
        """Every active sample's (tokens [N] root first, q [N, V] or None, drafter forwards it took part in), on
        its own random stream. Guesses that cost no model: batch 1's draft, sample by sample."""
        return [self.draft(s.scratch["guesses"], self.layout_for(s.scratch["guesses"]).tree, s.history[-1],
                                   sampling, s.generator) for s in samples]

    def around(self, parts: list[tuple[TreeLayout, int, torch.Tensor]]):
        """A context manager around one batched target forward, given per segment (its layout, its prefix length,
        where its inputs lie: places [w] in the hidden states flattened to [B * q, H]). Nothing by default."""
        return nullcontext()
