"""`sd`: speculative decoding (Leviathan et al. 2023, Alg. 1; Chen et al. 2023): the drafter proposes gamma tokens
one forward at a time, the target scores them all in one forward, speculative sampling keeps a prefix (greedy:
prefix match), resamples the first rejected position from norm(max(0, p - q)), or adds a bonus token when all are
kept. Lossless. Drafter and target run one after the other (the "mutual waiting" PEARL removes).
"""

from __future__ import annotations

import torch
from rich.markup import escape

from ...core.machine.forward_cost import forward_costs
from ...core.batch.ragged import Segment
from ...planning.batch_choice import KV_LENGTH, batch_view
from ...progress import console
from .drafting import DraftModelMethod, draw, fit_vocab, greedy_draws, kept_prefix
from ..base import register
from ..batch_loop import Batchable, engine

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


def default_gamma(target, drafter, batch_curve=None) -> int:
    """The gamma with the best expected speedup, from measured forward times and the drafter's acceptance rate.

    batch_curve (a profile's L(B, w), planning/batch_choice.batch_view): the gamma for batch size B, the target's
    verify cost at width w taken as L(B, w) / L(B, 1) times its measured 1-token forward, the drafter's cost as
    measured (its ratio to the target's 1-token forward, c, assumed the same at every B)."""
    costs = forward_costs(target, drafter.model, drafter.device, VERIFY_WIDTHS, drafter.spec)
    alpha = float(drafter.extras.get("meta", {}).get("agreement", DEFAULT_ALPHA))
    gammas = range(1, VERIFY_WIDTHS[-1])
    target_s = costs["target_s"]
    if batch_curve is not None:
        base, kv = target_s[1], KV_LENGTH
        target_s = {w: base * batch_curve.latency_ms(w, kv) / batch_curve.latency_ms(1, kv)
                    for w in range(1, VERIFY_WIDTHS[-1] + 1)}
    return max(gammas, key=lambda g: expected_speedup(g, alpha, costs["draft_s"], target_s))


@register
class SpeculativeDecoding(Batchable, DraftModelMethod):
    name = "sd"
    timeline_mode = "sd"  # per-step draft / verify spans (report/timeline.py)
    draft_on_join = True  # the first drafts continue the prompt and are verified with it (Alg. 1 from the start)
    summary = "speculative decoding: a drafter proposes gamma tokens, the target verifies them in one forward"

    def __init__(self, target, options=None, drafter=None):
        super().__init__(target, options, drafter)
        self.gamma = self.options.gamma or default_gamma(target, self.drafter)
        self.batch_gammas = {1: self.gamma}  # batch size -> gamma (choose_per_batch_size: --gamma auto per batch size)
        self.batch_gamma = self.gamma  # the gamma of the batch being decoded (start_batch)

    def chosen(self) -> dict:
        source = "--gamma" if self.options.gamma else "best expected speedup from measured forward times"
        out = {"drafter": self.drafter.spec, "gamma": self.gamma, "gamma_from": source}
        if len(self.batch_gammas) > 1:
            out["gamma_per_batch_size"] = dict(sorted(self.batch_gammas.items()))
        return out

    def choose_per_batch_size(self, sizes):
        """--gamma auto per batch size: each B > 1 from this hardware's L(B, w), else batch 1's gamma and a note."""
        if self.options.gamma:
            return
        for size in sorted({b for b in sizes if b > 1}):
            curve, why = batch_view(self.target, size)
            self.batch_gammas[size] = self.gamma if curve is None else default_gamma(self.target, self.drafter, curve)
            said = f"from L(B={size}, w)" if curve is not None else f"batch 1's ({why})"
            console.print(f"[dim]{self.name}: batch size {size}: gamma {self.batch_gammas[size]} {escape(said)}[/]")

    # the step (methods/batch_loop.py): the drafter decodes its own slots, in the target's engine's mode

    def start_batch(self, mode, slots):
        self._drafter_batch = engine(self.drafter.model, mode, slots, self.drafter.device)
        self.batch_gamma = self.batch_gammas.get(slots, self.gamma)

    def leave(self, sample):
        if sample.slot in self._drafter_batch.rows:
            self._drafter_batch.release(sample.slot)

    def propose(self, samples, max_new_tokens, sampling):
        """Each sample's k drafts, one drafter forward per draft position over every sample (Alg. 1 lines 1-4 per sample,
        each on its own random stream); the drafter's cache first rolls back to the verified sequence.

        Drafting cost per sample: draft_forwards += the batched drafter forwards it took part in (one per draft
        position it drafts; its first ever also feeds its whole history: the drafter's prefill); its share of the
        drafting time is the step's (batch_loop.py)."""
        batch = self._drafter_batch
        k = {s.slot: min(self.batch_gamma, s.room(max_new_tokens)) for s in samples}
        for s in samples:
            fed = s.scratch.setdefault("fed", [])  # the tokens the drafter's cache holds for this sample
            if s.slot in batch.rows:
                keep = kept_prefix(fed, s.history)
                batch.truncate(s.slot, keep)
                del fed[keep:]
            s.draft, s.q = [], None
        probs: dict[int, list[torch.Tensor]] = {s.slot: [] for s in samples}
        for j in range(max(k.values(), default=0)):
            drafting = [s for s in samples if k[s.slot] > j]
            feeds = {s.slot: (s.history[len(s.scratch["fed"]):] if j == 0 else [s.draft[-1]]) for s in drafting}
            joining = [s for s in drafting if s.slot not in batch.rows]
            stepping = [s for s in drafting if s.slot in batch.rows]
            first, out = batch.forward([Segment(s.slot, feeds[s.slot], keep=1) for s in joining],
                                       [Segment(s.slot, feeds[s.slot], keep=1) for s in stepping])
            logits = {s.slot: o[-1] for s, o in zip(joining + stepping, first + out)}
            greedy = dict(zip(logits, greedy_draws(list(logits.values()), self.vocab))) if sampling.greedy else {}
            for s in drafting:
                s.scratch["fed"] += feeds[s.slot]
                s.gen.draft_forwards += 1
                if sampling.greedy:
                    tok, q = greedy[s.slot], None
                else:  # each sample on its own random stream
                    tok, q = draw(fit_vocab(logits[s.slot], self.vocab), sampling, s.generator)
                s.draft.append(tok)
                if q is not None:
                    probs[s.slot].append(q)
        for s in samples:
            s.q = torch.stack(probs[s.slot]) if probs[s.slot] else None
