"""Benchmark: the native attention operator (core/model/native_attention_source.py) of a git revision against the
working tree's, paired, over a forward's worth of layers.

Builds both sources as libraries of their own (renamed C++ and operator namespaces, the native library's compiler
and flags), then times 30 calls a "forward" (one per layer, each on its own key / value cache, so
that the cache is read cold as a forward reads it) at each query width, the two alternating in pairs, their order
swapped every round: a machine whose bandwidth moves between sittings moves both alike. Prints, per width, the median
of the per-round ratios B / A (below 1: the working tree is faster), both medians, and whether the outputs are the
same bits. SmolLM2-135M's attention shape: 9 query heads, 3 key / value heads, head dim 64.

    python benchmarks/attention_ab.py [--base HEAD] [--dtype float32] [--rows 1,2,4,8,16] [--kv-length 512]
        [--rounds 60]

The AMX tiles' bfloat16 scores (native_attention_amx_source.py) are left out of both builds (they need the panels'
AMX helpers): on an AMX CPU this times the vector path. Quiet machine only (nothing else running).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from specbench.core.model import native_linear

ROOT = Path(__file__).resolve().parents[1]
FOLDER = "specbench/core/model/"
MODULES = ("native_vectors_source", "native_attention_amx_source", "native_attention_source")


def module_text(name: str, revision: str | None) -> str:
    """A source module's text at `revision`, or the working tree's (None)."""
    if revision is None:
        return (ROOT / FOLDER / f"{name}.py").read_text()
    done = subprocess.run(["git", "-C", str(ROOT), "show", f"{revision}:{FOLDER}{name}.py"], capture_output=True,
                          text=True, check=True)
    return done.stdout


def attention_source(revision: str | None) -> str:
    """The ATTENTION C++ string of that revision: its three modules run in order, each one's relative imports
    answered by the ones before it."""
    names: dict = {}
    for name in MODULES:
        lines = [line for line in module_text(name, revision).splitlines() if not line.startswith("from .")]
        exec(compile("\n".join(lines), name, "exec"), names)
    return names["ATTENTION"]


def build(source: str, tag: str, folder: Path):
    """The attention operator of `source` built as library `ab_<tag>` (native_linear.build_library: the native
    library's compiler and flags) and loaded; returns the op."""
    source = source.replace("specbench_attention", f"ab_attention_{tag}").replace("specbench_native", f"ab_{tag}")
    lib = folder / f"{tag}.so"
    native_linear.build_library(lib, source)
    torch.ops.load_library(str(lib))
    return getattr(torch.ops, f"ab_{tag}").attention


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="HEAD", help="the git revision timed as A")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--rows", default="1,2,4,8,16", help="query widths (tokens a forward)")
    ap.add_argument("--kv-length", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=60)
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    with tempfile.TemporaryDirectory() as folder:
        ops = {"A": build(attention_source(args.base), "A", Path(folder)),
               "B": build(attention_source(None), "B", Path(folder))}
    capacity, layers, lowest = args.kv_length + 128, 30, torch.finfo(dtype).min
    gen = torch.Generator().manual_seed(0)
    caches = [(torch.randn(1, 3, capacity, 64, generator=gen).to(dtype),
               torch.randn(1, 3, capacity, 64, generator=gen).to(dtype)) for _ in range(layers)]
    print(f"A = {args.base}, B = the working tree; {args.dtype}, KV {args.kv_length}, {layers} layers a forward")
    for width in (int(w) for w in args.rows.split(",")):
        query = torch.randn(1, 9, width, 64, generator=gen).to(dtype)
        mask = torch.full((1, 1, width, capacity), lowest, dtype=dtype)
        for i in range(width):  # causal over the cache, and a tree's holes on every third row
            mask[0, 0, i, : args.kv_length + i + 1] = 0
            if i % 3 == 1:
                mask[0, 0, i, args.kv_length + i - 1] = lowest
        same = torch.equal(ops["A"](query, *caches[0], mask, 0.125), ops["B"](query, *caches[0], mask, 0.125))

        def forward(op) -> float:
            start = time.perf_counter()
            for key, value in caches:
                op(query, key, value, mask, 0.125)
            return time.perf_counter() - start

        times: dict[str, list[float]] = {"A": [], "B": []}
        ratios = []
        for r in range(args.rounds):
            for tag in ("A", "B") if r % 2 == 0 else ("B", "A"):
                forward(ops[tag])  # one untimed: the caches as the other left them
                times[tag].append(forward(ops[tag]))
            ratios.append(times["B"][-1] / times["A"][-1])
        a_ms, b_ms = (statistics.median(times[tag]) * 1e3 for tag in ("A", "B"))
        print(f"width {width:3d}: B / A {statistics.median(ratios):.3f}   A {a_ms:.3f} ms   B {b_ms:.3f} ms   "
              f"same bits: {same}", flush=True)


if __name__ == "__main__":
    main()
