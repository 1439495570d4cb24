"""Verification math: pure functions of tensors (no model, cache or global state).

Notation (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding", Alg. 1):
p = target distribution, q = draft distribution, x_1..x_k = drafted tokens.
Target logits/probs are given for k+1 positions: position i scores the token after x_1..x_i
(position 0 scores x_1, position k is the bonus position after the last draft).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen. temperature 0 means greedy (argmax)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def warp_probs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Logits [..., V] -> the distribution actually sampled from [..., V] (temperature, top-k, top-p), float32."""
    logits = logits.float() / max(sampling.temperature, 1e-6)
    vocab = logits.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # drop a token when the mass before it already reaches top_p (the first token always stays)
        drop_sorted = (cumulative - sorted_logits.softmax(-1)) >= sampling.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from probs [V]."""
    return int(torch.multinomial(probs, 1, generator=generator).item())


def next_token(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> int:
    """One token from logits [V]: argmax when greedy, else a sample of the warped distribution."""
    if sampling.greedy:
        return int(logits.argmax(-1).item())
    return sample(warp_probs(logits, sampling), generator)


def greedy_accept(draft: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, int]:
    """Longest prefix of draft [k] equal to the target's argmax; returns (accepted count, next token).

    target_logits: [k+1, V]. The next token is the target's argmax after the accepted prefix (correction on a
    mismatch, bonus token when all k are accepted).
    """
    choice = target_logits.argmax(-1)  # [k+1]
    k = draft.shape[0]
    mismatch = (draft != choice[:k]).nonzero()
    n = int(mismatch[0, 0]) if mismatch.numel() else k
    return n, int(choice[n])


def speculative_accept(
    draft: torch.Tensor,
    p: torch.Tensor,
    q: torch.Tensor | None,
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """Speculative sampling (Leviathan et al. 2023, Alg. 1); returns (accepted count, next token).

    draft: [k] drafted tokens; p: [k+1, V] target probabilities; q: [k, V] draft probabilities, or None when the
    draft was deterministic (one-hot q, as in prompt lookup), where accepting x with probability p(x) and
    resampling from p with x removed is the same rule.
    Accept x_i with probability min(1, p_i(x_i) / q_i(x_i)); on the first rejection sample from
    norm(max(0, p_i - q_i)); when all k are accepted sample the bonus token from p_k. The emitted tokens are then
    distributed exactly as p.
    """
    k = draft.shape[0]
    for i in range(k):
        x = int(draft[i])
        px = float(p[i, x])
        qx = 1.0 if q is None else float(q[i, x])
        u = float(torch.rand((), generator=generator))
        if qx > 0 and u < min(1.0, px / qx):
            continue
        if q is None:
            residual = p[i].clone()
            residual[x] = 0.0
        else:
            residual = (p[i] - q[i]).clamp_min(0.0)
        total = float(residual.sum())
        if total <= 0.0:  # p == q up to rounding: any sample from p is exact
            residual, total = p[i], float(p[i].sum())
        return i, sample(residual / total, generator)
    return k, sample(p[k], generator)


def accept(
    draft: torch.Tensor,
    target_logits: torch.Tensor,
    sampling: Sampling,
    q: torch.Tensor | None,
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """Greedy prefix match at temperature 0, speculative sampling otherwise. target_logits: [k+1, V]."""
    if sampling.greedy:
        return greedy_accept(draft, target_logits)
    return speculative_accept(draft, warp_probs(target_logits, sampling), q, generator)
