"""`specbench estimate --method medusa`: the ranks of the true future tokens among the guesses of Medusa heads (or
early-exit heads at a middle layer), head k guessing the token k + 1 after the node it reads."""

from __future__ import annotations

import torch

from ...core.model.load import LoadedModel
from ...planning.head_accuracy import TOP_K, ranks_of
from . import artifact as mh


@torch.inference_mode()
def medusa_ranks(target: LoadedModel, heads: mh.MedusaHeads, ids: list[int], start: int) -> torch.Tensor:
    """Ranks [positions start..n-3, K] of head k's guesses (heads at their layer: Medusa or early exit)."""
    model = target.model
    x, _ = mh.head_states(model, heads.layer, torch.tensor([ids], device=target.device))  # [T, H]
    points = list(range(start, len(ids) - 2))
    logits = heads.logits(model.get_output_embeddings(), x[points])  # [K, P, V]
    return ranks_of(logits.topk(TOP_K, -1).indices.transpose(0, 1), ids, points)
