"""`specbench profile --compile`: L_fp(n) as `run --compile` pays it: every width a compiled static
shape (core/model/compile.py; CUDA graphs on CUDA) on the static engine's preallocated cache (core/batch/static.py).

The same protocol as planning/profile.measure (widths round-robin, one token more in the cache after every round,
median and p10 / p90 of `repeats`); with batch sizes (`--batch-size 1,2,4`) also L(B, w) on the static batched
engine a compiled run at batch size B decodes with (batch_profile_compiled.py), filed in the same profile. The KV
axis is real: a compiled forward attends over its whole static cache, and a run sizes that cache to its own
context (run/compiled.capacity_for), so each KV length is measured over a cache sized to it (its capacity: the
length, the rounds and the widest width, rounded up as a run rounds it), not over one cache for every length.
Every (batch size, capacity, width) shape is compiled before anything is timed, and the compile seconds go into the
profile's meta. The profile is filed beside the eager one with `@compiled` in its name (placement "compiled"), so
that trees built for eager decoding keep reading the eager curve; a `--compile` run reads it (core/lookup.py), its
L(B, w) for the choices at B > 1 too (planning/batch_choice.py).
"""

from __future__ import annotations

import torch

from ..core.batch.ragged import Segment
from ..core.batch.static import StaticKV, StaticSequence
from ..core.machine import contention, ideal
from ..core.machine.hardware import slug_of
from ..core.machine.timing import call_ms
from ..core.model import compile as cc, compile_wait
from ..core.model.load import LoadedModel, dtype_name, model_slug
from ..core.profile_file import LatencyProfile
from ..errors import SpecbenchError
from ..progress import progress_bar
from . import batch_profile_compiled as batched_profile
from .batch_profile import default_widths
from .profile import check_grid, profile_meta

PLACEMENT = "compiled"  # the profile's placement label: its file is <model>-<dtype>@compiled.yaml


@torch.inference_mode()
def measure_compiled(target: LoadedModel, widths, kv_lengths, repeats: int = 7, warmup: int = 2, batch_sizes=(1,),
                     batch_widths=None) -> LatencyProfile:
    """L(w) at batch 1 and, for every batch size B > 1, L(B, w) on the static batched engine
    (batch_profile_compiled.py) at `batch_widths` (default: batch_profile.default_widths per B); every shape of
    every batch size and cache compiled before the first timed forward."""
    widths, kv_lengths = sorted(set(widths)), sorted(set(kv_lengths))
    batched = sorted({b for b in batch_sizes if b > 1})
    if batch_widths is not None and (not batch_widths or min(batch_widths) < 1):
        raise SpecbenchError("profile: --batch-widths must be positive integers")
    row_widths = {b: sorted(set(batch_widths)) if batch_widths else default_widths(widths, b) for b in batched}
    widest = max([widths[-1], *(w[-1] for w in row_widths.values())])
    check_grid(target, widths, kv_lengths, repeats, warmup)
    if kv_lengths[-1] + repeats + widest > target.context_length:
        raise SpecbenchError(f"profile: KV length {kv_lengths[-1]} + {repeats} repeats + width {widest} exceeds the "
                             f"model's context ({target.context_length}); lower --kv-length or --batch-widths")
    model, device = target.model, target.device
    capacities = {kv: cc._round(kv + repeats + widest + 1) for kv in kv_lengths}  # as a run of that context
    state = cc.enable(model, capacities[kv_lengths[0]])
    state.buckets[(False, False, False)] = list(widths)  # every width its own shape: no padding in the curve
    caches = {cap: StaticKV(cap, state.windows) for cap in sorted(set(capacities.values()))}
    rows_caches = batched_profile.batch_caches(state, list(caches), batched)
    per_cache = len(widths) + sum(len(w) for w in row_widths.values())
    state.expected = len(caches) * per_cache
    at_sizes = "".join(f", {len(row_widths[b])} at batch size {b}" for b in batched)
    compile_wait.say_expected("profile", device, state.expected, f" ({len(widths)} widths at batch 1{at_sizes}; x "
                              f"{len(caches)} cache sizes, one per KV length)", before="the first timed forward",
                              model=model)
    gen = torch.Generator().manual_seed(0)
    vocab = min(target.vocab_size, 32000)
    curves: dict[int, dict[str, list[float]]] = {}
    rows_measured: dict[int, dict[int, dict]] = {b: {} for b in batched}
    compiled: list[dict] = []
    try:
        for cap, kv_cache in caches.items():  # compile every shape first: compile workers never overlap timing
            state.kv, state.shapes, state.batch_shapes, state.frozen = kv_cache, {}, {}, False
            engine = StaticSequence(model, state)
            engine.forward([Segment(0, [1] * min(16, cap - widest - 1), keep=1)], [])
            for n in widths:
                length = engine.lengths[0]
                engine.forward([], [Segment(0, [1] * n)])
                engine.truncate(0, length)
            engine.release(0)
            for b in batched:
                batched_profile.compile_shapes(model, state, rows_caches[(b, cap)], b, row_widths[b])
            compiled += [{**shape, "capacity": cap} for shape in state.report()["shapes"]]
        state.frozen = True
        before = contention.snapshot()
        with progress_bar() as bar:
            task = bar.add_task("profiling (compiled)", total=len(kv_lengths) * repeats * (1 + len(batched)),
                                info="")
            for kv in kv_lengths:
                state.kv = caches[capacities[kv]]
                engine = StaticSequence(model, state)
                engine.forward([Segment(0, torch.randint(0, vocab, (kv,), generator=gen).tolist(), keep=1)], [])
                inputs = {n: torch.randint(0, vocab, (n,), generator=gen).tolist() for n in widths}

                def timed(n: int) -> float:
                    length = engine.lengths[0]
                    ms = call_ms(lambda: engine.forward([], [Segment(0, inputs[n])]), device)
                    engine.truncate(0, length)
                    return ms

                curves[kv] = batched_profile.timed_rounds(
                    timed, widths, repeats, warmup,
                    lambda: engine.forward([], [Segment(0, inputs[widths[0]][:1])]),  # next round: KV kv + r + 1
                    lambda r: bar.update(task, advance=1, info=f"kv {kv} round {r + 1}/{repeats}"))
                engine.release(0)
                for b in batched:
                    rows_measured[b][kv] = batched_profile.time_shapes(
                        model, state, rows_caches[(b, capacities[kv])], b, row_widths[b], kv, repeats, warmup, gen,
                        vocab, device, lambda text: bar.update(task, advance=1, info=text))
    finally:
        cc.disable(model)
    if state.eager_steps:
        raise SpecbenchError(f"profile --compile: {state.eager_steps} forwards ran uncompiled; the curve would mix "
                             "compiled and eager forwards")
    report = {**state.report(), "shapes": compiled, "seconds": round(sum(c["seconds"] for c in compiled), 3),
              "capacity_per_kv": capacities}
    report.pop("batch_buckets", None)  # the last cache's; the shapes above say every batch size's widths
    meta = {**profile_meta(target, before, repeats, warmup, PLACEMENT), "compile": report,
            "ideal": ideal.of_profile(target, widths, curves)}
    if batched:
        meta["batch_engine"] = batched_profile.ENGINE
    return LatencyProfile(model_slug(target.spec), dtype_name(target.dtype), slug_of(meta["identity"]),
                          "measured", list(widths), curves, meta,
                          batched_profile.curves(rows_measured, row_widths.get))
