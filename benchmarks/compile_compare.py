"""Eager against `--compile`, every method (issue 44 §3): two runs of the same methods, prompts and settings, one
eager and one compiled (a run is one or the other throughout), read side by side.

Per method and dataset (batch 1 rows of each run's summary.csv): tok/s and speedup over that run's own `ar` in each
run, compiled tok/s over eager tok/s, the compiled run's distance to the roofline and host overhead, the timing
verdicts, and how many generations gave the same tokens in both runs (tokens.jsonl). The compiled run's
`compile:` block is summed (shapes, seconds, forwards run eagerly after warm-up).

Also, per method and batch size of the compiled run, its compiled and eager decode forwards (summary.csv's
compiled_forwards / eager_forwards: "fully" where none ran eagerly). With `--goal-ar X` it exits 1 unless the
compiled `ar` runs at least X times the eager `ar`'s tok/s on every dataset (benchmarks/gpu_pass.sh: CUDA graphs'
goal of 3).

Usage: python benchmarks/compile_compare.py EAGER_RUN_DIR COMPILED_RUN_DIR [--goal-ar X]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import yaml


def _tokens(run: Path) -> dict[tuple, list[int]]:
    out = {}
    for line in (run / "tokens.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("batch_size", 1) == 1:
            out[(row["method"], row["dataset"], str(row["prompt_id"]), row["turn"])] = row["tokens"]
    return out


def table(eager: Path, compiled: Path) -> pd.DataFrame:
    cols = ["method", "dataset", "tokens_per_s", "speedup", "timing", "of_roofline", "host_overhead"]
    a = pd.read_csv(eager / "summary.csv")
    b = pd.read_csv(compiled / "summary.csv")
    a, b = a[a.batch_size == 1][cols], b[b.batch_size == 1][cols]
    df = a.merge(b, on=["method", "dataset"], suffixes=("_eager", "_compiled"))
    df["compiled_over_eager"] = (df.tokens_per_s_compiled / df.tokens_per_s_eager).round(3)
    ta, tb = _tokens(eager), _tokens(compiled)
    same = {}
    for key, toks in tb.items():
        m = same.setdefault(key[:2], [0, 0])
        m[0] += ta.get(key) == toks
        m[1] += key in ta
    df["same_tokens"] = [f"{same.get((m, d), [0, 0])[0]}/{same.get((m, d), [0, 0])[1]}"
                         for m, d in zip(df.method, df.dataset)]
    return df[["method", "dataset", "tokens_per_s_eager", "speedup_eager", "tokens_per_s_compiled",
               "speedup_compiled", "compiled_over_eager", "of_roofline_eager", "of_roofline_compiled",
               "host_overhead_compiled", "timing_eager", "timing_compiled", "same_tokens"]]


def compile_summary(compiled: Path) -> str:
    meta = yaml.safe_load((compiled / "run.yaml").read_text()) or {}
    parts = []
    for role, block in (meta.get("compile") or {}).items():
        parts.append(f"{role}: {len(block.get('shapes', []))} shapes in {block.get('seconds', 0):.1f} s "
                     f"(buckets {block.get('buckets')}, cache {block.get('capacity')}), "
                     f"{block.get('eager_steps', 0)} forwards eager after warm-up")
    return "; ".join(parts) or "no compile block"


def fully_compiled(compiled: Path) -> pd.DataFrame:
    """Per method and batch size of the compiled run: compiled and eager decode forwards, and whether it ran fully
    compiled (no eager forward)."""
    b = pd.read_csv(compiled / "summary.csv")
    if "compiled_forwards" not in b:
        return pd.DataFrame(columns=["method", "batch_size", "compiled_forwards", "eager_forwards", "fully"])
    g = b.groupby(["method", "batch_size"], as_index=False)[["compiled_forwards", "eager_forwards"]].sum()
    g["fully"] = (g.eager_forwards == 0) & (g.compiled_forwards > 0)
    return g


def ar_goal(df: pd.DataFrame, goal: float) -> tuple[bool, str]:
    """(met, words): compiled ar's tok/s over eager ar's on every dataset against `goal`."""
    ar = df[df.method == "ar"]
    if ar.empty:
        return False, "no ar rows in both runs"
    ratios = dict(zip(ar.dataset, ar.compiled_over_eager))
    met = all(r >= goal for r in ratios.values())
    said = ", ".join(f"{d} {r:.2f}x" for d, r in ratios.items())
    return met, f"compiled ar over eager ar: {said} (goal {goal}x: {'met' if met else 'NOT met'})"


def main() -> None:
    args = sys.argv[1:]
    goal = None
    if "--goal-ar" in args:
        i = args.index("--goal-ar")
        goal = float(args[i + 1])
        args = args[:i] + args[i + 2:]
    if len(args) != 2:
        sys.exit(__doc__)
    eager, compiled = Path(args[0]), Path(args[1])
    df = table(eager, compiled)
    with pd.option_context("display.width", 250, "display.max_columns", 20):
        print(df.to_string(index=False))
        print(fully_compiled(compiled).to_string(index=False))
    print(compile_summary(compiled))
    if goal is not None:
        met, said = ar_goal(df, goal)
        print(said)
        if not met:
            sys.exit(1)


if __name__ == "__main__":
    main()
