"""`specbench estimate --method eagle|parallelspec`: the ranks of the true future tokens among a feature drafter's
guesses, drafted along the true path."""

from __future__ import annotations

import torch

from ...core.model.load import LoadedModel
from ...planning.head_accuracy import TOP_K, ranks_of
from .training import group_forward


@torch.inference_mode()
def drafter_ranks(target: LoadedModel, drafter, ids: list[int], start: int, depths: int) -> torch.Tensor:
    """Ranks [positions start..n-3, depths] of a feature drafter's guesses for the token d + 1 after each position,
    drafted as `eagle` / `parallelspec` would along the true path: position i's pair (f_i, x_{i+1}) with the
    target's true features, then per depth either a mask input (parallelspec: depths = k + 1) or the pair of the
    drafter's own predicted feature and the true next token (eagle: the rank at depth d given the path so far)."""
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
