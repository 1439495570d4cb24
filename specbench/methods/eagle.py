"""`eagle` and `parallelspec`: a feature drafter (artifacts/feature_drafter.py) reads the target's own last hidden
states and drafts a tree that the target verifies in one forward (the tree engine of `ppd`/`medusa`).

`eagle` (Li et al. 2024, "EAGLE"): the drafter runs autoregressively on its own predicted features, one forward
per tree depth; `--gamma g` drafts a chain of g tokens instead of a tree. `parallelspec` (Xiao et al. 2024,
"ParallelSpec"): the drafter with k trained [MASK] inputs drafts k + 1 distributions in one forward; their top
candidates form the tree (Appendix A.3), so a tree deeper than k + 1 is refused.
Verification: exact match at T = 0; at T > 0 candidates are sampled from the draft distribution q and accepted by
multi-candidate speculative sampling with q (ParallelSpec Algorithm 1, verify.tree_sampled_accept): lossless.
Trees: `estimate --method eagle|parallelspec` measures per-depth accuracy, `build-tree --method ...` chooses the
static tree (one state) and its size from the latency profile plus the drafter's own cost per step.
Counters: `drafted` is the tree depth per step (as for ppd), `draft_forwards` and `draft_s` the drafter's work.
"""

from __future__ import annotations

import torch

from ..core.cache import cache_length, keep_positions, new_cache
from ..core.concurrency import now
from ..core.models import model_slug
from ..core.tree import Tree, TreeFile, attention_mask, locate, position_ids
from ..core.verify import next_token, tree_greedy_accept, tree_sampled_accept
from ..artifacts import feature_drafter as fd
from ..artifacts import prompt_tokens as pt
from ..errors import SpecbenchError
from ..planning.acceptance import draft_cost
from ._drafting import GAMMA
from .base import Generation, register
from .feature_drafting import DrafterState, draft_tree_eagle, draft_tree_parallel
from .medusa import Medusa
from .options import ARTIFACT, TREE
from .ppd import TreeLayout

EAGLE_DEPTH = 6  # depths `estimate --method eagle` measures (rows of its acceptance file; deepest tree searched)


def chain(gamma: int, model: str) -> TreeFile:
    """A chain of gamma candidates (rank 0 at every depth): sd's shape, verified as a one-path tree."""
    return TreeFile({0: [((0,) * d, 0) for d in range(1, gamma + 1)]}, 0, model=model, method="eagle",
                    built_by=f"--gamma {gamma}: a chain of {gamma} drafts")


