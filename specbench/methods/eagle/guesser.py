"""`eagle` and `parallelspec`: a feature drafter (methods/eagle/artifact.py) reads the target's own last hidden
states and drafts a tree that the target verifies in one forward (the tree engine, engine.py).

`eagle` (Li et al. 2024, "EAGLE"): the drafter runs autoregressively on its own predicted features, one forward
per tree depth; `--gamma g` drafts a chain of g tokens instead of a tree. `parallelspec` (Xiao et al. 2024,
"ParallelSpec"): the drafter with k trained [MASK] inputs drafts k + 1 distributions in one forward; their top
candidates form the tree (Appendix A.3), so a tree deeper than k + 1 is refused (feature_drafting.py drafts).
Verification: exact match at T = 0; at T > 0 candidates are sampled from the draft distribution q and accepted by
multi-candidate speculative sampling with q (ParallelSpec Algorithm 1, verify.tree_sampled_accept): lossless.
Trees: `estimate --method eagle|parallelspec` measures per-depth accuracy, `build-tree --method ...` chooses the
static tree (one state) and its size from the latency profile plus the drafter's own cost per step.
Counters: `drafted` is the tree depth per step (as for ppd), `draft_forwards` and `draft_s` the drafter's work.
"""

from __future__ import annotations

import torch

from . import artifact as fd
from ..ppd import artifact as pt
from ...core.batch.forward import target_logits
from ...core.batch.ragged import Segment
from ...core.tree import Tree, attention_mask, position_ids
from ...core.verify import next_token, tree_greedy_accept, tree_sampled_accept
from ...errors import SpecbenchError
from ...planning.head_accuracy import drafter_ranks
from ..sd.drafting import GAMMA
from ..base import register
from ..options import ARTIFACT, TREE
from ..tree.engine import TreeMethod
from ..batch_loop import engine
from .dynamic_tree import DEFAULT_TOP_K, draft_dynamic
from .batch import draft_trees_eagle, draft_trees_parallel
from .drafting import DrafterState, PendingPairs, draft_tree_eagle, draft_tree_parallel
from ..tree.guesser import Guesser, GuessScorer
from ..tree.layout import TreeLayout
from ..tree.resolution import candidate_tree, chain, resolve

EAGLE_DEPTH = 6  # depths `estimate --method eagle` measures (rows of its acceptance file; deepest tree searched)


