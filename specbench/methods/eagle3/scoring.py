"""`specbench estimate --method eagle3` and the held-out top-1 of `train eval`: the ranks of the true future tokens
among the EAGLE-3 drafter's guesses, drafted along the true path (its own outputs, the true tokens: the unrolled
steps of its training-time test, training.unrolled)."""

from __future__ import annotations

import torch

from ...core.model.load import LoadedModel
from ...planning.head_accuracy import TOP_K, ranks_of
from .layers import fused_states
from .training import unrolled


@torch.inference_mode()
def drafter_ranks(target: LoadedModel, drafter, ids: list[int], start: int, depths: int) -> torch.Tensor:
    """Ranks [positions start..n-3, depths] of the drafter's guesses for the token d + 1 after each position: depth d
    feeds the drafter's output of depth d - 1 with the true token, at the position's column of the unrolled steps."""
    seq = torch.tensor([ids], device=target.device)
    g, _ = fused_states(target.model, seq)
    n = len(ids) - 1
    points = list(range(start, len(ids) - 2))
    dtype = drafter.fc.weight.dtype
    steps = unrolled(drafter, g[:n].to(dtype), seq[0], points, depths)
    guesses = torch.full((len(points), depths, TOP_K), -1, dtype=torch.long)  # -1: past the sequence's end
    row = {t: i for i, t in enumerate(points)}
    for d, (at, o) in enumerate(steps):
        keep = [i for i, t in enumerate(at) if t in row]
        if not keep:
            continue
        top = drafter.top_ids(o[torch.tensor(keep, device=o.device)], TOP_K).cpu()  # [m, K]
        guesses[torch.tensor([row[at[i]] for i in keep]), d] = top
    return ranks_of(guesses, ids, points)
