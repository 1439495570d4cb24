"""The report's plots: grouped bars per dataset (speedup, tokens/s, tau) and the tree-size sweep."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from .titles import set_title  # noqa: E402


def plot_bars(summary: pd.DataFrame, column: str, ylabel: str, path: Path, baseline: float | None = None,
              title: str = "") -> None:
    """Grouped bars: one group per dataset, one bar per method (plus a label column for compared runs); the value
    of each bar above it, the legend outside the axes on the right so that it covers no bar or label."""
    label = "label" if "label" in summary else "method"
    pivot = summary.pivot_table(index="dataset", columns=label, values=column, aggfunc="first", sort=False)
    width = max(5, 1.4 * len(pivot) * max(1, len(pivot.columns)) / 2)
    fig, ax = plt.subplots(figsize=(width, 3.6))
    pivot.plot.bar(ax=ax, rot=0, width=0.8)
    if baseline is not None:
        ax.axhline(baseline, color="grey", linestyle="--", linewidth=1)
    ax.set_ylabel(ylabel)
    ax.set_xlabel("")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, frameon=False)
    for container in ax.containers:
        ax.bar_label(container, labels=[f"{v:.2f}" if math.isfinite(v) else "" for v in container.datavalues],
                     fontsize=7, padding=2)
    top = pd.to_numeric(pivot.stack(), errors="coerce").max() if pivot.size else math.nan
    if math.isfinite(top) and top > 0:
        ax.set_ylim(top=max(ax.get_ylim()[1], top * 1.12))  # headroom for the value labels
    set_title(ax, title, width)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")  # "tight" keeps the outside legend in the image
    plt.close(fig)


def write_plots(summary: pd.DataFrame, out: Path, title: str = "") -> list[Path]:
    """speedup.png, tokens_per_s.png and tau.png in `out`, each titled `title` (plot_title / comparison_title)."""
    paths = [out / "speedup.png", out / "tokens_per_s.png", out / "tau.png"]
    plot_bars(summary, "speedup", "speedup over ar (total tokens / total time)", paths[0], baseline=1.0, title=title)
    plot_bars(summary, "tokens_per_s", "tokens / s", paths[1], title=title)
    plot_bars(summary, "tau", "tau (tokens per target forward)", paths[2], baseline=1.0, title=title)
    return paths


def plot_tree_sizes(frame: pd.DataFrame, path: Path, title: str = "") -> None:
    """tree_sizes.png: measured speedup per tree size (one line per dataset) beside the predicted one (PPD Fig. 8c);
    `frame` is tree_section's table (dataset, size, speedup, predicted_speedup)."""
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for dataset, g in frame.groupby("dataset"):
        ax.plot(g["size"], g["speedup"], marker="o", label=f"measured ({dataset})")
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
