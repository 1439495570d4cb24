"""`specbench profile --compile`: L_fp(n) as `run --compile` pays it: every width a compiled static
shape (core/model/compile.py; CUDA graphs on CUDA) on the static engine's preallocated cache (core/batch/static.py).

The same protocol as planning/profile.measure (widths round-robin, one token more in the cache after every round,
median and p10 / p90 of `repeats`), batch 1 only. Every width is compiled once, before anything is timed (the first
KV length's warm-up), and the compile seconds go into the profile's meta. The profile is filed beside the eager one
with `@compiled` in its name (placement "compiled"), so that trees built for eager decoding keep reading the eager
curve: to build trees from it, put it where build-tree and `run --tree auto` look in a folder of their own
(benchmarks/gpu_pass.sh's `graphs` steps do).
"""

from __future__ import annotations

import torch

from ..core.batch.ragged import Segment
from ..core.batch.static import StaticSequence
from ..core.machine import contention, ideal
from ..core.machine.hardware import slug_of
from ..core.machine.timing import call_ms
from ..core.model import compile as cc
from ..core.model.load import LoadedModel, dtype_name, model_slug
from ..core.profile_file import LatencyProfile
from ..errors import SpecbenchError
from ..progress import progress_bar
from .profile import check_grid, profile_meta

PLACEMENT = "compiled"  # the profile's placement label: its file is <model>-<dtype>@compiled.yaml


@torch.inference_mode()
def measure_compiled(target: LoadedModel, widths, kv_lengths, repeats: int = 7, warmup: int = 2) -> LatencyProfile:
    widths, kv_lengths = sorted(set(widths)), sorted(set(kv_lengths))
    check_grid(target, widths, kv_lengths, repeats, warmup)
    model, device = target.model, target.device
    state = cc.enable(model, kv_lengths[-1] + repeats + widths[-1] + 1)
    state.buckets[(False, False, False)] = list(widths)  # every width its own shape: no padding in the curve
    gen = torch.Generator().manual_seed(0)
    vocab = min(target.vocab_size, 32000)
    curves: dict[int, dict[str, list[float]]] = {}
    before = None  # the contention check starts once every width has compiled (inductor's compile workers are other
    # processes: counted from the start, they made a quiet machine's profile read as disturbed)
    try:
        with progress_bar() as bar:
            task = bar.add_task("profiling (compiled)", total=len(kv_lengths) * repeats, info="")
            for kv in kv_lengths:
                engine = StaticSequence(model, state)
                engine.forward([Segment(0, torch.randint(0, vocab, (kv,), generator=gen).tolist(), keep=1)], [])
                inputs = {n: torch.randint(0, vocab, (n,), generator=gen).tolist() for n in widths}

                def timed(n: int) -> float:
                    length = engine.lengths[0]
                    ms = call_ms(lambda: engine.forward([], [Segment(0, inputs[n])]), device)
                    engine.truncate(0, length)
                    return ms

                for _ in range(max(warmup, 1)):  # the first KV length's first round compiles every width
                    for n in widths:
                        timed(n)
                state.frozen = True
                if before is None:
                    before = contention.snapshot()
                times: dict[int, list[float]] = {n: [] for n in widths}
                for r in range(repeats):
                    for n in (widths if r % 2 == 0 else widths[::-1]):
                        times[n].append(timed(n))
                    engine.forward([], [Segment(0, inputs[widths[0]][:1])])  # next round: KV kv + r + 1
                    bar.update(task, advance=1, info=f"kv {kv} round {r + 1}/{repeats}")
                engine.release(0)
                stats = [torch.tensor(times[n]) for n in widths]
                curves[kv] = {"median_ms": [round(float(t.median()), 3) for t in stats],
                              "p10_ms": [round(float(t.quantile(0.1)), 3) for t in stats],
                              "p90_ms": [round(float(t.quantile(0.9)), 3) for t in stats]}
    finally:
        cc.disable(model)
    if state.eager_steps:
        raise SpecbenchError(f"profile --compile: {state.eager_steps} forwards ran uncompiled; the curve would mix "
                             "compiled and eager forwards")
    meta = {**profile_meta(target, before, repeats, warmup, PLACEMENT), "compile": state.report(),
            "ideal": ideal.of_profile(target, widths, curves)}
    return LatencyProfile(model_slug(target.spec), dtype_name(target.dtype), slug_of(meta["identity"]),
                          "measured", list(widths), curves, meta, {})
