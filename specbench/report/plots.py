"""The report's plots: grouped bars per dataset (speedup with its 95% interval, tokens/s, tau; disturbed and partial
rows marked) and the tree-size sweep."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from ..core.store import RunFolder  # noqa: E402
from ..run import noise  # noqa: E402
from .titles import set_title  # noqa: E402


DISTURBED_MARK, PARTIAL_MARK = "*", "\u2020"  # after a bar's value: timing disturbed / partial run (dagger)


def marks(frame: pd.DataFrame, timed: bool = True) -> pd.Series:
    """Per row: "*" when the noise guard distrusts its timing (only for a `timed` quantity: tau counts forwards,
    which load does not change), a dagger when it comes from a partial (interrupted) run (a `partial` column:
    run_report / compare_runs add it), both, or ""."""
    bad = frame.timing.map(noise.is_disturbed) if "timing" in frame and timed \
        else pd.Series(False, index=frame.index)
    partial = frame.partial.fillna(False).astype(bool) if "partial" in frame else pd.Series(False, index=frame.index)
    return bad.map({True: DISTURBED_MARK, False: ""}) + partial.map({True: PARTIAL_MARK, False: ""})


def footnote(shown: set[str], interval: bool) -> str:
    """The legend of the marks a plot uses (below the axes)."""
    said = ["error bars: 95% bootstrap interval of the speedup"] if interval else []
    if DISTURBED_MARK in shown:
        said.append(f"{DISTURBED_MARK} hatched: timing disturbed (noise guard), not trustworthy")
    if PARTIAL_MARK in shown:
        said.append(f"{PARTIAL_MARK} faded: partial run (interrupted)")
    return "; ".join(said)


def plot_bars(summary: pd.DataFrame, column: str, ylabel: str, path: Path, baseline: float | None = None,
              title: str = "", timed: bool = True) -> None:
    """Grouped bars: one group per dataset, one bar per method (plus a label column for compared runs); the value
    of each bar above it, the legend outside the axes on the right so that it covers no bar or label. The speedup
    carries its 95% interval as error bars (speedup_lo / speedup_hi); a disturbed row's bar is hatched, a partial
    run's faded, and their values marked (marks(), explained under the plot)."""
    label = "label" if "label" in summary else "method"
    frame = summary.assign(_mark=marks(summary, timed))
    pivot = frame.pivot_table(index="dataset", columns=label, values=column, aggfunc="first", sort=False)
    pivot = pivot.apply(pd.to_numeric, errors="coerce")
    if pivot.isna().all().all():  # nothing to draw (a server run without a baseline has no speedup): say so
        fig, ax = plt.subplots(figsize=(5, 1.2))
        ax.axis("off")
        ax.text(0.5, 0.5, f"no {column} in this run", ha="center", va="center")
        fig.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(fig)
        return

    def aligned(values: str) -> pd.DataFrame:  # another column laid out like `pivot` (NaN / "" where absent)
        table = frame.pivot_table(index="dataset", columns=label, values=values, aggfunc="first", sort=False,
                                  dropna=False)
        return table.reindex(index=pivot.index, columns=pivot.columns)

    mark = aligned("_mark").fillna("")
    interval = column == "speedup" and {"speedup_lo", "speedup_hi"} <= set(summary)
    low, high = (aligned(c).apply(pd.to_numeric, errors="coerce") for c in ("speedup_lo", "speedup_hi")) \
        if interval else (None, None)
    width = max(5, 1.4 * len(pivot) * max(1, len(pivot.columns)) / 2)
    fig, ax = plt.subplots(figsize=(width, 3.6))
    pivot.plot.bar(ax=ax, rot=0, width=0.8)
    bars = list(ax.containers)  # one per column of pivot, a patch per dataset (before error bars add theirs)
    if baseline is not None:
        ax.axhline(baseline, color="grey", linestyle="--", linewidth=1)
    ax.set_ylabel(ylabel)
    ax.set_xlabel("")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, frameon=False)
    top = pd.to_numeric(pivot.stack(), errors="coerce").max() if pivot.size else math.nan
    for i, container in enumerate(bars):
        for j, patch in enumerate(container.patches):
            sign = mark.iloc[j, i]
            if DISTURBED_MARK in sign:
                patch.set_hatch("///")
                patch.set_edgecolor("firebrick")
            if PARTIAL_MARK in sign:
                patch.set_alpha(0.45)
            value, centre = float(pivot.iloc[j, i]), patch.get_x() + patch.get_width() / 2
            if not math.isfinite(value):
                continue
            above = value  # the value label sits above the bar, or above its error bar
            if interval:
                lo, hi = low.iloc[j, i], high.iloc[j, i]
                if math.isfinite(lo) and math.isfinite(hi) and hi > lo:
                    ax.errorbar(centre, value, yerr=[[max(value - lo, 0)], [max(hi - value, 0)]], fmt="none",
                                ecolor="black", elinewidth=0.9, capsize=3)
                    above = max(value, hi)
                    top = max(top, hi) if math.isfinite(top) else hi
            ax.annotate(f"{value:.2f}{sign}", (centre, above), xytext=(0, 2), textcoords="offset points",
                        ha="center", va="bottom", fontsize=7)
    if math.isfinite(top) and top > 0:
        ax.set_ylim(top=max(ax.get_ylim()[1], top * 1.12))  # headroom for the value labels
    note = footnote(set("".join(mark.to_numpy().ravel())), interval and low.notna().to_numpy().any())
    if note:
        ax.annotate(note, (0, 0), xycoords="axes fraction", xytext=(0, -22), textcoords="offset points",
                    fontsize=7, va="top", color="dimgrey")
    set_title(ax, title, width)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")  # "tight" keeps the outside legend and the note in the image
    plt.close(fig)


