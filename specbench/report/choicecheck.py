"""Is the tool's own per-batch-size choice as fast as the best one measured? For a tree-size sweep that includes
`auto` (`run -m ppd --tree-sizes auto,2,4,8,16 --batch-size 1,2,4`): per dataset, batch size and mode, the
throughput of <method>@auto (the tree `--tree auto` chose for that B from L(B, w)) against the best <method>@<size>
measured beside it, and whether it is within 5% (the bar a per-batch-size choice should meet). From pareto.points and run.yaml's `chosen`.

The verdict judges the choice, i.e. the tree size: when the sweep also ran the chosen size (<method>@<size> builds
its tree of that size from the same acceptance file as `--tree auto`'s search, so both labels decode with the same
tree: run.yaml's `trees` shows the same predicted tau), that size has two measurements and their gap is the run's
noise between identical configurations; each size's throughput is then the mean of its
measurements, and the chosen size is compared with the best size. `auto / best` keeps the raw single-label ratio.
"""

from __future__ import annotations

import math

import pandas as pd

TOLERANCE = 0.05  # the goal: the choice within 5% of the best measured

COLUMNS = ["dataset", "method", "B", "mode", "auto size", "auto tok/s", "best measured", "best tok/s",
           "auto / best", "same size tok/s", "best size", "chosen size / best size", "verdict"]


def _auto_size(chosen: dict, trees: dict, label: str, size: int):
    per = ((chosen or {}).get(label) or {}).get("tree_per_batch_size") or {}
    entry = per.get(size) or per.get(str(size))
    if entry:
        return entry.get("size")
    return ((trees or {}).get(label) or {}).get("size")  # batch 1 (or every B when it chose one tree)


def _verdict(is_best: bool, ratio: float, best_word: str) -> str:
    return best_word if is_best else f"within {TOLERANCE:.0%}" if ratio >= 1 - TOLERANCE else f"{1 - ratio:.0%} slower"


def _by_size(part: pd.DataFrame, auto: str, chosen_size) -> dict:
    """Tree size -> mean tokens/s of its labels in one dataset x B x mode group (<method>@auto counts as the size it
    chose; labels whose suffix is not a size are left out)."""
    sizes: dict = {}
    for label, tps in zip(part.method.astype(str), part.tokens_per_s):
        suffix = label.rsplit("@", 1)[-1]
        key = chosen_size if label == auto else int(suffix) if suffix.isdigit() else None
        if key is not None and not pd.isna(tps):
            sizes.setdefault(key, []).append(float(tps))
    return {k: sum(v) / len(v) for k, v in sizes.items()}


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
            mine_tps = float(own.tokens_per_s.iloc[0])
            ratio = mine_tps / best.tokens_per_s if best.tokens_per_s > 0 else math.nan
            chosen_size = _auto_size(chosen, trees, auto, int(size))
            by_size = _by_size(part, auto, chosen_size)
            twin = part[part.method == f"{base}@{chosen_size}"]
            if chosen_size in by_size:
                best_size = max(by_size, key=lambda k: (by_size[k], k == chosen_size))
                size_ratio = by_size[chosen_size] / by_size[best_size] if by_size[best_size] > 0 else math.nan
                verdict = _verdict(best_size == chosen_size, size_ratio, "best size")
            else:  # the chosen size is unknown (older run.yaml): judge the auto label alone
                best_size, size_ratio = None, ratio
                verdict = _verdict(best.method == auto, ratio, "best")
            rows.append({"dataset": dataset, "method": base, "B": int(size), "mode": "-" if size == 1 else mode,
                         "auto size": chosen_size, "auto tok/s": mine_tps, "best measured": best.method,
                         "best tok/s": best.tokens_per_s, "auto / best": ratio,
                         "same size tok/s": float(twin.tokens_per_s.iloc[0]) if len(twin) else math.nan,
                         "best size": best_size, "chosen size / best size": size_ratio, "verdict": verdict})
    return pd.DataFrame(rows, columns=COLUMNS)


def section(points: pd.DataFrame, chosen: dict | None, trees: dict | None) -> tuple[pd.DataFrame, list[str]]:
    """(the table, report.md's lines: [] when no sweep ran `auto` beside sizes)."""
    from .markdown import markdown_table

    frame = check(points, chosen, trees)
    if frame.empty:
        return frame, []
    missed = frame[~frame.verdict.isin(["best", "best size", f"within {TOLERANCE:.0%}"])]
    said = (f"**{len(missed)} of {len(frame)}** choices are more than {TOLERANCE:.0%} below the best measured size"
            if len(missed) else f"every choice is within {TOLERANCE:.0%} of the best measured size")
    twins = frame.dropna(subset=["same size tok/s"])
    gaps = (twins["auto tok/s"] / twins["same size tok/s"] - 1).abs()
    noise = (f" The chosen size also ran as its own label in {len(twins)} of {len(frame)} rows: the same tree measured "
             f"twice differed by up to {gaps.max():.0%} (median {gaps.median():.0%}), the noise of this run between "
             "identical configurations; a gap to the best smaller than that is not a finding." if len(twins) else "")
    return frame, ["### The tool's choice against the sweep", "",
                   "`<method>@auto` decodes each batch size with the tree `--tree auto` chose for it (from this "
                   "hardware's L(B, w) when the profile has B, else batch 1's); the sizes swept beside it are what it "
                   f"could have chosen. `auto / best`: its throughput over the best label's at that B and mode. The "
                   "verdict judges the size chosen: each size's throughput is the mean of its labels (`auto` counts as "
                   f"its size; `same size tok/s` is the swept label of that size), `chosen size / best size` the "
                   f"chosen size's over the best size's: {said}.{noise}",
                   "", markdown_table(frame), "", "[choice_check.csv](choice_check.csv)", ""]