@register
class Eagle(Medusa):
    name = "eagle"
    family = "eagle"
    trainer = "eagle"
    needs = ("target", "eagle drafter")
    summary = "EAGLE-style feature drafter (one layer on the target's hidden states) drafts a tree, tree-verified"
    option_specs = (TREE, ARTIFACT, GAMMA)
    unset_text = {"gamma": "(none: draft a tree)"}
    batchable = False  # the drafter's cache is per sample; batch > 1 is not built for it

    def __init__(self, target, options=None, drafter=None):
        super().__init__(target, options, drafter)
        # the drafter's cost per step for predicted speedups: the forward time `estimate` measured
        self.draft_ms = draft_cost(self.family, locate(f"acceptance/{model_slug(target.spec)}/{self.family}.yaml"))

    def _load_guesser(self):
        self.art = fd.resolve(self.options.artifact, self.target, self.family)
        self.art.drafter.to(self.target.device)
        what = f"{self.family} drafter {self.art.source} ({self.art.drafter.parameter_count():,} parameters)"
        return self._depths(), 1, None, what

    def _depths(self) -> int:
        return EAGLE_DEPTH

    def _resolve_tree(self, build, model_name):
        if self.options.gamma is None:
            return super()._resolve_tree(build, model_name)
        if self.options.tree != TREE.default:
            raise SpecbenchError(f"{self.name}: give --gamma (a chain of drafts) or --tree (a draft tree), not both")
        return chain(self.options.gamma, model_name), f"a chain of {self.options.gamma} (--gamma)"

    def _check_tree(self, rows: int) -> None:
        tf = self.tree_file
        if tf.prompt_tokens or set(tf.states) != {0}:
            raise SpecbenchError(f"tree ({self.tree_source}) is a {tf.method} tree with prompt tokens; {self.name} "
                                 f"needs a one-state tree without them (`specbench build-tree --method {self.name}`)")

    def _make_layouts(self, table, ept, device) -> dict:
        return {0: TreeLayout(self.tree_file.tree(0), None, device), -1: TreeLayout(Tree(()), None, device)}

    def chosen(self) -> dict:
        return {"tree": self.tree_source, "drafter": self.art.source}

    def _draft(self, state: DrafterState, tree: Tree, root: int, sampling, generator):
        return draft_tree_eagle(state, tree, root, sampling, generator)

    @torch.inference_mode()
    def generate(self, input_ids, max_new_tokens, sampling, generator):
        model, stop_ids = self.target.model, self.target.tokenizer.stop_ids
        head = model.get_output_embeddings()
        gen = Generation()
        cache = new_cache(model)
        state = DrafterState(self.art.drafter)
        ids = input_ids[0]  # [T]
        # 0. prefill: the target's features of every prompt position, its first token
        prefill = self.layouts[-1]
        prefix = len(ids) - 1
        h = pt.hidden(model, pt.embed(model, ids, None), attention_mask(prefill.visible, 0, self.target.dtype, prefix),
                      position_ids(prefill.offsets, 0, prefix), cache)  # [T, H]
        root = next_token(head(h[-1]).float(), sampling, generator)
        state.commit(h, torch.cat([ids[1:], ids.new_tensor([root])]))  # pairs (f_i, x_{i+1})
        done = gen.emit([root], stop_ids, max_new_tokens)
        layout = self.layouts[0]
        tree = layout.tree
        while not done:
            # 1. draft: the drafter proposes the tree's tokens (and their q at T > 0)
            d0 = now(self.target.device)
            tokens, draft_q, forwards = self._draft(state, tree, root, sampling, generator)  # [N], [N, V]
            gen.draft_s += now(self.target.device) - d0
            gen.draft_forwards += forwards
            # 2. verify: one target forward over the root and every candidate
            past = cache_length(cache)
            h = self._forward(tokens, layout, cache)  # [N, H]
            logits = head(h).float()  # [N, V]
            # 3. accept: exact match at T = 0, Algorithm 1 with the draft q at T > 0
            if sampling.greedy:
                path, root = tree_greedy_accept(tokens, layout.parents, logits)
            else:
                path, root = tree_sampled_accept(tokens, layout.parents, logits, draft_q, sampling, generator)
            accepted = tokens[path[1:]].tolist()
            gen.count_draft(tree.depth, len(accepted))
            # 4. update: the target keeps the accepted path; the drafter gets its true features next step
            keep_positions(cache, past, path)
            state.commit(h[path], torch.tensor(accepted + [root], device=h.device))
            done = gen.emit(accepted + [root], stop_ids, max_new_tokens)
        return gen


@register
class ParallelSpec(Eagle):
    name = "parallelspec"
    family = "parallelspec"
    trainer = "parallelspec"
    needs = ("target", "parallelspec drafter")
    summary = "ParallelSpec: the feature drafter with k [MASK] inputs drafts k + 1 tokens in one forward, tree-verified"
    option_specs = (TREE, ARTIFACT)

    def _depths(self) -> int:
        return self.art.drafter.mask_tokens + 1

    def _resolve_tree(self, build, model_name):
        return super(Eagle, self)._resolve_tree(build, model_name)

    def _check_tree(self, rows: int) -> None:
        super()._check_tree(rows)
        if self.tree_file.tree(0).depth > rows:
            raise SpecbenchError(f"tree ({self.tree_source}) is {self.tree_file.tree(0).depth} deep but the drafter "
                                 f"({self.art.source}) drafts {rows} tokens per forward ({rows - 1} mask tokens); "
                                 f"use a tree at most {rows} deep (`specbench build-tree --method parallelspec`)")

    def _draft(self, state, tree, root, sampling, generator):
        return draft_tree_parallel(state, tree, root, sampling, generator)
