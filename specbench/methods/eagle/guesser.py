"""`eagle` and the feature drafter it shares with `parallelspec` (methods/parallelspec/): a feature drafter
(methods/eagle/artifact.py) reads the target's own last hidden states and drafts a tree that the target verifies
in one forward (the tree step, methods/tree/method.py).

`eagle` (Li et al. 2024, "EAGLE"): the drafter runs autoregressively on its own predicted features, one forward
per tree depth; `--gamma g` drafts a chain of g tokens instead of a tree. `parallelspec` (Xiao et al. 2024,
"ParallelSpec"): the drafter with k trained [MASK] inputs drafts k + 1 distributions in one forward; their top
candidates form the tree (Appendix A.3), so a tree deeper than k + 1 is refused (drafting.py drafts).
Verification: exact match at T = 0; at T > 0 candidates are sampled from the draft distribution q and accepted by
multi-candidate speculative sampling with q (ParallelSpec Algorithm 1, verify.tree_sampled_accept): lossless.
Trees: `estimate --method eagle|parallelspec` measures per-depth accuracy, `build-tree --method ...` chooses the
static tree (one state) and its size from the latency profile plus the drafter's own cost per step.
Counters: `drafted` is the tree depth per step (as for ppd), `draft_forwards` and `draft_s` the drafter's work.
Roles: the artefact (FeatureDrafts, here), its trees (FeatureShapes, here), the decode-time proposer (proposer.py:
FeatureProposer, drafting through the drafter's engine at every batch size, drafting.py).
"""

from __future__ import annotations

from . import artifact as fd
from ...core.tree import Tree
from .scoring import drafter_ranks
from ..sd.drafting import GAMMA
from ..base import register
from ..options import ARTIFACT, TREE
from ..tree.method import TreeMethod
from .dynamic_tree import DEFAULT_TOP_K
from .proposer import EagleProposer
from ..tree.guesser import Guesser
from ..tree.pricing import GuessScorer
from ..tree.layout import TreeLayout
from ..tree.shapes import CandidateShapes

EAGLE_DEPTH = 6  # depths `estimate --method eagle` measures (rows of its acceptance file; deepest tree searched)


class FeatureShapes(CandidateShapes):
    """A feature drafter's trees: one state, the prefill's layout a plain causal prompt (-1), and --tree dynamic."""

    def dynamic_depth(self, tf) -> int:
        """--tree dynamic's depth for a static tree `tf` of the same size: every depth costs eagle a drafter
        forward, so no deeper than the static tree of the same size, whose depths build-tree priced with this
        hardware's L(n) and the drafter's measured cost (EAGLE-2's fixed 6, chosen for GPUs where a drafter forward
        is nearly free, lost to the static tree on a 2-core CPU: RESULTS-cpu.md); the drafter's rows at most."""
        return max(1, min(self.guesser.rows, tf.tree(0).depth))

    def dynamic_shape(self, tree_file):
        """--tree dynamic[=M]: M candidates per step (the size of the static tree batch_trees resolved: `--tree auto`'s,
        this hardware's choice from its latency profile, or size=M), dynamic_depth deep, the k <= 8 best nodes
        expanded per depth."""
        m = tree_file.size
        return m, min(self.dynamic_depth(tree_file), m), min(DEFAULT_TOP_K, m)

    def layouts(self, tree_file, device) -> dict:
        return {0: TreeLayout(tree_file.tree(0), None, device), -1: TreeLayout(Tree(()), None, device)}


class FeatureDrafts(Guesser):
    """What eagle and parallelspec share: a feature drafter (artifact.py) on the target's last hidden states. A
    family supplies how deep its drafter drafts (scored_depths: rows of its acceptance file)."""

    shapes_type = FeatureShapes

    def load(self, artifact):
        self.art = fd.resolve(artifact, self.target, self.family)
        self.art.drafter.to(self.target.output_device)  # it reads the final states
        self.rows, self.source = self.scored_depths(self.art.drafter), self.art.source
        self.description = (f"{self.family} drafter {self.art.source} "
                            f"({self.art.drafter.parameter_count():,} parameters)")

    @classmethod
    def scored_depths(cls, drafter) -> int:
        """Rows of the acceptance file: ranks at each depth along the true path (eagle), per drafted position
        (parallelspec)."""
        raise NotImplementedError

    @classmethod
    def scorer(cls, target, artifact, initial=False):
        art = fd.resolve(artifact, target, cls.family)
        drafter = art.drafter.to(target.device)
        depths = cls.scored_depths(drafter)
        # the drafter's own forward time: build-tree adds it per drafter forward to the target's step latency
        ms = fd.forward_ms(drafter, 1 + drafter.mask_tokens)
        return GuessScorer(lambda ids, start: drafter_ranks(target, drafter, ids, start, depths), depths, art.source,
                           {"mask_tokens": drafter.mask_tokens, "draft_forward_ms": ms,
                            "draft_forward_rows": 1 + drafter.mask_tokens})

    def chosen(self, tree_source):
        return {"tree": tree_source, "drafter": self.art.source}


class EagleDrafts(FeatureDrafts):
    """EAGLE's drafter: one forward per tree depth on its own predicted features; `--gamma` drafts a chain."""

    family, artifact = "eagle", "eagle drafter"
    proposer_type = EagleProposer

    @classmethod
    def scored_depths(cls, drafter) -> int:
        return EAGLE_DEPTH


@register
class Eagle(TreeMethod):
    name = "eagle"
    summary = "EAGLE-style feature drafter (one layer on the target's hidden states) drafts a tree, tree-verified"
    option_specs = (TREE, ARTIFACT, GAMMA)
    unset_text = {"gamma": "(none: draft a tree)"}
    guesser_type = EagleDrafts