def write_plots(summary: pd.DataFrame, out: Path, title: str = "") -> list[Path]:
    """speedup.png, tokens_per_s.png and tau.png in `out`, each titled `title` (plot_title / comparison_title)."""
    paths = list(RunFolder(out).plots)
    plot_bars(summary, "speedup", "speedup over ar\n(total tokens / total time)", paths[0], baseline=1.0, title=title)
    plot_bars(summary, "tokens_per_s", "tokens / s", paths[1], title=title)
    plot_bars(summary, "tau", "tau (tokens per target forward)", paths[2], baseline=1.0, title=title, timed=False)
    return paths


def plot_tree_sizes(frame: pd.DataFrame, path: Path, title: str = "") -> None:
    """tree_sizes.png: measured speedup per tree size (one line per dataset, 95% intervals as error bars, disturbed
    sizes ringed in red) beside the predicted one (PPD Fig. 8c); `frame` is tree_section's table (dataset, size,
    speedup, speedup_lo, speedup_hi, timing, predicted_speedup)."""
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for dataset, g in frame.groupby("dataset"):
        y = pd.to_numeric(g["speedup"], errors="coerce")
        ends = [pd.to_numeric(g.get(c, pd.Series(math.nan, index=g.index)), errors="coerce") for c in
                ("speedup_lo", "speedup_hi")]
        ax.errorbar(g["size"], y, yerr=[(y - ends[0]).clip(lower=0).fillna(0), (ends[1] - y).clip(lower=0).fillna(0)],
                    marker="o", capsize=3, label=f"measured ({dataset})")
        bad = g.get("timing", pd.Series("", index=g.index)).map(noise.is_disturbed)
        if bad.any():
            ax.scatter(g["size"][bad], y[bad], s=110, facecolors="none", edgecolors="firebrick", linewidths=1.2,
                       zorder=3, label=f"timing disturbed ({dataset})")
    pred = frame.drop_duplicates("size")
    if pred["predicted_speedup"].notna().any():
        ax.plot(pred["size"], pred["predicted_speedup"], marker="x", linestyle="--", label="predicted")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xlabel("tree size n")
    ax.set_ylabel("speedup over ar")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, frameon=False)
    ax.grid(alpha=0.3)
    set_title(ax, title, 6)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
