"""`medusa` and `medusa-typical`: Medusa-1 heads on the target's last hidden state (Cai et al. 2024, §2.1), verified
with the tree engine of `ppd` (methods/ppd.py).

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

from ..core.tree import Tree, TreeFile
from ..artifacts import medusa_heads as mh
from ..errors import SpecbenchError
from ..planning.treesearch import static_candidates
from .base import register
from .ppd import ParallelPromptDecoding, TreeLayout


def candidate_tree(acc, heads: int, size: int, model: str = "", source: str = "", method: str = "medusa") -> TreeFile:
    """The static tree of the `size` most probable candidate paths (depth <= heads): one state, no prompt tokens
    (Medusa's, and every other method whose candidates at a depth do not depend on a prompt-token state)."""
    if size < 1:
        raise SpecbenchError(f"tree size {size} is too small: a {method} tree needs at least 1 candidate")
    tree = static_candidates(acc[:heads], size)
    return TreeFile({0: [(p, 0) for p in tree.paths]}, 0, model=model, method=method,
                    built_by=f"the {size} most probable candidate paths over {source or 'per-rank probabilities'}",
                    predicted_tau=tree.tau)


@register
class Medusa(ParallelPromptDecoding):
    name = "medusa"
    family = "medusa"
    one_state = True
    trainer = "medusa"
    needs = ("target", "medusa heads")
    summary = "Medusa-1 heads on the last hidden state guess a static sparse tree, tree-verified"

    def _load_guesser(self):
        self.heads = mh.resolve(self.options.artifact, self.target)
        k = self.heads.heads.heads
        return k, 1, None, f"{k} Medusa heads {self.heads.source}"

    def _searched_tree(self, acc, rows, size, model_name, source):
        return candidate_tree(acc, rows, size, model_name, source, self.family)

    def _check_tree(self, rows: int) -> None:
        tf = self.tree_file
        if tf.prompt_tokens or set(tf.states) != {0}:
            raise SpecbenchError(f"tree ({self.tree_source}) is a {tf.method} tree with prompt tokens; medusa needs "
                                 "a one-state tree without them (`specbench build-tree --method medusa`)")
        if tf.tree(0).depth > rows:
            raise SpecbenchError(f"tree ({self.tree_source}) is {tf.tree(0).depth} deep but the artefact "
                                 f"({self.heads.source}) has {rows} heads; use a tree at most {rows} deep")

    def _make_layouts(self, table, ept, device) -> dict:
        k = self.heads.heads.heads
        # the step's guesses always come from K heads, so the state (guess rows) is always K
        return {k: TreeLayout(self.tree_file.tree(0), table, device), 0: TreeLayout(Tree(()), table, device)}

    def _prompt_logits(self, h: torch.Tensor, layout: TreeLayout, node: int,
                       all_logits: torch.Tensor | None = None) -> torch.Tensor:
        """The heads' logits [K, V] on `node`'s last hidden state (the next step's guesses by distance)."""
        lm_head = self.target.model.get_output_embeddings()
        return self.heads.heads.logits(lm_head, h[node:node + 1])[:, 0]


@register
class MedusaTypical(Medusa):
    name = "medusa-typical"
    lossless = False
    typical = True
    summary = "medusa with typical acceptance at T > 0 (Medusa's rule, posterior threshold 0.09, alpha 0.3; lossy)"
