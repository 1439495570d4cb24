"""Throughput against latency over batch sizes (a `--batch-size` sweep): per dataset, every method x batching mode is a line
through its batch sizes with x = total tokens/s (throughput: what the server emits) and y = tokens/s per sample
(latency: what one request sees), and the Pareto front over all of them is marked: the points no other point beats
on both axes. Computed from summary.csv rows only (pareto.csv, pareto.png).

Tokens/s per sample is summary.csv's `sample_tokens_per_s`: each sample's new tokens over its own time in its batch
(from joining it to its last token, prefill included), pooled over samples. Summaries from before that column
fall back to tokens_per_s / B (marked `per_sample_from` = "total / B").
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from ..run import noise  # noqa: E402
from .titles import set_title  # noqa: E402

COLUMNS = ["dataset", "method", "mode", "B", "tokens_per_s", "sample_tokens_per_s", "per_sample_from", "speedup",
           "speedup_lo", "speedup_hi", "timing", "pareto"]


def pareto_front(xs: list[float], ys: list[float]) -> list[bool]:
    """For each point (x, y), both to be maximised: True when no other point is at least as good on both axes and
    better on one. NaN points are never on the front; equal points are both on it."""
    out = []
    for i, (x, y) in enumerate(zip(xs, ys)):
        if not (math.isfinite(x) and math.isfinite(y)):
            out.append(False)
            continue
        beaten = any(j != i and math.isfinite(a) and math.isfinite(b) and a >= x and b >= y and (a > x or b > y)
                     for j, (a, b) in enumerate(zip(xs, ys)))
        out.append(not beaten)
    return out


def points(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per dataset x method x mode x batch size (COLUMNS), with the Pareto front per dataset. A batch-1 row
    (batching "-", one prompt at a time) starts the line of every mode its method runs in at B > 1."""
    s = summary.assign(B=pd.to_numeric(summary.batch_size, errors="coerce").fillna(1).astype(int))
    per_sample = pd.to_numeric(s["sample_tokens_per_s"], errors="coerce") if "sample_tokens_per_s" in s \
        else pd.Series(math.nan, index=s.index)
    measured = per_sample.notna()
    s = s.assign(sample=per_sample.where(measured, s.tokens_per_s / s.B),
                 per_sample_from=measured.map({True: "measured", False: "total / B"}))
    for column in ("speedup_lo", "speedup_hi"):  # summaries from before the interval: NaN, no error bar
        s[column] = pd.to_numeric(s[column], errors="coerce") if column in s else math.nan
    if "timing" not in s:
        s["timing"] = ""
    rows = []
    for (dataset, method), part in s.groupby(["dataset", "method"], sort=False):
        modes = [m for m in dict.fromkeys(part.batching) if m != "-"] or ["-"]
        for r in part.itertuples(index=False):
            for mode in (modes if r.batching == "-" else [r.batching]):
                rows.append({"dataset": dataset, "method": method, "mode": mode, "B": r.B,
                             "tokens_per_s": float(r.tokens_per_s), "sample_tokens_per_s": float(r.sample),
                             "per_sample_from": r.per_sample_from, "speedup": float(r.speedup),
                             "speedup_lo": float(r.speedup_lo), "speedup_hi": float(r.speedup_hi),
                             "timing": str(r.timing), "pareto": False})
    frame = pd.DataFrame(rows, columns=COLUMNS).sort_values(["dataset", "method", "mode", "B"], kind="stable")
    for dataset, part in frame.groupby("dataset", sort=False):
        frame.loc[part.index, "pareto"] = pareto_front(list(part.tokens_per_s), list(part.sample_tokens_per_s))
    return frame.reset_index(drop=True)


def plot(frame: pd.DataFrame, path: Path, title: str = "") -> None:
    """One panel per dataset: a line per method x mode through its batch sizes (each point labelled B=...), the
    Pareto front ringed in black and joined by a dashed line. Horizontal error bars: the speedup's 95% interval
    carried to the throughput axis (ar's throughput at that B times speedup_lo / speedup_hi; ar's own points, the
    reference, have none); a point whose timing the noise guard distrusts is crossed in red."""
    datasets = list(dict.fromkeys(frame.dataset))
    fig, axes = plt.subplots(1, len(datasets), figsize=(6 * len(datasets), 4.4), squeeze=False)
    for ax, dataset in zip(axes[0], datasets):
        part = frame[frame.dataset == dataset]
        colours = {m: f"C{i % 10}" for i, m in enumerate(dict.fromkeys(part.method))}
        labelled = set()  # a batch-1 point starts every mode's line: label it once
        for (method, mode), line in part.groupby(["method", "mode"], sort=False):
            line = line.sort_values("B")
            style = "--s" if mode == "padded" else "-o"
            ax.plot(line.tokens_per_s, line.sample_tokens_per_s, style, color=colours[method], markersize=4,
                    label=method if mode == "-" else f"{method} {mode}")
            scale = line.tokens_per_s / line.speedup  # ar's throughput at each B
            left = (line.tokens_per_s - scale * line.speedup_lo).clip(lower=0)
            right = (scale * line.speedup_hi - line.tokens_per_s).clip(lower=0)
            if (left + right).fillna(0).gt(0).any():
                ax.errorbar(line.tokens_per_s, line.sample_tokens_per_s, xerr=[left.fillna(0), right.fillna(0)],
                            fmt="none", ecolor=colours[method], elinewidth=0.8, capsize=2, alpha=0.8)
            for r in line.itertuples(index=False):
                if (method, r.B, r.tokens_per_s) in labelled:
                    continue
                labelled.add((method, r.B, r.tokens_per_s))
                ax.annotate(f"B={r.B}", (r.tokens_per_s, r.sample_tokens_per_s), textcoords="offset points",
                            xytext=(4, 3), fontsize=6, color=colours[method])
        front = part[part.pareto].drop_duplicates(["method", "B"]).sort_values("tokens_per_s")
        ax.plot(front.tokens_per_s, front.sample_tokens_per_s, ":", color="black", linewidth=1)
        ax.scatter(front.tokens_per_s, front.sample_tokens_per_s, s=90, facecolors="none", edgecolors="black",
                   linewidths=1, label="Pareto front", zorder=3)
        bad = part[part.timing.map(noise.is_disturbed)].drop_duplicates(["method", "B"])
        if len(bad):
            ax.scatter(bad.tokens_per_s, bad.sample_tokens_per_s, s=70, marker="x", color="firebrick",
                       linewidths=1.5, label="timing disturbed", zorder=4)
        ax.set_xlabel("throughput: total tokens/s (all samples)")
        ax.set_ylabel("latency: tokens/s per sample")
        ax.set_title(dataset, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, frameon=False)
    set_title(axes[0][0], title, 6 * len(datasets))
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
