"""The step costs a map predicts from, measured on the spot after its run: L(B, w) on the engines the run decoded
with (batch 1 on the single-sequence engine, core/batch/single.py; B > 1 on the unpadded one, core/batch/ragged.py)
at exactly the widths and KV lengths its grid points need, so no point reads a width extrapolated past the profiled
ones. A drafter model is measured the same way on its own engines (`drafter_widths`), each forward as a draft step
runs it (its rows' last logits and a token picked from each): the curve L_d(B, w) its batched drafting is priced on
(planning/batch_prediction.DraftCost).

Each width is timed as decoding runs it: consecutive forwards of the same shape, each step keeping one of its new
tokens (the KV grows by one a step, as a decode step that accepted nothing), in two passes (batch sizes, KV lengths
and widths ascending, then all descending) so that a machine whose speed drifts slows every point alike. The file is
a latency profile (core/profile_file.py) kept in the run folder; it is not filed for other commands.
"""

from __future__ import annotations

import math

import torch

from ..core.batch.engine import engine
from ..core.batch.ragged import Segment
from ..core.machine import contention
from ..core.machine.timing import call_ms
from ..core.model.load import dtype_name, model_slug
from ..core.machine.hardware import slug_of
from ..core.profile_file import BatchCurve, LatencyProfile
from ..errors import SpecbenchError
from .batch_profile import ENGINE
from .profile import profile_meta

BASE_WIDTHS = (1, 2, 4, 8)  # kept below the widest needed width, so the curve's shape between is measured
SINGLE = "single (core/batch/single.py: one sample over the model's own cache), batch 1"


def widths_to_measure(needed: list[float], base: tuple[int, ...] = BASE_WIDTHS) -> list[int]:
    """The integer widths to time at one batch size so that every needed (mean) width lies between two measured
    ones, never past them: the floor and ceiling of each, width 1, and the base widths up to the widest needed."""
    top = math.ceil(max([1.0, *needed]))
    out = {1} | {b for b in base if b <= top}
    for w in needed:
        out |= {max(1, math.floor(w)), max(1, math.ceil(w))}
    return sorted(out)


def grid_widths(needs: dict[int, list[float]]) -> dict[int, list[int]]:
    """{B: widths to time} for a grid whose points at batch size B verify the mean widths needs[B]: every batch size
    also takes the widths of the larger ones (a batch thins out as its samples finish, so its late steps read the
    smaller batch sizes' curves), and batch 1 is always there (a profile's main curve)."""
    sizes = sorted(set(needs) | {1})
    return {b: widths_to_measure([w for size in needs if size >= b for w in needs[size]]) for b in sizes}


def drafter_widths(sizes: list[int]) -> dict[int, list[int]]:
    """{B: widths} of a drafter's on-the-spot curve L_d(B, w) for a grid of batch sizes: one token a row (each
    drafter forward after a step's first) and two (the first, when the step's drafts were all accepted)."""
    return {b: [1, 2] for b in sorted(set(sizes) | {1})}


def _consecutive(batch, size: int, rows: list[list[int]], start: int, steps: int, device,
                 pick: bool = False) -> list[float]:
    """ms of `steps` forwards of every slot's new tokens one after another, each step keeping one of them; the slots
    are cut back to `start` after. pick: each forward keeps its rows' last logits only and picks a token from each
    (argmax), as a drafter's draft step does."""
    times = []
    for r in range(steps):
        segments = [Segment(slot, rows[slot], keep=1 if pick else 0) for slot in range(size)]
        if pick:
            call = lambda: [int(out[-1].argmax()) for out in batch.forward([], segments)[1]]  # noqa: E731
        else:
            call = lambda: batch.forward([], segments)  # noqa: E731
        times.append(call_ms(call, device))
        for slot in range(size):
            batch.truncate(slot, start + r + 1)
    for slot in range(size):
        batch.truncate(slot, start)
    return times