class EagleDrafts(Guesser):
    """EAGLE's drafter: one forward per tree depth on its own predicted features; `--gamma` drafts a chain."""

    family, artifact, one_state = "eagle", "eagle drafter", True
    drafter_model = True
    dynamic: tuple[int, int, int] | None = None  # --tree dynamic: (candidates m, depth, top-k per expansion)

    def load(self):
        self.art = fd.resolve(self.method.options.artifact, self.target, self.method.family)
        self.art.drafter.to(self.target.output_device)  # it reads the final states
        what = f"{self.method.family} drafter {self.art.source} ({self.art.drafter.parameter_count():,} parameters)"
        return self.depths(), 1, None, what

    def depths(self) -> int:
        return EAGLE_DEPTH

    def time_drafting(self) -> float:
        return fd.forward_ms(self.art.drafter, 1 + self.art.drafter.mask_tokens)  # rows as the scorer times

    def dynamic_depth(self, tf) -> int:
        """--tree dynamic's depth: every depth costs eagle a drafter forward, so no deeper than the static tree of
        the same size, whose depths build-tree priced with this hardware's L(n) and the drafter's measured cost
        (EAGLE-2's fixed 6, chosen for GPUs where a drafter forward is nearly free, lost to the static tree on a
        2-core CPU: RESULTS-cpu.md); EAGLE_DEPTH at most."""
        return max(1, min(self.depths(), tf.tree(0).depth))

    @classmethod
    def scored_depths(cls, drafter) -> int:
        """Rows of the acceptance file: ranks at each depth along the true path (eagle), per drafted position
        (parallelspec)."""
        return EAGLE_DEPTH

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

    def resolve_tree(self, build, model_name, rows=0, ept=1):
        options = self.method.options
        self.dynamic = None
        if str(options.tree).startswith("dynamic"):
            if options.gamma is not None:
                raise SpecbenchError(f"{self.method.name}: give --gamma (a chain of drafts) or --tree dynamic, not both")
            return self._dynamic_tree(options.tree, build, model_name, rows, ept)
        if options.gamma is None:
            return super().resolve_tree(build, model_name, rows, ept)
        if options.tree != TREE.default:
            raise SpecbenchError(f"{self.method.name}: give --gamma (a chain of drafts) or --tree (a draft tree), "
                                 "not both")
        return chain(options.gamma, model_name), f"a chain of {options.gamma} (--gamma)"

    def _dynamic_tree(self, spec: str, build, model_name, rows, ept):
        """--tree dynamic[=M]: M candidates per step (default: the size of the tree `--tree auto` picks, this
        hardware's choice from its latency profile), dynamic_depth deep, the k <= 8 best nodes expanded per depth.
        The static tree of that size stays the method's tree file (the prefill, predictions, check_tree)."""
        size = spec.removeprefix("dynamic").removeprefix("=")
        if spec != "dynamic" and (not spec.startswith("dynamic=") or not size.isdigit() or int(size) < 1):
            raise SpecbenchError(f"--tree {spec}: use dynamic or dynamic=M with M a positive number of candidates")
        tf, source = resolve(self.method, build, model_name, rows, ept, "auto" if spec == "dynamic" else f"size={size}")
        m = tf.size
        self.dynamic = (m, min(self.dynamic_depth(tf), m), min(DEFAULT_TOP_K, m))
        return tf, f"EAGLE-2 dynamic tree, {m} candidates per step (the size of {source})"

    def check_tree(self, rows: int) -> None:
        tf, method = self.method.tree_file, self.method
        if tf.prompt_tokens or set(tf.states) != {0}:
            raise SpecbenchError(f"tree ({method.tree_source}) is a {tf.method} tree with prompt tokens; "
                                 f"{method.name} needs a one-state tree without them "
                                 f"(`specbench build-tree --method {method.name}`)")

    def layouts(self, table, ept, device) -> dict:
        return {0: TreeLayout(self.method.tree_file.tree(0), None, device), -1: TreeLayout(Tree(()), None, device)}

    def layout_for(self, state) -> TreeLayout:
        return self.method.layouts[0]  # one static tree

    def chosen(self) -> dict:
        return {"tree": self.method.tree_source, "drafter": self.art.source}

    def prefill(self, ids, cache, sampling, generator):
        """The target's features of every prompt position [T, H] and its first token; the drafter's first pairs
        (f_i, x_{i+1})."""
        model = self.target.model
        state = DrafterState(self.art.drafter)
        prefill, prefix = self.method.layouts[-1], len(ids) - 1
        h = pt.hidden(model, pt.embed(model, ids, None), attention_mask(prefill.visible, 0, self.target.dtype, prefix),
                      position_ids(prefill.offsets, 0, prefix), cache)  # [T, H]
        root = next_token(target_logits(model, h[-1]), sampling, generator)
        state.commit(h, torch.cat([ids[1:], ids.new_tensor([root])]))  # pairs (f_i, x_{i+1})
        return root, state

    def draft(self, state: DrafterState, tree: Tree, root: int, sampling, generator):
        """The drafter proposes the tree's tokens [N], their q [N, V] at T > 0, and its forwards. With --tree dynamic
        it first drafts the tree (dynamic_tree.py), greedily; at T > 0 that shape's tokens are then sampled as a
        static tree's are, so the shape never depends on the samples (lossless)."""
        if self.dynamic is None:
            return draft_tree_eagle(state, tree, root, sampling, generator)
        m, depth, top_k = self.dynamic
        shape = draft_dynamic(state, root, m, depth, top_k)
        state.drafted = TreeLayout(shape.tree, None, shape.tokens.device)
        if sampling.greedy:
            return shape.tokens, None, shape.forwards
        tokens, q, forwards = draft_tree_eagle(state, shape.tree, root, sampling, generator)
        return tokens, q, shape.forwards + forwards

    def drafted_layout(self, state, layout):
        return layout if self.dynamic is None else state.drafted

    def accept(self, tokens, parents, logits, q, sampling, generator):
        """Exact match at T = 0, Algorithm 1 with the draft q at T > 0."""
        if sampling.greedy:
            return tree_greedy_accept(tokens, parents, logits)
        return tree_sampled_accept(tokens, parents, logits, q, sampling, generator)

    def advance(self, state, h, layout, path, emitted, all_logits):
        """The drafter gets its true features next step: the accepted path's, each with the token after it."""
        state.commit(h[path], torch.tensor(emitted, device=h.device))
        return state

    # batch > 1 (feature_batch.py): every sample's drafter cache a slot of one drafter batch engine

    def start_batch(self, mode, slots):
        self._batch = engine(self.art.drafter, mode, slots, self.target.output_device)  # where load put it

    def leave(self, sample):
        if sample.slot in self._batch.rows:
            self._batch.release(sample.slot)

    def join(self, sample):
        """The prompt [T], causal: the target's features of every position (the drafter's first pairs)."""
        return Segment(sample.slot, sample.history), self.method.layouts[-1], len(sample.history) - 1

    def joined(self, sample, h, keep, sampling):
        """h [T, H] -> (first token, the pending pairs (f_i, x_{i+1}), the last pairing with the first token)."""
        root = next_token(target_logits(self.target.model, h[-1]), sampling, sample.generator)
        state = PendingPairs()
        state.commit(h, torch.tensor(sample.history[1:] + [root], device=h.device))
        return root, state

    def draft_batch(self, samples, sampling):
        drafts, forwards = self._draft_trees(self._batch, self.art.drafter, samples, self.method.layouts[0].tree,
                                             sampling)
        return [(tokens, q, forwards) for tokens, q in drafts]

    _draft_trees = staticmethod(draft_trees_eagle)


