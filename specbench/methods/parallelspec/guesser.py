"""`parallelspec` (Xiao et al. 2024, "ParallelSpec"): eagle's feature drafter with k trained [MASK] inputs drafts
k + 1 distributions in one forward; their top candidates form the tree (Appendix A.3), so a tree deeper than k + 1
is refused. The feature drafter, its artefact, training and batched drafting are eagle's (methods/eagle/); this
family adds how its drafter drafts.
"""

from __future__ import annotations

from ...errors import SpecbenchError
from ..base import register
from ..eagle.drafting import draft_trees_parallel
from ..eagle.guesser import Eagle, FeatureDrafts
from ..tree.method import TreeMethod


class ParallelDrafts(FeatureDrafts):
    """ParallelSpec's drafter: k [MASK] inputs, k + 1 depths drafted in one forward; no `--gamma`."""

    family, artifact = "parallelspec", "parallelspec drafter"

    def depths(self) -> int:
        return self.scored_depths(self.art.drafter)

    def dynamic_depth(self, tf) -> int:
        return self.depths()  # one forward drafts every depth: depth costs nothing more

    @classmethod
    def scored_depths(cls, drafter) -> int:
        return drafter.mask_tokens + 1

    def check_tree(self, tf, source, rows: int) -> None:
        super().check_tree(tf, source, rows)
        if tf.tree(0).depth > rows:
            raise SpecbenchError(f"tree ({source}) is {tf.tree(0).depth} deep but the drafter "
                                 f"({self.art.source}) drafts {rows} tokens per forward ({rows - 1} mask tokens); "
                                 f"use a tree at most {rows} deep (`specbench build-tree --method parallelspec`)")

    def _draft(self, batch, samples, states, sampling):
        dynamic = self.method.plan.dynamic
        return draft_trees_parallel(batch, self.art.drafter, samples, states, self.method.layouts[0].tree, sampling,
                                    dynamic and dynamic[0])

    def draft_static(self, batch, samples, states, tree, sampling):
        """Every sample's drafting of one static tree (what the pricing times)."""
        return draft_trees_parallel(batch, self.art.drafter, samples, states, tree, sampling)
    per_depth = False  # one drafter forward a step


@register
class ParallelSpec(TreeMethod):
    name = "parallelspec"
    summary = "ParallelSpec: the feature drafter with k [MASK] inputs drafts k + 1 tokens in one forward, tree-verified"
    unset_text = Eagle.unset_text  # (no --gamma here; kept as the registry showed it)
    guesser_type = ParallelDrafts
