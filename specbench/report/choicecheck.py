"""Is the tool's own per-batch-size choice as fast as the best one measured? For a tree-size sweep that includes
`auto` (`run -m ppd --tree-sizes auto,2,4,8,16 --batch-size 1,2,4`): per dataset, batch size and mode, the
throughput of <method>@auto (the tree `--tree auto` chose for that B from L(B, w)) against the best <method>@<size>
measured beside it, and whether it is within 5% (issue 28's goal). From pareto.points and run.yaml's `chosen`.
"""

from __future__ import annotations

import math

import pandas as pd

TOLERANCE = 0.05  # the goal: the choice within 5% of the best measured

COLUMNS = ["dataset", "method", "B", "mode", "auto size", "auto tok/s", "best measured", "best tok/s",
           "auto / best", "verdict"]


def _auto_size(chosen: dict, trees: dict, label: str, size: int):
    per = ((chosen or {}).get(label) or {}).get("tree_per_batch_size") or {}
    entry = per.get(size) or per.get(str(size))
    if entry:
        return entry.get("size")
    return ((trees or {}).get(label) or {}).get("size")  # batch 1 (or every B when it chose one tree)


def check(points: pd.DataFrame, chosen: dict | None = None, trees: dict | None = None) -> pd.DataFrame:
    """One row per dataset x swept method x batch size x mode where <method>@auto ran beside sized labels."""
    labels = points.method.astype(str)
    autos = sorted({m for m in labels if m.endswith("@auto")})
    rows = []
    for auto in autos:
        base = auto.removesuffix("@auto")
        mine = points[labels.str.startswith(base + "@")]
        for (dataset, size, mode), part in mine.groupby(["dataset", "B", "mode"], sort=True):
            if size == 1 and mode == "padded" and (mine["mode"] == "unpadded").any():
                continue  # batch 1 is one row for both modes: once
            own = part[part.method == auto]
            if own.empty or not part.method.ne(auto).any():
                continue
            best = part.sort_values("tokens_per_s", ascending=False, kind="stable").iloc[0]
            ratio = float(own.tokens_per_s.iloc[0]) / best.tokens_per_s if best.tokens_per_s > 0 else math.nan
            verdict = ("best" if best.method == auto else
                       f"within {TOLERANCE:.0%}" if ratio >= 1 - TOLERANCE else f"{1 - ratio:.0%} slower")
            rows.append({"dataset": dataset, "method": base, "B": int(size), "mode": "-" if size == 1 else mode,
                         "auto size": _auto_size(chosen, trees, auto, int(size)),
                         "auto tok/s": float(own.tokens_per_s.iloc[0]), "best measured": best.method,
                         "best tok/s": best.tokens_per_s, "auto / best": ratio, "verdict": verdict})
    return pd.DataFrame(rows, columns=COLUMNS)


def section(points: pd.DataFrame, chosen: dict | None, trees: dict | None) -> tuple[pd.DataFrame, list[str]]:
    """(the table, report.md's lines: [] when no sweep ran `auto` beside sizes)."""
    from .markdown import markdown_table

    frame = check(points, chosen, trees)
    if frame.empty:
        return frame, []
    missed = frame[~frame.verdict.isin(["best", f"within {TOLERANCE:.0%}"])]
    said = (f"**{len(missed)} of {len(frame)}** choices are more than {TOLERANCE:.0%} below the best measured size"
            if len(missed) else f"every choice is within {TOLERANCE:.0%} of the best measured size")
    return frame, ["### The tool's choice against the sweep", "",
                   "`<method>@auto` decodes each batch size with the tree `--tree auto` chose for it (from this "
                   "hardware's L(B, w) when the profile has B, else batch 1's); the sizes swept beside it are what it "
                   f"could have chosen. `auto / best`: its throughput over the best label's at that B and mode: {said}.",
                   "", markdown_table(frame), "", "[choice_check.csv](choice_check.csv)", ""]
