"""`sd`: speculative decoding (Leviathan et al. 2023, Alg. 1; Chen et al. 2023): the drafter proposes gamma tokens
one forward at a time, the target scores them all in one forward, speculative sampling keeps a prefix (greedy:
prefix match), resamples the first rejected position from norm(max(0, p - q)), or adds a bonus token when all are
kept. Lossless. Drafter and target run one after the other (the "mutual waiting" PEARL removes).
"""

from __future__ import annotations

import torch

from ..core.concurrency import Span, forward_costs, now, step
from ..core.verify import accept
from ._drafting import DraftModelMethod, ModelState, draft_tokens
from .base import Generation, register

VERIFY_WIDTHS = (1, 2, 4, 6, 9)  # target forward widths timed to choose gamma (interpolated in between)
DEFAULT_ALPHA = 0.6  # assumed acceptance rate of a drafter without a measured one in its metadata


def expected_speedup(gamma: int, alpha: float, draft_s: float, target_s: dict[int, float]) -> float:
    """Tokens per second of sd over ar's (Leviathan et al. 2023 §3.4), with the measured verify cost at width gamma+1.

    E[tokens per step] = (1 - alpha^(gamma+1)) / (1 - alpha); step time = gamma * draft + target(gamma + 1).
    """
    tokens = gamma + 1 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return tokens * target_s[1] / (gamma * draft_s + _interpolate(target_s, gamma + 1))


def _interpolate(points: dict[int, float], x: int) -> float:
    xs = sorted(points)
    lo = max([w for w in xs if w <= x], default=xs[0])
    hi = min([w for w in xs if w >= x], default=xs[-1])
    if hi == lo:
        return points[lo]
    return points[lo] + (points[hi] - points[lo]) * (x - lo) / (hi - lo)


def default_gamma(target, drafter) -> int:
    """The gamma with the best expected speedup, from measured forward times and the drafter's acceptance rate."""
    costs = forward_costs(target, drafter.model, drafter.device, VERIFY_WIDTHS, drafter.spec)
    alpha = float(drafter.extras.get("meta", {}).get("agreement", DEFAULT_ALPHA))
    gammas = range(1, VERIFY_WIDTHS[-1])
    return max(gammas, key=lambda g: expected_speedup(g, alpha, costs["draft_s"], costs["target_s"]))


@register
class SpeculativeDecoding(DraftModelMethod):
    name = "sd"
    summary = "speculative decoding: a drafter proposes gamma tokens, the target verifies them in one forward"

    def __init__(self, target, options=None, drafter=None):
        super().__init__(target, options, drafter)
        self.gamma = self.options.gamma or default_gamma(target, self.drafter)

    def chosen(self) -> dict:
        source = "--gamma" if self.options.gamma else "best expected speedup from measured forward times"
        return {"drafter": self.drafter.spec, "gamma": self.gamma, "gamma_from": source}

    @torch.inference_mode()
    def generate(self, input_ids, max_new_tokens, sampling, generator):
        device, stop_ids = self.target.device, self.target.tokenizer.stop_ids
        gen = Generation()
        target = ModelState(self.target.model, device, self.vocab)
        drafter = ModelState(self.drafter.model, self.drafter.device, self.vocab)
        x = input_ids[0].tolist()  # the verified sequence: prompt + accepted tokens
        origin = now(device)
        done = False
        while not done:
            k = min(self.gamma, max_new_tokens - len(gen.tokens) - 1)  # room for the correction / bonus token
            # 1. draft: k tokens, one drafter forward each; q [k, V] their draft probabilities (None when greedy)
            d0 = now(device)
            draft, q = draft_tokens(drafter, x, k, sampling, generator)
            d1 = now(device)
            # 2. verify: the target feeds its unfed tail of x plus the drafts in one forward -> logits [k+1, V]
            logits = target.feed(target.pending(x) + draft, keep=k + 1)
            t1 = now(device)
            # 3. accept: greedy prefix match or speculative sampling; then a correction or bonus token
            n, tok = accept(torch.tensor(draft, device=device), logits, sampling, q, generator)
            if k:
                gen.count_draft(k, n)
            new = draft[:n] + [tok]
            # 4. update the caches: both roll back to the verified sequence
            x += new
            target.rollback(x, verified=len(x))
            drafter.rollback(x, verified=len(x))
            done = gen.emit(new, stop_ids, max_new_tokens)
            emitted = gen.accepted_lengths[-1]  # new cut at a stop token or max_new_tokens
            gen.timeline.append(step("sd", origin, d0, now(device), Span(d0, d1), Span(d1, t1), k, n, emitted, True))
        return gen
