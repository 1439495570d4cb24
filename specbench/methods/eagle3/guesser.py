"""`eagle3` (Li et al. 2025, "EAGLE-3"): EAGLE's tree drafting (methods/eagle/: the drafter's cache and pending
pairs, EAGLE-2's dynamic tree, the drafter's batch engine at B > 1, verification with the draft q) with the EAGLE-3
drafter (drafter.py), whose first inputs are the target's fused low, middle and high-layer states instead of its
last hidden state. The step's target forward records those states (layers.FeatureTap, entered as the guesser's
`around` hook) and each sample commits its own rows after verification. The drafter's deeper inputs are its own
outputs o, as in its training-time test.

Verification: exact match at T = 0, multi-candidate speculative sampling with the draft q at T > 0 (eagle's):
lossless. Trees: `estimate --method eagle3` measures its per-depth accuracy, `build-tree --method eagle3` its
hardware-aware static tree; `--tree dynamic` drafts EAGLE-2's tree each step. Under --compile the target's
forward runs compiled, the three layers' inputs read inside its graph as layer taps (core/batch/static.layer_taps);
its prefill runs eagerly under the hooks, as every prefill does.
"""

from __future__ import annotations

import torch

from . import artifact as e3
from ...core.batch.forward import target_logits
from ...core.machine.timing import median_call_ms
from ...core.batch.cache import crop_to, new_cache
from ...core.verify import next_token
from ..base import register
from ..eagle.drafting import FeatureState
from ..eagle.guesser import EAGLE_DEPTH, FeatureShapes
from ..eagle.proposer import EagleProposer
from ..options import ARTIFACT, TREE
from ..sd.drafting import GAMMA
from ..tree.guesser import Guesser
from ..tree.method import TreeMethod
from ..tree.pricing import GuessScorer
from .layers import FeatureTap
from .scoring import drafter_ranks


class Eagle3Proposer(EagleProposer):
    """EAGLE's drafting (one drafter forward per depth, EAGLE-2's dynamic tree, the drafter's engine at every batch
    size) whose verified pairs carry the target's fused states, recorded around the target's forward."""

    taps_layers = True  # `around` reads the target's layer inputs: compiled as layer taps (run/compiled.enable_run)

    def __init__(self, target, guesser):
        super().__init__(target, guesser)
        self.tap = FeatureTap(target.model)

    def layers_read(self) -> tuple[int, int, int]:
        """The target layers whose inputs a compiled target step returns beside its final states."""
        return self.tap.layers_read()

    def propose(self, samples, states, batch_tree, sampling):
        self.tap.clear()  # rows of a forward nobody took (never expected) do not outlive the step
        return super().propose(samples, states, batch_tree, sampling)

    def around(self, parts):
        return self.tap.around(parts)

    def joined(self, sample, h, keep, sampling, batch_tree):
        """h [T, H] -> (first token, the pending pairs (g_i, x_{i+1}) with the target's fused states g [T, 3H])."""
        g = self.tap.take(h)
        root = next_token(target_logits(self.target.model, h[-1]), sampling, sample.generator)
        state = FeatureState()
        state.commit(g, torch.tensor(sample.history[1:] + [root], device=h.device))
        return root, state

    def advance(self, state, h, layout, path, emitted, all_logits):
        """The accepted path's fused states, each with the token after it."""
        state.commit(self.tap.take(h)[path], torch.tensor(emitted, device=h.device))
        return state


class Eagle3Drafts(Guesser):
    """The EAGLE-3 drafter (artifact.py): a specbench artefact or a released EAGLE-3 folder."""

    family, artifact = "eagle3", "eagle3 drafter"
    shapes_type = FeatureShapes
    proposer_type = Eagle3Proposer

    def load(self, artifact):
        self.art = e3.resolve(artifact, self.target)
        self.rows, self.source = EAGLE_DEPTH, self.art.source
        self.description = f"EAGLE-3 drafter {self.art.source} ({self.art.drafter.parameter_count():,} parameters)"

    @classmethod
    def scorer(cls, target, artifact, initial=False):
        art = e3.resolve(artifact, target)
        drafter = art.drafter
        ms = forward_ms(drafter, 1)  # build-tree adds it per drafter forward to the target's step latency
        return GuessScorer(lambda ids, start: drafter_ranks(target, drafter, ids, start, EAGLE_DEPTH), EAGLE_DEPTH,
                           art.source, {"mask_tokens": 0, "draft_forward_ms": ms, "draft_forward_rows": 1})

    def chosen(self, tree_source):
        return {"tree": tree_source, "drafter": self.art.source}


@torch.inference_mode()
def forward_ms(drafter, rows: int, context: int = 256, repeats: int = 20) -> float:
    """Median milliseconds of one drafting forward: `rows` inputs on a cache of `context` positions, then the head on
    every row (build-tree adds this per drafter forward to the target's step latency)."""
    weight = drafter.norm.weight
    hidden = weight.shape[0]
    cache = new_cache(drafter)
    x = torch.randn(1, context, 2 * hidden, device=weight.device, dtype=weight.dtype)
    drafter.run(x, torch.arange(context, device=weight.device)[None], cache)
    new = torch.randn(1, rows, 2 * hidden, device=weight.device, dtype=weight.dtype)
    pos = torch.arange(context, context + rows, device=weight.device)[None]
    return median_call_ms(lambda: drafter.logits(drafter.run(new, pos, cache)), weight.device, repeats,
                          reset=lambda: crop_to(cache, context))


@register
class Eagle3(TreeMethod):
    name = "eagle3"
    summary = ("EAGLE-3 drafter (one layer on the target's fused low, middle and high states, trained by "
               "training-time test) drafts a tree, tree-verified")
    option_specs = (TREE, ARTIFACT, GAMMA)
    unset_text = {"gamma": "(none: draft a tree)"}
    guesser_type = Eagle3Drafts
