"""Benchmark: where a compiled CPU forward's time goes, per kind of operation (issue 50 §2).

Loads the model, compiles the static step (`--compile`'s, core/model/compile.py) at each width over a cache holding
`--kv-length` tokens, and runs torch.profiler over `--repeats` forwards per width. Prints, per width, the forward's
wall time and the self CPU time per forward of the top operations, grouped into the kinds the compiled graph runs:
linear (oneDNN / MKL / the panels), attention, the Python hop into a custom op, the graph's own kernels, the rest.

`--thin` times the model's thin twin instead: every layer, op and head grouping kept (query heads per key head, head
dim), but one key head, the hidden size its query heads need (SmolLM2: 3 x 64), intermediate size 64, a vocabulary of
256, random weights. Its ~16 MB of float32 weights stay in the last-level cache, so its forward's time is what a
compiled forward costs besides streaming its weights from memory: the custom ops' calls, the graph's kernels, the
engine's and dynamo's Python, the attention over the cache. The embedded model's stream moves 10-40% between
sittings on these VMs; this floor far less, so a change to the step's host side shows here (benchmarks/RESULTS-cpu.md,
stop 68).

    python benchmarks/compiled_ops.py [--model smollm2-135m] [--dtype float32] [--widths 1,8,16] [--kv-length 512]
        [--repeats 20] [--top 12] [--thin]

Quiet machine only (nothing else running): the numbers are per-forward milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import defaultdict

import torch

from specbench.core.batch.ragged import Segment
from specbench.core.batch.static import StaticSequence
from specbench.core.model import compile as cc
from specbench.core.model.load import load_model


def kind(name: str) -> str:
    lowered = name.lower()
    if any(word in lowered for word in ("linear", "panels", "mkldnn", "addmm")) or lowered.endswith("mm"):
        return "linear"
    if "attention" in lowered or "sdpa" in lowered or "flash" in lowered:
        return "attention"
    if "specbench::" in lowered:
        return "custom-op hop"
    if "cpp_fused" in lowered or "kernel" in lowered:
        return "graph kernels"
    return "other"


THIN = {"intermediate_size": 64, "vocab_size": 256, "num_key_value_heads": 1}


def thin_twin(config) -> str:
    """`random:` spec of --thin's twin of `config` (module docstring), its JSON written to a temporary file."""
    fields = config.to_dict()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    group = config.num_attention_heads // (config.num_key_value_heads or config.num_attention_heads)
    fields.update(THIN, num_attention_heads=group, head_dim=head_dim, hidden_size=group * head_dim)
    for token in ("bos_token_id", "eos_token_id", "pad_token_id"):  # ids past the twin's vocabulary: none
        if isinstance(fields.get(token), int) and fields[token] >= THIN["vocab_size"]:
            fields[token] = None
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as file:
        json.dump(fields, file)
    return f"random:{file.name}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--widths", default="1,8,16")
    ap.add_argument("--kv-length", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--thin", action="store_true", help="time the model's thin twin: the fixed cost alone")
    args = ap.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    target = load_model(args.model, dtype=args.dtype, device="cpu")
    if args.thin:
        spec = thin_twin(target.model.config)
        target = load_model(spec, dtype=args.dtype, device="cpu")
        os.unlink(spec.removeprefix("random:"))
    model = target.model
    vocab = model.config.vocab_size
    state = cc.enable(model, cc._round(args.kv_length + max(widths) + 8))
    state.buckets[(False, False, False)] = list(widths)
    engine = StaticSequence(model, state)
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        engine.forward([Segment(0, torch.randint(0, vocab, (args.kv_length,), generator=gen).tolist(), keep=1)], [])
        inputs = {w: torch.randint(0, vocab, (w,), generator=gen).tolist() for w in widths}

        def once(w: int) -> None:
            length = engine.lengths[0]
            engine.forward([], [Segment(0, inputs[w])])
            engine.truncate(0, length)

        for w in widths:  # compile every width first
            once(w)
        state.frozen = True
        for w in widths:
            for _ in range(3):
                once(w)
            t0 = time.perf_counter()
            for _ in range(args.repeats):
                once(w)
            wall = (time.perf_counter() - t0) / args.repeats * 1e3
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                for _ in range(args.repeats):
                    once(w)
            per_kind: dict[str, float] = defaultdict(float)
            rows = []
            for event in prof.key_averages():
                ms = event.self_cpu_time_total / 1e3 / args.repeats
                per_kind[kind(event.key)] += ms
                rows.append((ms, event.count // args.repeats, event.key))
            print(f"\nwidth {w}: {wall:.2f} ms a forward (unprofiled); self CPU per forward, profiled:")
            for name, ms in sorted(per_kind.items(), key=lambda kv: -kv[1]):
                print(f"  {name:14s} {ms:7.2f} ms")
            for ms, count, key in sorted(rows, reverse=True)[:args.top]:
                print(f"    {ms:7.2f} ms  {count:4d} calls  {key[:90]}")
    cc.disable(model)


if __name__ == "__main__":
    main()
