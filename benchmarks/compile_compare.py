"""Eager against `--compile`, every method (issue 44 §3): two runs of the same methods, prompts and settings, one
eager and one compiled (a run is one or the other throughout), read side by side.

Per method and dataset (batch 1 rows of each run's summary.csv): tok/s and speedup over that run's own `ar` in each
run, compiled tok/s over eager tok/s, the compiled run's distance to the roofline and host overhead, the timing
verdicts, and how many generations gave the same tokens in both runs (tokens.jsonl). The compiled run's
`compile:` block is summed (shapes, seconds, forwards run eagerly after warm-up).

Usage: python benchmarks/compile_compare.py EAGER_RUN_DIR COMPILED_RUN_DIR
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


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    eager, compiled = Path(sys.argv[1]), Path(sys.argv[2])
    with pd.option_context("display.width", 250, "display.max_columns", 20):
        print(table(eager, compiled).to_string(index=False))
    print(compile_summary(compiled))


if __name__ == "__main__":
    main()
