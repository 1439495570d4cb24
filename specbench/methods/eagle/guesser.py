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
"""

from __future__ import annotations

import torch

from . import artifact as fd
from ...core.batch.forward import target_logits
from ...core.batch.ragged import Segment
from ...core.tree import Tree
from ...core.verify import Sampling, next_token, tree_greedy_accept, tree_sampled_accept
from ...errors import SpecbenchError
from .scoring import drafter_ranks
from ...planning.treesearch import f_value
from ..sd.drafting import GAMMA
from ..base import register
from ..options import ARTIFACT, TREE
from ..tree.method import TreeMethod
from ..batch_loop import engine
from .dynamic_tree import DEFAULT_TOP_K, draft_dynamic
from .drafting import Drafted, FeatureState, draft_trees_eagle, step_drafting_ms
from ..tree.guesser import Guesser
from ..tree.pricing import GuessScorer
from ..tree.layout import TreeLayout
from ..tree.plan import candidate_tree

EAGLE_DEPTH = 6  # depths `estimate --method eagle` measures (rows of its acceptance file; deepest tree searched)


class FeatureDrafts(Guesser):
    """What eagle and parallelspec share: a feature drafter (artifact.py) on the target's last hidden states, a
    one-state candidate tree, verification with the draft q, and the drafter's cache per sample, a slot of one
    drafter engine at every batch size (drafting.py). A family supplies how deep its drafter drafts (depths,
    scored_depths, dynamic_depth) and how it drafts every sample's tree (_draft; draft_static: a static tree's)."""

    drafter_model = True

    def load(self):
        self.art = fd.resolve(self.method.options.artifact, self.target, self.method.family)
        self.art.drafter.to(self.target.output_device)  # it reads the final states
        what = f"{self.method.family} drafter {self.art.source} ({self.art.drafter.parameter_count():,} parameters)"
        return self.depths(), 1, None, what

    def depths(self) -> int:
        """Depths the drafter drafts (rows of the method's acceptance file)."""
        raise NotImplementedError

    def dynamic_depth(self, tf) -> int:
        """--tree dynamic's depth for a static tree `tf` of the same size."""
        raise NotImplementedError

    @classmethod
    def scored_depths(cls, drafter) -> int:
        """Rows of the acceptance file: ranks at each depth along the true path (eagle), per drafted position
        (parallelspec)."""
        raise NotImplementedError

    def time_drafting(self, tree=None) -> float:
        """One step's drafting of `tree` as the batch-1 step runs it (drafting.step_drafting_ms: the pending pairs
        of about tau accepted tokens, the tree's widths, top-k and host copies), per drafter forward of the cost
        law (eagle: divided by the tree's depth; parallelspec drafts once a step)."""
        tree = tree if tree is not None else self.priced_tree()
        pending = max(1, round(1 + f_value(list(tree.paths), self.method.acceptance)))  # tau: the path's pairs
        ms = step_drafting_ms(self.art.drafter, lambda batch, samples, states: self.draft_static(
            batch, samples, states, tree, Sampling()), pending)
        return ms / max(tree.depth, 1) if self.per_depth else ms

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

    def searched_tree(self, acc, rows, size, model_name, source):
        return candidate_tree(acc, rows, size, model_name, source, self.method.family)

    def dynamic_shape(self, tree_file):
        """--tree dynamic[=M]: M candidates per step (the size of the static tree the plan resolved: `--tree auto`'s,
        this hardware's choice from its latency profile, or size=M), dynamic_depth deep, the k <= 8 best nodes
        expanded per depth."""
        m = tree_file.size
        return m, min(self.dynamic_depth(tree_file), m), min(DEFAULT_TOP_K, m)

    def check_tree(self, tf, source, rows: int) -> None:
        method = self.method
        if tf.prompt_tokens or set(tf.states) != {0}:
            raise SpecbenchError(f"tree ({source}) is a {tf.method} tree with prompt tokens; "
                                 f"{method.name} needs a one-state tree without them "
                                 f"(`specbench build-tree --method {method.name}`)")

    def layouts(self, tree_file, table, ept, device) -> dict:
        return {0: TreeLayout(tree_file.tree(0), None, device), -1: TreeLayout(Tree(()), None, device)}

    def layout_for(self, state) -> TreeLayout:
        return self.method.layouts[0]  # one static tree

    def chosen(self) -> dict:
        return {"tree": self.method.tree_source, "drafter": self.art.source}

    def drafted_layout(self, state, layout):
        return layout if self.method.plan.dynamic is None else state.drafted

    def accept(self, tokens, parents, logits, q, sampling, generator):
        """Exact match at T = 0, Algorithm 1 with the draft q at T > 0."""
        if sampling.greedy:
            return tree_greedy_accept(tokens, parents, logits)
        return tree_sampled_accept(tokens, parents, logits, q, sampling, generator)

    def advance(self, state, h, layout, path, emitted, all_logits):
        """The drafter gets its true features next step: the accepted path's, each with the token after it."""
        state.commit(h[path], torch.tensor(emitted, device=h.device))
        return state

    # the step: every sample's drafter cache is a slot of one drafter engine in the target's mode, at every batch
    # size (drafting.py; batch 1: the single-sequence engine); a sample's state is its FeatureState

    def start_batch(self, mode, slots):
        self._batch = engine(self.art.drafter, mode, slots, self.target.output_device)

    def leave(self, sample):
        if sample.slot in self._batch.rows:
            self._batch.release(sample.slot)

    def join(self, sample):
        """The prompt [T], causal: the target's features of every position (the drafter's first pairs)."""
        return Segment(sample.slot, sample.history), self.method.layouts[-1], len(sample.history) - 1

    def joined(self, sample, h, keep, sampling):
        """h [T, H] -> (first token, the pending pairs (f_i, x_{i+1}), the last pairing with the first token)."""
        root = next_token(target_logits(self.target.model, h[-1]), sampling, sample.generator)
        state = FeatureState()
        state.commit(h, torch.tensor(sample.history[1:] + [root], device=h.device))
        return root, state

    def draft_batch(self, samples, sampling):
        states = [s.scratch["guesses"] for s in samples]
        return [(d.tokens, d.q, d.forwards) for d in self._draft(self._batch, samples, states, sampling)]


class EagleDrafts(FeatureDrafts):
    """EAGLE's drafter: one forward per tree depth on its own predicted features; `--gamma` drafts a chain."""

    family, artifact = "eagle", "eagle drafter"

    def depths(self) -> int:
        return EAGLE_DEPTH

    def dynamic_depth(self, tf) -> int:
        """--tree dynamic's depth: every depth costs eagle a drafter forward, so no deeper than the static tree of
        the same size, whose depths build-tree priced with this hardware's L(n) and the drafter's measured cost
        (EAGLE-2's fixed 6, chosen for GPUs where a drafter forward is nearly free, lost to the static tree on a
        2-core CPU: RESULTS-cpu.md); EAGLE_DEPTH at most."""
        return max(1, min(self.depths(), tf.tree(0).depth))

    @classmethod
    def scored_depths(cls, drafter) -> int:
        return EAGLE_DEPTH

    def _draft(self, batch, samples, states, sampling):
        """The drafter proposes every sample's tree. With --tree dynamic it first drafts each sample's tree
        (dynamic_tree.py), greedily; at T > 0 that shape's tokens are then sampled as a static tree's are, so the
        shape never depends on the samples (lossless)."""
        if self.method.plan.dynamic is None:
            return self.draft_static(batch, samples, states, self.method.layouts[0].tree, sampling)
        m, depth, top_k = self.method.plan.dynamic
        shapes = draft_dynamic(batch, self.art.drafter, samples, states, m, depth, top_k)
        for state, shape in zip(states, shapes):
            state.drafted = TreeLayout(shape.tree, None, shape.tokens.device)
        if sampling.greedy:
            return [Drafted(shape.tokens, None, shape.forwards) for shape in shapes]
        drafted = draft_trees_eagle(batch, self.art.drafter, samples, states, [x.tree for x in shapes], sampling)
        return [Drafted(d.tokens, d.q, shape.forwards + d.forwards) for d, shape in zip(drafted, shapes)]

    def draft_static(self, batch, samples, states, tree, sampling):
        """Every sample's drafting of one static tree (what the pricing times)."""
        return draft_trees_eagle(batch, self.art.drafter, samples, states, [tree] * len(samples), sampling)
    per_depth = True  # one drafter forward per inner depth (its family's cost law)


@register
class Eagle(TreeMethod):
    name = "eagle"
    summary = "EAGLE-style feature drafter (one layer on the target's hidden states) drafts a tree, tree-verified"
    option_specs = (TREE, ARTIFACT, GAMMA)
    unset_text = {"gamma": "(none: draft a tree)"}
    guesser_type = EagleDrafts
