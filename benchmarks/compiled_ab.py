"""Benchmark: two settings of the compiled CPU forward side by side in one process, rounds interleaved (issue 50 §2).

This VM's speed drifts by ~20% within minutes (benchmarks/RESULTS-cpu.md), so two `specbench profile` runs one after
the other can disagree by more than the change they compare. Here both settings are compiled in one process (each
its own compile state: the settings are read when the state is made and when its graphs trace), then every round
times each width under A and under B back to back, the order alternating per round. Printed per width: the median
ms of a forward under each, and B / A with the range of the per-round ratios.

    python benchmarks/compiled_ab.py --a SPECBENCH_COMPILE_ATTENTION=sdpa --b SPECBENCH_COMPILE_ATTENTION=auto
        [--model smollm2-135m] [--dtype float32] [--widths 1,2,4,8,16] [--kv-length 512] [--rounds 9] [--repeats 10]

A setting is NAME=VALUE[,NAME=VALUE...] of environment variables (SPECBENCH_COMPILE_LINEAR, _ATTENTION, _FUSE,
_NATIVE, ...) or of inductor's config options, named inductor.<option> (inductor.cpp.min_chunk_size=4096). Quiet
machine only (nothing else running).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from unittest import mock

import torch

from specbench.core.batch.ragged import Segment
from specbench.core.batch.static import StaticSequence
from specbench.core.model import compile as cc
from specbench.core.model.load import load_model


def setting(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in text.split(",") if part)


def environment(env: dict[str, str]):
    """`env` set inside the block, as it was after: read at trace time, and guarded on by the graphs. A name
    `inductor.<option>` patches inductor's config instead (e.g. inductor.cpp.min_chunk_size=4096: read when a
    graph compiles, so it holds for the graphs built inside the block)."""
    import contextlib

    config = {k.removeprefix("inductor."): _value(v) for k, v in env.items() if k.startswith("inductor.")}
    plain = {k: v for k, v in env.items() if not k.startswith("inductor.")}
    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch.dict(os.environ, plain))
    if config:
        stack.enter_context(torch._inductor.config.patch(config))
    return stack


def _value(text: str):
    """An inductor option's value from the command line: an int, a bool, or the text."""
    if text.lstrip("-").isdigit():
        return int(text)
    return {"true": True, "false": False}.get(text.lower(), text)


def build(model, capacity: int, env: dict[str, str], widths: list[int], prompt: list[int], inputs: dict) -> tuple:
    """A compile state of its own under `env`, every width compiled; returns (state, engine, env)."""
    with environment(env):
        state = cc.enable(model, capacity)
        state.buckets[(False, False, False)] = list(widths)
        engine = StaticSequence(model, state)
        engine.forward([Segment(0, prompt, keep=1)], [])
        for w in widths:  # traced now, under env
            forward(engine, inputs[w])
        state.frozen = True
    return state, engine, env


def forward(engine, tokens: list[int]) -> None:
    length = engine.lengths[0]
    engine.forward([], [Segment(0, tokens)])
    engine.truncate(0, length)


def timed(model, state, engine, env: dict[str, str], tokens: list[int], repeats: int) -> float:
    cc._STATES[model] = state  # the model's state swapped, nothing else (its attention switch stays as it is)
    with environment(env):
        for _ in range(2):
            forward(engine, tokens)
        t0 = time.perf_counter()
        for _ in range(repeats):
            forward(engine, tokens)
        return (time.perf_counter() - t0) / repeats * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", required=True, type=setting, help="NAME=VALUE[,...]: setting A")
    ap.add_argument("--b", required=True, type=setting, help="NAME=VALUE[,...]: setting B")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--widths", default="1,2,4,8,16")
    ap.add_argument("--kv-length", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    model = load_model(args.model, dtype=args.dtype, device="cpu").model
    capacity = cc._round(args.kv_length + max(widths) + 8)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 32000, (args.kv_length,), generator=gen).tolist()
    inputs = {w: torch.randint(0, 32000, (w,), generator=gen).tolist() for w in widths}
    with torch.inference_mode():
        sides = {name: build(model, capacity, env, widths, prompt, inputs)
                 for name, env in (("A", args.a), ("B", args.b))}
        times: dict[tuple[str, int], list[float]] = {(s, w): [] for s in sides for w in widths}
        for r in range(args.rounds):
            for w in widths:
                for s in (("A", "B") if r % 2 == 0 else ("B", "A")):
                    times[s, w].append(timed(model, *sides[s], inputs[w], args.repeats))
    eager = {s: state.eager_steps for s, (state, *_) in sides.items()}
    if any(eager.values()):
        print(f"warning: forwards that ran uncompiled (a recompile refused after warm-up): {eager}")
    print(f"A: {args.a}\nB: {args.b}\n{args.model} {args.dtype}, KV {args.kv_length}, {args.rounds} interleaved rounds "
          f"of {args.repeats} forwards, {torch.get_num_threads()} threads")
    print(f"{'width':>5} {'A ms':>8} {'B ms':>8} {'B / A':>6}  per-round B / A")
    for w in widths:
        a, b = times["A", w], times["B", w]
        ratios = sorted(y / x for x, y in zip(a, b))
        print(f"{w:>5} {statistics.median(a):8.2f} {statistics.median(b):8.2f} {statistics.median(ratios):6.3f}  "
              f"{ratios[0]:.3f}-{ratios[-1]:.3f}")


if __name__ == "__main__":
    main()
