"""`medusa` and `medusa-typical`: Medusa-1 heads on the target's last hidden state (Cai et al. 2024, §2.1), on the
tree step (methods/tree/method.py).

Each step is one target forward over the root (the last accepted token) and a static sparse tree of candidates:
a node at depth d takes a top-k guess of head d, read from the hidden state of the node accepted last step. The
heads cost no input width (unlike PPD's prompt tokens), so the tree has one state. After verification (exact match
at T = 0, lossless multi-candidate speculative sampling at T > 0; Medusa's typical acceptance for `medusa-typical`,
lossy) the heads run on the accepted node's hidden state (K rows) and give the next step's candidates.
Trees: `build-tree --method medusa` chooses the size from the per-rank accuracies (`estimate --method medusa`) and
the latency profile; `--tree size=N` takes the N most probable candidate paths (Medusa's own recipe).
"""

from __future__ import annotations

import torch

from . import artifact as mh
from ...core.machine.timing import median_call_ms
from ...core.model.compile import state_of
from ...core.model.compile_call import call_of
from ...core.tree import Tree
from .scoring import medusa_ranks
from ..base import register
from ..tree.method import TreeMethod
from ..tree.guesser import Guesser
from ..tree.pricing import GuessScorer
from ..tree.layout import TreeLayout
from ..tree.proposer import Proposer
from ..tree.shapes import CandidateShapes


class HeadShapes(CandidateShapes):
    """Medusa's one-state candidate tree, at most one depth per head; its state is always the K heads' rows."""

    def max_depth(self):
        rows = self.guesser.rows
        return rows, f"the artefact ({self.guesser.source}) has {rows} heads"

    def layouts(self, tree_file, device) -> dict:
        k, table = self.guesser.rows, self.guesser.table
        # the step's guesses always come from K heads, so the state (guess rows) is always K
        return {k: TreeLayout(tree_file.tree(0), table, device), 0: TreeLayout(Tree(()), table, device)}


def heads_logits(heads: mh.MedusaHeads, lm_head: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
    """The heads' logits [K, V] (float) on one row's hidden state h [1, H]: their residual blocks, then the LM head
    (or their own projections). Under --compile this is one static-shape graph (core/model/compile_call.py)."""
    return heads.logits(lm_head, h)[:, 0]


class HeadProposer(Proposer):
    """The next guesses are the heads' logits on the accepted node's last hidden state."""

    advance_drafts = True  # the next guesses are the heads' forward (and the LM head on them): timed as drafting

    def compiled_calls(self) -> dict:
        return {"heads": (self.guesser.heads.heads, heads_logits)}

    def next_guesses(self, h: torch.Tensor, layout: TreeLayout, node: int,
                     all_logits: torch.Tensor | None = None) -> torch.Tensor:
        """The heads' logits [K, V] on `node`'s last hidden state (the next step's guesses by distance): compiled
        (one graph, the LM head through the compiled target's linear kernel) while the target runs compiled."""
        heads, row = self.guesser.heads.heads, h[node:node + 1]  # [1, H]
        call, state = call_of(heads), state_of(self.target.model)
        if call is not None and state is not None:  # (the eager reference of a compiled run takes the state off)
            return call(state.graph.get_output_embeddings(), row)
        return heads_logits(heads, self.target.model.get_output_embeddings(), row)

    def time_drafting(self, tree, acceptance) -> float:
        """The step's drafting as it runs it: the heads and their logits on the accepted node's state [1, H]
        (advance), then the top-k per depth and the candidates' gather (propose)."""
        weight = self.guesser.heads.heads.weight
        h = torch.randn(1, weight.shape[-1], device=weight.device, dtype=self.target.dtype)  # [1, H]
        return median_call_ms(lambda: self.candidates(self.next_guesses(h, None, 0), tree, 0), h.device, 20)


class MedusaHeads(Guesser):
    """K Medusa heads: head d guesses the token d + 1 ahead of the node they read."""

    family, artifact = "medusa", "medusa heads"
    shapes_type, proposer_type = HeadShapes, HeadProposer

    @classmethod
    def scorer(cls, target, artifact, initial=False):
        art = mh.resolve(artifact, target)  # also early-exit heads: --artifact artifacts/<model>/early-exit-l<l>
        heads = art.heads
        # the heads' own time per step: build-tree adds it to the target's step latency
        ms = mh.heads_ms(heads, target.model.get_output_embeddings(), target.dtype)
        return GuessScorer(lambda ids, start: medusa_ranks(target, heads, ids, start), heads.heads, art.source,
                           {"heads": heads.heads, "layer": heads.layer, "draft_forward_ms": ms,
                            "draft_forward_rows": 1})

    def load(self, artifact):
        self.heads = mh.resolve(artifact, self.target)
        self.rows, self.source = self.heads.heads.heads, self.heads.source
        self.description = f"{self.rows} Medusa heads {self.heads.source}"


@register
class Medusa(TreeMethod):
    name = "medusa"
    summary = "Medusa-1 heads on the last hidden state guess a static sparse tree, tree-verified"
    guesser_type = MedusaHeads


@register
class MedusaTypical(TreeMethod):
    name = "medusa-typical"
    lossless = False
    typical = True
    summary = "medusa with typical acceptance at T > 0 (Medusa's rule, posterior threshold 0.09, alpha 0.3; lossy)"
    guesser_type = MedusaHeads
