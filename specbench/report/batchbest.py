"""The sweep's verdict per batch size: which method (in which batching mode) emits the most tokens per second at each
B, its speedup over `ar` at the same B, tokens/s per sample, the runner-up, and what the method chose for that
batch size itself (tree size or gamma from L(B, w): run.yaml's `chosen`). Computed from pareto.points (summary.csv
rows only) and run.yaml; batch_fastest.csv and report.md's table.
"""

from __future__ import annotations

import math

import pandas as pd

COLUMNS = ["dataset", "B", "fastest", "mode", "tok/s", "tok/s per sample", "speedup vs ar at B", "ar tok/s",
           "its choice at B", "runner-up", "runner-up tok/s", "timing"]


def choice_at(chosen: dict, method: str, size: int) -> str:
    """What `method` chose for batch size `size` itself (run.yaml's chosen): "tree size 6 (L(B, w))", "gamma 3", or
    its one setting for every B; "" when it chose nothing."""
    mine = (chosen or {}).get(method) or {}
    trees = mine.get("tree_per_batch_size") or {}
    tree = trees.get(size) or trees.get(str(size))
    if tree:
        return f"tree size {tree.get('size')} ({tree.get('from')})"
    gammas = mine.get("gamma_per_batch_size") or {}
    gamma = gammas.get(size, gammas.get(str(size)))
    if gamma is not None:
        return f"gamma {gamma}"
    return f"gamma {mine['gamma']}" if "gamma" in mine else ""


def fastest(points: pd.DataFrame, summary: pd.DataFrame, chosen: dict | None = None) -> pd.DataFrame:
    """One row per dataset x batch size: the label with the highest throughput (a batch-1 row counts once), its
    speedup against ar at that B, the runner-up and its own choice at B (COLUMNS)."""
    timing = {}
    if "timing" in summary:
        for r in summary.itertuples(index=False):
            size = int(pd.to_numeric(getattr(r, "batch_size", 1), errors="coerce") or 1)
            # the verdict's first word (ok / disturbed); its reason is in the summary and the timing section
            timing[(r.dataset, r.method, size, str(getattr(r, "batching", "-")))] = str(r.timing).split(":")[0]
    rows = []
    unique = points.drop_duplicates(["dataset", "method", "B", "tokens_per_s"])  # batch 1: one row, not one per mode
    for (dataset, size), part in unique.groupby(["dataset", "B"], sort=True):
        ranked = part.sort_values("tokens_per_s", ascending=False, kind="stable")
        ranked = ranked[ranked.tokens_per_s.map(lambda v: math.isfinite(v))]
        if ranked.empty:
            continue
        best, second = ranked.iloc[0], (ranked.iloc[1] if len(ranked) > 1 else None)
        ar = part[part.method == "ar"]
        mode = "-" if size == 1 else best["mode"]
        rows.append({"dataset": dataset, "B": int(size), "fastest": best.method, "mode": mode,
                     "tok/s": best.tokens_per_s, "tok/s per sample": best.sample_tokens_per_s,
                     "speedup vs ar at B": best.speedup, "ar tok/s": float(ar.tokens_per_s.iloc[0]) if len(ar)
                     else math.nan, "its choice at B": choice_at(chosen or {}, best.method, int(size)),
                     "runner-up": "" if second is None else
                     (second.method if size == 1 else f"{second.method} {second['mode']}"),
                     "runner-up tok/s": math.nan if second is None else second.tokens_per_s,
                     "timing": timing.get((dataset, best.method, int(size), mode), "")})
    return pd.DataFrame(rows, columns=COLUMNS)


def shown(frame: pd.DataFrame) -> pd.DataFrame:
    """Display strings: speedups as 1.23x, rates to two decimals."""
    out = frame.copy()

    def number(v, fmt):
        return fmt.format(v) if isinstance(v, float) and math.isfinite(v) else "-"

    out["speedup vs ar at B"] = out["speedup vs ar at B"].map(lambda v: number(v, "{:.2f}x"))
    for col in ("tok/s", "tok/s per sample", "ar tok/s", "runner-up tok/s"):
        out[col] = out[col].map(lambda v: number(v, "{:.2f}"))
    return out
