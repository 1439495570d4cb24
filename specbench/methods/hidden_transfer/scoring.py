"""`specbench estimate --method hidden-transfer`: the ranks of the true future tokens among the guesses of Hidden
Transfer's pseudo states (k pseudo positions inserted after each point)."""

from __future__ import annotations

import torch

from ...core.batch.forward import target_logits
from ...core.model.load import LoadedModel
from ...planning.head_accuracy import TOP_K, ranks_of
from . import artifact as tp
from .training import pseudo_forward, real_forward


@torch.inference_mode()
def transfer_ranks(target: LoadedModel, proj: tp.TransferProjections, ids: list[int], start: int,
                   chunk: int = 32) -> torch.Tensor:
    """Ranks [positions start..n-3, k] of pseudo state j's guesses (k pseudo positions inserted after each point)."""
    cache, _, captured = real_forward(target, ids, proj.layers)
    points = list(range(start, len(ids) - 2))
    parts = []
    for c in range(0, len(points), chunk):
        at = points[c:c + chunk]
        h = pseudo_forward(target, proj, cache, len(ids), at, captured)  # [C, k, H]
        parts.append(ranks_of(target_logits(target.model, h).topk(TOP_K, -1).indices, ids, at))
    return torch.cat(parts)
