"""`hidden-transfer`: Hidden Transfer (Wu et al. 2024, "Parallel Decoding via Hidden Transfer for Lossless Large
Language Model Acceleration", §3.2-3.4), on the tree step (methods/tree/method.py).

Every tree node carries up to k pseudo positions, laid out exactly as PPD's prompt tokens are (core/tree.py): pseudo
position j of node i sits at position(i) + j, sees the context, i's path and pseudo positions 1..j-1 of i (the
paper's "No masked" setting). They enter the forward as placeholders; at transfer layer l_j the placeholder becomes
W_j h_i, node i's own hidden state entering that layer (methods/hidden_transfer/layers.py), and the rest of the layers refine it.
Verification is ppd's (exact match at T = 0, lossless multi-candidate speculative sampling at T > 0); the pseudo
positions of the accepted node give the next step's candidates and, as in PPD, how many it carried is the next
state of the tree, so `build-tree --method hidden-transfer` searches PPD's dynamic sparse tree over this method's
own per-rank accuracies. Pseudo positions never stay in the KV cache (only the root and the accepted path do).
"""

from __future__ import annotations

import torch

from . import artifact as tp
from .layers import transferred
from ...errors import SpecbenchError
from .scoring import transfer_ranks
from ..base import register
from ..tree.method import TreeMethod
from ..tree.guesser import Guesser
from ..tree.proposer import Proposer
from ..tree.pricing import GuessScorer
from ..tree.layout import TreeLayout


def transfer_slots(layout: TreeLayout, steps: int, prefix: int, device) -> tuple[list[torch.Tensor], list]:
    """Per transfer step j: the input indices of every node's pseudo position j [P_j] and of that node [P_j], in a
    forward that starts with `prefix` causal tokens (a prefill whose last token is the root)."""
    slots: list[list[int]] = [[] for _ in range(steps)]
    sources: list[list[int]] = [[] for _ in range(steps)]
    for node, prompts in enumerate(layout.tree.prompt_slots):
        for j, copies in enumerate(prompts):
            slots[j].append(copies[0] + prefix)
            sources[j].append(node + prefix)
    as_tensor = [torch.tensor(x, dtype=torch.long, device=device) for x in slots]
    return as_tensor, [torch.tensor(x, dtype=torch.long, device=device) for x in sources]


class TransferProposer(Proposer):
    """Placeholders attached to nodes, turned into W_j h_i at the transfer layers: by a forward hook (around), or
    inside a compiled step as its layer edits (core/model/compile_graph.py)."""

    edits_layers = True

    def __init__(self, target, guesser):
        super().__init__(target, guesser)
        self._slots: dict = {}  # (layout, prefix) -> transfer_slots

    def _transfer_slots(self, layout: TreeLayout, prefix: int, device) -> tuple[list[torch.Tensor], list]:
        """transfer_slots, kept per decode layout (prefix 0); a prefill's (prefix = its prompt) only until the next."""
        key = (id(layout), prefix)
        if key not in self._slots:
            self._slots = {k: v for k, v in self._slots.items() if k[1] == 0}
            self._slots[key] = transfer_slots(layout, self.guesser.projections.projections.depth, prefix, device)
        return self._slots[key]

    def declared_edits(self, batch_tree) -> list[tuple[int, tuple]]:
        """(width, layer edits) of the verify forward of every tree state of `batch_tree` at batch 1 (its inputs at
        rows 0..width-1): what a compiled run compiles ahead of the timed turns (core/model/compile.declare_edits)."""
        out = []
        for layout in {id(x): x for x in batch_tree.layouts.values()}.values():
            width = layout.visible.shape[0]
            edits = self.around([(layout, 0, torch.arange(width, device=self.target.device))]).layer_edits()
            if edits:
                out.append((width, edits))
        return out

    def around(self, parts):
        """Every segment's pseudo positions: each segment's transfer slots and sources [P_j] mapped through where
        its inputs lie in the forward (places [w]) and joined per transfer step."""
        proj = self.guesser.projections.projections
        slots: list[list[torch.Tensor]] = [[] for _ in range(proj.depth)]
        sources: list[list[torch.Tensor]] = [[] for _ in range(proj.depth)]
        for layout, prefix, places in parts:
            own_slots, own_sources = self._transfer_slots(layout, prefix, places.device)
            for j in range(proj.depth):
                slots[j].append(places[own_slots[j]])
                sources[j].append(places[own_sources[j]])
        empty = torch.zeros(0, dtype=torch.long)
        return transferred(self.target.model, proj.transfers([torch.cat(x) if x else empty for x in slots],
                                                        [torch.cat(x) if x else empty for x in sources]))


class TransferProjections(Guesser):
    """The transfer projections W_j at their layers; the nodes' pseudo positions are placeholder rows."""

    family, artifact = "hidden-transfer", "transfer projections"
    node_inputs = "pseudo positions"
    proposer_type = TransferProposer

    @classmethod
    def scorer(cls, target, artifact, initial=False):
        art = tp.resolve(artifact, target)
        proj = art.projections
        return GuessScorer(lambda ids, start: transfer_ranks(target, proj, ids, start), proj.depth, art.source,
                           {"transfer_layers": proj.layers})

    def load(self, artifact):
        self.projections = tp.resolve(artifact, self.target)
        proj = self.projections.projections
        if proj.masked:
            raise SpecbenchError(f"{self.projections.source}: these projections were trained with --masked (the "
                                 "paper's Masked ablation, pseudo positions blind to each other), for accuracy "
                                 "comparisons only; decoding needs projections trained without --masked")
        hidden = self.target.model.config.hidden_size
        # placeholders [S, H]
        self.table = torch.zeros(proj.depth, hidden, dtype=self.target.dtype, device=self.target.device)
        self.rows, self.source = proj.depth, self.projections.source
        self.description = f"transfer layers {proj.layers} ({self.projections.source})"


@register
class HiddenTransfer(TreeMethod):
    name = "hidden-transfer"
    summary = "hidden transfer: pseudo hidden states of future tokens made at middle layers guess a tree"
    guesser_type = TransferProjections
