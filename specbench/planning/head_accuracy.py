"""The rank of the true future tokens among a family's top-10 guesses, on one sequence: the per-position input
`acceptance.estimate_with` tabulates, [positions, distances] (10 = outside the top 10, -1 = no true token that far).
Distance d guesses the token d + 1 positions after position i (the target's own logits at i give the token right
after it). Each family's scoring (methods/<family>/scoring.py) turns its guesses into these ranks."""

from __future__ import annotations

import torch

from .acceptance import TOP_K


def ranks_of(guesses: torch.Tensor, ids: list[int], points: list[int]) -> torch.Tensor:
    """guesses [P, D, K] top-k ids at each point -> [P, D] rank of the true token ids[i + 2 + d] (or 10 / -1)."""
    n = len(ids)
    seq = torch.tensor(ids)
    out = torch.full(guesses.shape[:2], -1, dtype=torch.long)
    for d in range(guesses.shape[1]):
        at = torch.tensor(points) + 2 + d
        valid = at < n
        truth = seq[at.clamp(max=n - 1)]
        hit = guesses[:, d].cpu() == truth[:, None]
        rank = torch.where(hit.any(1), hit.float().argmax(1), torch.tensor(TOP_K))
        out[:, d] = torch.where(valid, rank, torch.tensor(-1))
    return out