class ParallelDrafts(EagleDrafts):
    """ParallelSpec's drafter: k [MASK] inputs, k + 1 depths drafted in one forward; no `--gamma`."""

    family, artifact = "parallelspec", "parallelspec drafter"

    def depths(self) -> int:
        return self.scored_depths(self.art.drafter)

    def dynamic_depth(self, tf) -> int:
        return self.depths()  # one forward drafts every depth: depth costs nothing more

    @classmethod
    def scored_depths(cls, drafter) -> int:
        return drafter.mask_tokens + 1

    def resolve_tree(self, build, model_name, rows=0, ept=1):
        self.dynamic = None
        if str(self.method.options.tree).startswith("dynamic"):
            return self._dynamic_tree(self.method.options.tree, build, model_name, rows, ept)
        return Guesser.resolve_tree(self, build, model_name, rows, ept)

    def check_tree(self, rows: int) -> None:
        super().check_tree(rows)
        tf = self.method.tree_file
        if tf.tree(0).depth > rows:
            raise SpecbenchError(f"tree ({self.method.tree_source}) is {tf.tree(0).depth} deep but the drafter "
                                 f"({self.art.source}) drafts {rows} tokens per forward ({rows - 1} mask tokens); "
                                 f"use a tree at most {rows} deep (`specbench build-tree --method parallelspec`)")

    def draft(self, state, tree, root, sampling, generator):
        return draft_tree_parallel(state, tree, root, sampling, generator, self.dynamic and self.dynamic[0])

    _draft_trees = staticmethod(draft_trees_parallel)


@register
class Eagle(TreeMethod):
    name = "eagle"
    summary = "EAGLE-style feature drafter (one layer on the target's hidden states) drafts a tree, tree-verified"
    option_specs = (TREE, ARTIFACT, GAMMA)
    unset_text = {"gamma": "(none: draft a tree)"}
    guesser_type = EagleDrafts


@register
class ParallelSpec(TreeMethod):
    name = "parallelspec"
    summary = "ParallelSpec: the feature drafter with k [MASK] inputs drafts k + 1 tokens in one forward, tree-verified"
    unset_text = Eagle.unset_text  # (no --gamma here; kept as the registry showed it)
    guesser_type = ParallelDrafts
