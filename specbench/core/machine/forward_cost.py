"""What one forward of a model costs here, measured before decoding: seconds per width after a short context.
sd's default window and its drafter's metadata, PEARL's calibration and training's time estimates read it."""

from __future__ import annotations

import statistics

import torch

from ..batch.cache import new_cache
from ..batch.forward import forward, timed_forward


def measure_forward_times(model, device, widths=(1,), context: int = 64, rounds: int = 7) -> dict[int, float]:
    """Seconds of one forward of w new tokens after `context` cached tokens, per width w.

    Widths are timed round-robin (rounds x widths forwards, after one untimed warm-up each) and the median taken
    per width, so a slow spell of a shared machine slows every width alike instead of one; then a running
    maximum, since a wider forward never costs less (timing noise can make a narrower width look dearer).
    """

    vocab = model.get_input_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(0)
    ctx = torch.randint(0, vocab, (1, context), generator=g).to(device)
    new = {w: torch.randint(0, vocab, (1, w), generator=g).to(device) for w in widths}
    cache = new_cache(model)
    ms: dict[int, list[float]] = {w: [] for w in widths}
    with torch.inference_mode():
        forward(model, ctx, cache, logits_to_keep=1)
        for w in widths:
            timed_forward(model, new[w], cache, device)  # warm-up
        for _ in range(rounds):
            for w in widths:
                ms[w].append(timed_forward(model, new[w], cache, device))
    out, running = {}, 0.0
    for w in sorted(widths):
        running = max(running, statistics.median(ms[w]) / 1000)
        out[w] = running
    return out


def forward_costs(target, drafter_model, draft_device, widths=(1,), drafter_spec: str = "") -> dict:
    """Measured forward times: target at each width, drafter at width 1 (memoised per target, drafter spec, device:
    the methods' defaults then stay the same within a process, so seeded sampling is reproducible)."""
    key = ("forward_costs", drafter_spec, str(draft_device), tuple(widths))
    if key not in target.extras:
        costs = {"target_s": measure_forward_times(target.model, target.device, widths),
                 "draft_s": measure_forward_times(drafter_model, draft_device)[1]}
        costs["c"] = costs["target_s"][widths[0]] / costs["draft_s"]
        target.extras[key] = costs
    return target.extras[key]
