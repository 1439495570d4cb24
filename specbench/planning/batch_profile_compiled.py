"""`specbench profile --compile --batch-size 1,2,4`: L(B, w) as `run --compile --batch-size B` pays it, on the static
batched engine (core/batch/static_batch.py) at its compiled shapes.

A compiled run at batch size B decodes its B samples side by side in one static cache [B, kv_heads, capacity,
head_dim] per layer, every decode forward one compiled graph of shape [B, bucket]: B slots (a run's batch size, no
padding of the slot count), each slot's new tokens padded to the bucket. Here each width w is its own shape
[B, w] (as the batch-1 compiled curve times every width unpadded), every slot's row holds w new tokens on top of
its own kv tokens, and the cache is sized to the KV length as a run sizes it (profile_compiled.py: the capacity of
that length, the rounds and the widest width), so the KV axis is as real as batch 1's. The shapes are compiled by
profile_compiled.measure_compiled with batch 1's, before anything is timed; this module compiles and times one
batch size over one cache.
"""

from __future__ import annotations

import torch

from ..core.batch.ragged import Segment
from ..core.batch.static import StaticKV
from ..core.batch.static_batch import StaticBatch
from ..core.machine.timing import call_ms
from ..core.profile_file import BatchCurve

ENGINE = ("static batch (core/batch/static_batch.py: B slots in one static cache, every decode forward one compiled "
          "shape [B, w])")
TOKENS = (False, False, False)  # the kind of input timed: tokens in, causal mask, logits out (a chain's verify)


def batch_caches(state, capacities: list[int], sizes: list[int]) -> dict[tuple[int, int], StaticKV]:
    """(B, capacity) -> the static batch cache of B slots at that capacity (allocated at its first forward)."""
    return {(b, cap): StaticKV(cap, state.windows, batch=b) for b in sizes for cap in capacities}


def _static_batch(model, state, cache: StaticKV, size: int) -> StaticBatch:
    """The static batch of `size` slots over `cache` (the compile state's batch cache of that size from now on)."""
    state.batch_kv[size] = cache
    return StaticBatch(model, state, size)


def compile_shapes(model, state, cache: StaticKV, size: int, widths: list[int]) -> None:
    """Compile [size, w] for every width over `cache` (one forward each on a short prefill; nothing timed): each
    width its own bucket, so the curve holds no padding."""
    state.batch_buckets[size] = {TOKENS: list(widths)}
    batch = _static_batch(model, state, cache, size)
    prompt = [1] * max(1, min(16, cache.capacity - widths[-1] - 1))
    for slot in range(size):
        batch.forward([Segment(slot, prompt, keep=1)], [])
    for w in widths:
        batch.forward([], [Segment(slot, [1] * w) for slot in range(size)])
        for slot in range(size):
            batch.truncate(slot, len(prompt))
    for slot in range(size):
        batch.release(slot)


def time_shapes(model, state, cache: StaticKV, size: int, widths: list[int], kv: int, repeats: int, warmup: int,
                gen: torch.Generator, vocab: int, device, advance) -> dict[str, list[float]]:
    """The median (p10, p90) ms of [size, w] forwards for every width, every slot on kv random tokens of its own
    (prefilled eagerly, a slot at a time, as a run's newcomers join): widths round-robin, alternating direction,
    each round one token deeper in every slot (as batch 1's compiled curve). advance(text): once a round."""
    batch = _static_batch(model, state, cache, size)
    for slot in range(size):
        batch.forward([Segment(slot, torch.randint(0, vocab, (kv,), generator=gen).tolist(), keep=1)], [])
    rows = {w: [torch.randint(0, vocab, (w,), generator=gen).tolist() for _ in range(size)] for w in widths}

    def timed(w: int) -> float:
        length = batch.lengths[0]  # every slot holds the same number of entries
        ms = call_ms(lambda: batch.forward([], [Segment(slot, rows[w][slot]) for slot in range(size)]), device)
        for slot in range(size):
            batch.truncate(slot, length)
        return ms

    def next_round() -> None:  # every slot one token deeper: kv + r + 1
        batch.forward([], [Segment(slot, rows[widths[0]][slot][:1]) for slot in range(size)])

    stats = timed_rounds(timed, widths, repeats, warmup, next_round,
                         lambda r: advance(f"B {size} kv {kv} round {r + 1}/{repeats}"))
    for slot in range(size):
        batch.release(slot)
    return stats


def timed_rounds(timed, widths: list[int], repeats: int, warmup: int, next_round, advance) -> dict[str, list[float]]:
    """The median (p10, p90) ms of timed(w) for every width: `warmup` untimed rounds, then `repeats` timed ones, the
    widths' order reversed every other round (a drift falls on every width alike); after each timed round
    next_round() (the cache one token deeper) and advance(r) (the progress bar)."""
    for _ in range(max(warmup, 1)):
        for w in widths:
            timed(w)
    times: dict[int, list[float]] = {w: [] for w in widths}
    for r in range(repeats):
        for w in (widths if r % 2 == 0 else widths[::-1]):
            times[w].append(timed(w))
        next_round()
        advance(r)
    stats = [torch.tensor(times[w]) for w in widths]
    return {"median_ms": [round(float(t.median()), 3) for t in stats],
            "p10_ms": [round(float(t.quantile(0.1)), 3) for t in stats],
            "p90_ms": [round(float(t.quantile(0.9)), 3) for t in stats]}


def curves(measured: dict[int, dict[int, dict]], widths_of) -> dict[int, BatchCurve]:
    """{B: BatchCurve} from {B: {kv: stats}}."""
    return {b: BatchCurve(list(widths_of(b)), per_kv) for b, per_kv in sorted(measured.items())}


def compiled_profile_workload(widths: list[int], kv_lengths: list[int], repeats: int, batch_sizes: list[int],
                              batch_widths: list[int] | None = None):
    """What `profile --compile` holds at once, for the fit check (core/model/memory_need.Workload): one static
    cache per KV length's capacity at every batch size (batch 1's and each B's, all kept until the timing ends: a
    compiled shape is bound to its cache), and the widest forward, B x w rows at the largest B. The KV entries are
    stated per row of the largest batch; a refusal's smaller --batch-size is the largest B whose profile (the batch
    sizes below it and B) fits (`at_batch`)."""
    from ..core.model.compile import _round
    from ..core.model.memory_need import Workload
    from .batch_profile import default_widths

    sizes = sorted(set(batch_sizes) | {1})
    rows = [sorted(set(batch_widths)) if batch_widths else default_widths(widths, b) for b in sizes if b > 1]
    widest = max([max(widths), *(r[-1] for r in rows)])
    entries = sum({_round(kv + repeats + widest + 1) for kv in kv_lengths})  # per slot, every capacity
    top = max(sizes)
    tokens = -(-entries * sum(sizes) // top)
    # the widest forward: B x w rows of a decode step, or a slot's prefill of the longest KV length (one row each)
    return Workload(tokens, top, max(widest, -(-max(kv_lengths) // top)), widest, compiled=True,
                    what=f"static caches of {entries} entries x batch sizes {', '.join(map(str, sizes))}: one per "
                         "--kv-length, each its length + repeats + the widest width, every batch size's held at once",
                    at_batch=lambda b: compiled_profile_workload(widths, kv_lengths, repeats,
                                                                 [s for s in sizes if s < b] + [b], batch_widths))