@torch.inference_mode()
def measure_on_the_spot(target, widths_by_size: dict[int, list[int]], kv_lengths: list[int], repeats: int = 8,
                        warmup: int = 2, mode: str = "unpadded", advance=lambda text: None,
                        pick: bool = False) -> LatencyProfile:
    """A latency profile of `widths_by_size` (grid_widths) at every KV length: batch 1 on the single-sequence engine
    (its `curves`), every B > 1 on the `mode` engine (its batch curves); each point the median of `repeats` forwards
    (half in each pass, its engine made and its prompts prefilled again for each) after `warmup` per pass. pick:
    each forward as a drafter's draft step (its rows' last logits and a token picked from each: _consecutive)."""
    if 1 not in widths_by_size:
        raise SpecbenchError("an on-the-spot profile needs batch 1's widths (its main curve)")
    model, device = target.model, target.device
    kv_lengths = sorted(set(kv_lengths))
    widest = max(max(w) for w in widths_by_size.values())
    if kv_lengths[-1] + repeats + 2 * warmup + widest > target.context_length:
        raise SpecbenchError(f"map: KV length {kv_lengths[-1]} + width {widest} exceeds the model's context "
                             f"({target.context_length}): lower --context")
    gen = torch.Generator().manual_seed(2)
    vocab = min(target.vocab_size, 32000)
    before = contention.snapshot()
    sizes = sorted(widths_by_size)
    prompts = {(size, kv): [torch.randint(0, vocab, (kv,), generator=gen).tolist() for _ in range(size)]
               for size in sizes for kv in kv_lengths}
    rows = {(size, w): [torch.randint(0, vocab, (w,), generator=gen).tolist() for _ in range(size)]
            for size in sizes for w in widths_by_size[size]}
    times: dict[tuple[int, int, int], list[float]] = {}  # (size, kv, width) -> ms of each timed forward
    half = max(1, (repeats + 1) // 2)
    # two passes, the second in the reverse order of batch sizes, KV lengths and widths: a machine whose speed
    # drifts during the profile moves every point alike (stop 57's map, batch sizes one after another: L(4, 1)
    # read 26.2 ms, below L(2, 1)'s 27.8, where the run's ar stepped at 33.0 ms at B = 4)
    for forward in (True, False):
        order = (lambda xs: list(xs)) if forward else (lambda xs: list(xs)[::-1])  # noqa: E731
        for size in order(sizes):
            for kv in order(kv_lengths):
                batch = engine(model, "single" if size == 1 else mode, size, device)
                for slot in range(size):  # one slot at a time (a B x kv prefill in one forward: B times the memory)
                    batch.forward([Segment(slot, prompts[(size, kv)][slot], keep=1)], [])
                for w in order(widths_by_size[size]):
                    _consecutive(batch, size, rows[(size, w)], kv, warmup, device, pick)
                    times.setdefault((size, kv, w), []).extend(
                        _consecutive(batch, size, rows[(size, w)], kv, half, device, pick))
                advance(f"B {size} kv {kv} ({'first' if forward else 'second'} pass)")
                del batch
    curves: dict[int, dict[int, dict[str, list[float]]]] = {}
    for size in sizes:
        curves[size] = {}
        for kv in kv_lengths:
            stats = [torch.tensor(times[(size, kv, w)]) for w in widths_by_size[size]]
            curves[size][kv] = {"median_ms": [round(float(t.median()), 3) for t in stats],
                                "p10_ms": [round(float(t.quantile(0.1)), 3) for t in stats],
                                "p90_ms": [round(float(t.quantile(0.9)), 3) for t in stats]}
    meta = profile_meta(target, before, 2 * half, warmup)
    meta["kv_growth"] = "one token a step (each width's steps consecutive, as decoding runs them)"
    meta["engines"] = {"batch 1": SINGLE, "batch > 1": ENGINE if mode == "unpadded" else mode}
    meta["measured_for"] = "the map's grid, after its run (on the spot)" + (
        ": draft steps (each forward's rows' last logits, a token picked from each)" if pick else "")
    batches = {b: BatchCurve(list(widths_by_size[b]), curves[b]) for b in widths_by_size if b > 1}
    return LatencyProfile(model_slug(target.spec), dtype_name(target.dtype), slug_of(meta["identity"]), "measured",
                          list(widths_by_size[1]), curves[1], meta, batches)
