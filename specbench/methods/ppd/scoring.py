"""`specbench estimate --method ppd`: the ranks of the true future tokens among each prompt token's guesses.

Prompt token d, inserted after the last accepted token x_i, guesses x_{i+1+d}. Every position of every continuation
is an insertion point; prompt tokens are scored in chunks on top of the KV cache of the whole sequence."""

from __future__ import annotations

import torch

from ...core.batch.cache import crop_to, new_cache
from ...core.batch.forward import target_logits
from ...core.model.load import LoadedModel
from ...planning.acceptance import TOP_K
from .artifact import PromptTokens, hidden, insertion_inputs


@torch.inference_mode()
def score_sequence(target: LoadedModel, tokens: PromptTokens, ids: list[int], start: int,
                   chunk: int = 32) -> torch.Tensor:
    """Ranks hit by the guesses on one sequence: [positions, S] rank of the true token among prompt token d's
    guesses (TOP_K = outside the top-k, -1 = no true token that far). Insertion after every position >= start."""
    model = target.model
    seq = torch.tensor(ids, device=target.device)
    count, ept = tokens.count, tokens.ept
    table = tokens.table(target.dtype, target.device)  # [S * E, H]
    cache = new_cache(model)
    n = len(ids)
    causal = torch.full((n, n), torch.finfo(target.dtype).min, dtype=target.dtype, device=target.device).triu(1)
    hidden(model, model.get_input_embeddings()(seq)[None], causal[None, None],
           torch.arange(n, device=target.device)[None], cache)
    points = list(range(start, n - 2))
    out = torch.full((len(points), count), -1, dtype=torch.long)
    for c in range(0, len(points), chunk):
        at = points[c:c + chunk]
        mask, pos, rows = insertion_inputs(at, count, ept, n, target.dtype, target.device)
        h = hidden(model, table[rows][None], mask, pos, cache)  # [q, H]
        crop_to(cache, n)
        logits = target_logits(model, h).view(len(at), count, ept, -1).mean(2)  # [C, S, V]: as ppd's step reads them
        guesses = logits.topk(TOP_K, dim=-1).indices.cpu()  # [C, S, K]
        for d in range(count):
            truth_at = torch.tensor(at) + 2 + d  # guess of prompt token d+1 is x_{i+2+d} (0-based d)
            valid = truth_at < n
            truth = seq.cpu()[truth_at.clamp(max=n - 1)]
            hit = guesses[:, d] == truth[:, None]  # [C, K]
            rank = torch.where(hit.any(1), hit.float().argmax(1), torch.tensor(TOP_K))
            out[c:c + len(at), d] = torch.where(valid, rank, torch.tensor(-1))
    return out


