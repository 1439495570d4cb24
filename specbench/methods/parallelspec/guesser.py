"""`parallelspec` (Xiao et al. 2024, "ParallelSpec"): eagle's feature drafter with k trained [MASK] inputs drafts k + 1
distributions in one forward; their top candidates form the tree (Appendix A.3), so a tree deeper than k + 1
is refused. The feature drafter, its artefact, training and drafting path are eagle's (methods/eagle/); this
family adds how deep its drafter drafts and its proposer (eagle/proposer.ParallelProposer).
"""

from __future__ import annotations

from ..base import register
from ..eagle.guesser import Eagle, FeatureDrafts, FeatureShapes
from ..eagle.proposer import ParallelProposer
from ..tree.method import TreeMethod


class ParallelShapes(FeatureShapes):
    """No deeper than the k + 1 depths one forward drafts; --tree dynamic as deep (depth costs nothing more)."""

    def max_depth(self):
        rows = self.guesser.rows
        return rows, (f"the drafter ({self.guesser.source}) drafts {rows} tokens per forward "
                      f"({rows - 1} mask tokens)")

    def dynamic_depth(self, tf) -> int:
        return self.guesser.rows


class ParallelDrafts(FeatureDrafts):
    """ParallelSpec's drafter: k [MASK] inputs, k + 1 depths drafted in one forward; no `--gamma`."""

    family, artifact = "parallelspec", "parallelspec drafter"
    shapes_type, proposer_type = ParallelShapes, ParallelProposer

    @classmethod
    def scored_depths(cls, drafter) -> int:
        return drafter.mask_tokens + 1


@register
class ParallelSpec(TreeMethod):
    name = "parallelspec"
    summary = "ParallelSpec: the feature drafter with k [MASK] inputs drafts k + 1 tokens in one forward, tree-verified"
    unset_text = Eagle.unset_text  # (no --gamma here; kept as the registry showed it)
    guesser_type = ParallelDrafts
