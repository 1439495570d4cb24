"""L(B, w) for `specbench profile --batch-size`: one forward of B rows of w new tokens each, every row on top of its
own KV cache of kv tokens, timed on the engine of `run --batching unpadded` (core/batch/ragged.py, EMS-SD's unpad KV cache
and packed inputs: the B x w tokens enter every linear layer as one packed row, no padding).

What it is for: at batch B every extra candidate costs B rows, so the draft length or tree size that pays at B = 1
is too large at B > 1. A step of a batch of B samples verifying w tokens each costs L(B, w); the speedup over `ar`
at that batch size is tau(w) L(B, 1) / L(B, w), which build-tree, `--tree auto` and `--gamma auto` maximise per B.
Batch 1 stays profile.py's plain forward (the profile's `curves`); only B > 1 is measured here.
"""

from __future__ import annotations

import torch

from ..core.profile_file import BatchCurve
from ..core.batch.ragged import RaggedBatch, Segment
from ..core.machine.timing import call_ms
from ..errors import SpecbenchError

ENGINE = "unpadded (core/batch/ragged.py: per-row KV caches, the rows' new tokens packed into one forward)"


def default_widths(widths: list[int], batch_size: int) -> list[int]:
    """The widths measured at batch B by default: those of the batch-1 curve whose B x w total does not pass the
    widest batch-1 forward (so a profile at B = 16 does not time 16 x 128-token forwards), at least width 1 and 2.
    Wider steps are extrapolated from the last segment (LatencyProfile.latency_ms)."""
    cap = max(widths)
    kept = [w for w in widths if w * batch_size <= cap]
    return sorted(set(kept) | {1, 2})


def check_batch_sizes(batch_sizes: list[int]) -> list[int]:
    """Sorted unique batch sizes, each at least 1 (SpecbenchError naming the option otherwise)."""
    bad = [b for b in batch_sizes if b < 1]
    if bad or not batch_sizes:
        raise SpecbenchError(f"--batch-size: sizes must be integers >= 1 (got {', '.join(map(str, batch_sizes))})")
    return sorted(set(batch_sizes))


def _prefilled(model, batch_size: int, kv: int, vocab: int, gen: torch.Generator, device) -> RaggedBatch:
    """A ragged batch of B slots, each holding kv random tokens (prefilled one slot at a time: a B x kv prefill in
    one forward would need B times the attention memory for nothing)."""
    batch = RaggedBatch(model, batch_size)
    for slot in range(batch_size):
        tokens = torch.randint(0, vocab, (kv,), generator=gen).tolist()
        batch.forward([Segment(slot, tokens, keep=1)], [])
    return batch


def _step_ms(batch: RaggedBatch, rows: list[list[int]], kv: int, device) -> float:
    """ms of one forward of every slot's new tokens (logits at every row, as a verify step reads them), after which
    each slot is cut back to its kv tokens."""
    segments = [Segment(slot, tokens) for slot, tokens in enumerate(rows)]
    ms = call_ms(lambda: batch.forward([], segments), device)
    for slot in range(len(rows)):
        batch.truncate(slot, kv)
    return ms


@torch.inference_mode()
def measure_batches(target, batch_sizes: list[int], widths_of, kv_lengths: list[int], repeats: int, warmup: int,
                    advance) -> dict[int, BatchCurve]:
    """{B: BatchCurve} for every B > 1 in batch_sizes: the median (p10, p90) of `repeats` timed forwards per (kv, w)
    after `warmup` rounds, widths timed round-robin, alternating direction, each round one token deeper in every
    slot's cache (as profile.measure does at batch 1).
    widths_of(B) -> the widths of B; advance(text) is called once per round (the progress bar)."""
    model, device = target.model, target.device
    gen = torch.Generator().manual_seed(1)
    vocab = min(target.vocab_size, 32000)
    out: dict[int, BatchCurve] = {}
    for size in (b for b in batch_sizes if b > 1):
        widths = widths_of(size)
        if kv_lengths[-1] + repeats + widths[-1] > target.context_length:
            raise SpecbenchError(f"profile: KV length {kv_lengths[-1]} + {repeats} repeats + width {widths[-1]} "
                                 f"exceeds the model's context ({target.context_length}); lower --kv-length or "
                                 "--batch-widths")
        curve = BatchCurve(list(widths), {})
        for kv in kv_lengths:
            batch = _prefilled(model, size, kv, vocab, gen, device)
            rows = {w: [torch.randint(0, vocab, (w,), generator=gen).tolist() for _ in range(size)] for w in widths}
            for _ in range(warmup):
                for w in widths:
                    _step_ms(batch, rows[w], kv, device)
            times: dict[int, list[float]] = {w: [] for w in widths}
            for r in range(repeats):
                for w in (widths if r % 2 == 0 else widths[::-1]):
                    times[w].append(_step_ms(batch, rows[w], kv + r, device))
                # next round: every slot one token longer, a new shape (profile.py)
                batch.forward([], [Segment(slot, rows[widths[0]][slot][:1], keep=1) for slot in range(size)])
                advance(f"B {size} kv {kv} round {r + 1}/{repeats}")
            stats = [torch.tensor(times[w]) for w in widths]
            curve.curves[kv] = {"median_ms": [round(float(t.median()), 3) for t in stats],
                                "p10_ms": [round(float(t.quantile(0.1)), 3) for t in stats],
                                "p90_ms": [round(float(t.quantile(0.9)), 3) for t in stats]}
        out[size] = curve
    return out
