"""Ranks of the true future tokens among the guesses of Medusa heads (or early-exit heads) and of Hidden Transfer's
pseudo states, on one sequence: the per-position input `acceptance.estimate` tabulates, in the same layout as PPD's
prompt tokens (acceptance.score_sequence): [positions, distances], the rank of the true token among the top-10
guesses for distance d (10 = outside them, -1 = no true token that far). Distance d guesses the token d + 1
positions after position i (the target's own logits at i give the token right after it)."""

from __future__ import annotations

import torch

from ..core.batch.forward import target_logits
from ..core.model.load import LoadedModel
from ..methods.medusa import artifact as mh
from ..methods.hidden_transfer import artifact as tp
from ..methods.hidden_transfer.training import pseudo_forward, real_forward

TOP_K = 10


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


@torch.inference_mode()
def medusa_ranks(target: LoadedModel, heads: mh.MedusaHeads, ids: list[int], start: int) -> torch.Tensor:
    """Ranks [positions start..n-3, K] of head k's guesses (heads at their layer: Medusa or early exit)."""
    model = target.model
    x, _ = mh.head_states(model, heads.layer, torch.tensor([ids], device=target.device))  # [T, H]
    points = list(range(start, len(ids) - 2))
    logits = heads.logits(model.get_output_embeddings(), x[points])  # [K, P, V]
    return ranks_of(logits.topk(TOP_K, -1).indices.transpose(0, 1), ids, points)


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


@torch.inference_mode()
def drafter_ranks(target: LoadedModel, drafter, ids: list[int], start: int, depths: int) -> torch.Tensor:
    """Ranks [positions start..n-3, depths] of a feature drafter's guesses for the token d + 1 after each position,
    drafted as `eagle` / `parallelspec` would along the true path: position i's pair (f_i, x_{i+1}) with the
    target's true features, then per depth either a mask input (parallelspec: depths = k + 1) or the pair of the
    drafter's own predicted feature and the true next token (eagle: the rank at depth d given the path so far)."""
    from ..methods.eagle.training import group_forward

    model = target.model
    seq = torch.tensor([ids], device=target.device)
    f = model.get_decoder()(input_ids=seq).last_hidden_state[0]  # [T, H]
    n = len(ids) - 1
    points = list(range(start, len(ids) - 2))
    pairs = drafter.fuse(f[:n], seq[0, 1:])  # [n, H]
    at = torch.tensor(points, device=f.device)
    k = drafter.mask_tokens
    if k:  # parallelspec: one forward, the pair's own guess then mask j's
        pair_out, group_out = group_forward(drafter, pairs, points, drafter.masks[None].expand(len(points), k, -1))
        outs = [pair_out[at]] + [group_out[:, j] for j in range(min(k, depths - 1))]
    else:  # eagle: depth d feeds (predicted feature, true token) pairs, one forward per depth
        pair_out, _ = group_forward(drafter, pairs, points, pairs.new_zeros(len(points), 0, pairs.shape[1]))
        outs, inputs = [pair_out[at]], []
        for d in range(1, depths):
            nxt = (at + 1 + d).clamp(max=len(ids) - 1)  # the true token after the previous depth's position
            inputs.append(drafter.fuse(outs[-1], seq[0, nxt]))
            _, group_out = group_forward(drafter, pairs, points, torch.stack(inputs, 1))
            outs.append(group_out[:, -1])
    guesses = torch.stack([drafter.logits(o).topk(TOP_K, -1).indices for o in outs], 1)  # [P, D, K]
    return ranks_of(guesses, ids, points)
