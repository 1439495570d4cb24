"""Summaries, Markdown and plots, computed from result CSVs only (reports never re-run models).

Speedup formulas (both from the same run, same prompts, same machine):
  speedup       = (sum new_tokens / sum wall_s)_method / (sum new_tokens / sum wall_s)_ar   (headline)
  speedup_mean  = mean over prompt turns of tokens_per_s_method / tokens_per_s_ar
  tau           = sum new_tokens / sum target_forwards   (bonus token included; ar = 1.00)
  acceptance    = sum accepted_drafts / sum drafted
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import yaml  # noqa: E402

from ..errors import SpecbenchError  # noqa: E402
from . import timeline  # noqa: E402
from .markdown import markdown_table  # noqa: E402

FORMULAS = __doc__.split("Speedup formulas", 1)[1].strip()
SUMMARY_COLUMNS = ["method", "dataset", "prompts", "turns", "new_tokens", "wall_s", "tokens_per_s", "speedup",
                   "speedup_mean", "tau", "acceptance_rate", "lossless_rate", "exactness", "peak_mem_mb",
                   "extra_mem_mb"]


def read_records(run_dir: Path) -> pd.DataFrame:
    path = Path(run_dir) / "records.csv"
    if not path.exists():
        raise SpecbenchError(f"{run_dir}: no records.csv here; pass a folder written by `specbench run`.")
    try:
        df = pd.read_csv(path, dtype={"prompt_id": str, "lossless": str}, keep_default_na=False,
                         na_values={"acceptance_rate": [""], "tokens_per_s": [""]})
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise SpecbenchError(f"{path}: not a readable records CSV ({exc})") from exc
    missing = {"method", "dataset", "prompt_id", "turn", "new_tokens", "wall_s", "target_forwards"} - set(df)
    if missing:
        raise SpecbenchError(f"{path}: missing columns {', '.join(sorted(missing))}")
    return df


def _exactness(method: str) -> str:
    from ..methods import REGISTRY

    cls = REGISTRY.get(method.split("@")[0])  # sweep labels: <method>@<tree size>
    return "" if cls is None else ("lossless" if cls.lossless else "lossy")


def summarize(records: pd.DataFrame, temperature_greedy: bool = True) -> pd.DataFrame:
    """One row per method x dataset (SUMMARY_COLUMNS)."""
    rows = []
    ar = records[records.method == "ar"].set_index(["dataset", "prompt_id", "turn"])
    for (method, dataset), g in records.groupby(["method", "dataset"], sort=False):
        ar_d = records[(records.method == "ar") & (records.dataset == dataset)]
        ar_tps = ar_d.new_tokens.sum() / ar_d.wall_s.sum() if len(ar_d) and ar_d.wall_s.sum() > 0 else math.nan
        tps = g.new_tokens.sum() / g.wall_s.sum() if g.wall_s.sum() > 0 else math.nan
        joined = g.merge(ar[["tokens_per_s"]].reset_index(), on=["dataset", "prompt_id", "turn"],
                         suffixes=("", "_ar"))
        ratios = joined.tokens_per_s / joined.tokens_per_s_ar
        checked = g.lossless[g.lossless.astype(str) != ""]
        drafted = g.drafted.sum() if "drafted" in g else 0
        peak = g.peak_mem_mb.max() if "peak_mem_mb" in g else math.nan
        ar_peak = ar_d.peak_mem_mb.max() if "peak_mem_mb" in ar_d and len(ar_d) else math.nan
        rows.append({
            "method": method, "dataset": dataset, "prompts": g.prompt_id.nunique(), "turns": len(g),
            "new_tokens": int(g.new_tokens.sum()), "wall_s": round(g.wall_s.sum(), 3),
            "tokens_per_s": round(tps, 2), "speedup": round(tps / ar_tps, 3),
            "speedup_mean": round(ratios.mean(), 3) if ratios.notna().any() else math.nan,
            "tau": round(g.new_tokens.sum() / max(g.target_forwards.sum(), 1), 3),
            "acceptance_rate": round(g.accepted_drafts.sum() / drafted, 3) if drafted else math.nan,
            "lossless_rate": round((checked == "match").mean(), 3) if len(checked) else math.nan,
            "exactness": _exactness(method), "peak_mem_mb": peak,
            "extra_mem_mb": round(peak - ar_peak, 1) if not math.isnan(peak) and not math.isnan(ar_peak) else math.nan,
        })
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def plot_bars(summary: pd.DataFrame, column: str, ylabel: str, path: Path, baseline: float | None = None) -> None:
    """Grouped bars: one group per dataset, one bar per method (plus a label column for compared runs)."""
    label = "label" if "label" in summary else "method"
    pivot = summary.pivot_table(index="dataset", columns=label, values=column, aggfunc="first", sort=False)
    fig, ax = plt.subplots(figsize=(max(5, 1.4 * len(pivot) * max(1, len(pivot.columns)) / 2), 3.6))
    pivot.plot.bar(ax=ax, rot=0, width=0.8)
    if baseline is not None:
        ax.axhline(baseline, color="grey", linestyle="--", linewidth=1)
    ax.set_ylabel(ylabel)
    ax.set_xlabel("")
    ax.legend(fontsize=8, ncols=min(4, len(pivot.columns)))
    for container in ax.containers:
        ax.bar_label(container, fmt="%.2f", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_plots(summary: pd.DataFrame, out: Path) -> list[Path]:
    paths = [out / "speedup.png", out / "tokens_per_s.png", out / "tau.png"]
    plot_bars(summary, "speedup", "speedup over ar (total tokens / total time)", paths[0], baseline=1.0)
    plot_bars(summary, "tokens_per_s", "tokens / s", paths[1])
    plot_bars(summary, "tau", "tau (tokens per target forward)", paths[2], baseline=1.0)
    return paths


def write_run_report(run_dir: Path) -> pd.DataFrame:
    """summary.csv, report.md and plots for one run folder; returns the summary."""
    run_dir = Path(run_dir)
    records = read_records(run_dir)
    if records.empty:
        raise SpecbenchError(f"{run_dir}: the run has no results yet (every prompt was skipped or none finished).")
    summary = summarize(records)
    summary.to_csv(run_dir / "summary.csv", index=False)
    write_plots(summary, run_dir)
    meta = {}
    if (run_dir / "run.yaml").exists():
        meta = yaml.safe_load((run_dir / "run.yaml").read_text()) or {}
    md = [f"# specbench run: {run_dir.name}", ""]
    if meta.get("environment"):
        md += ["## Environment", ""] + [f"- {k}: {v}" for k, v in meta["environment"].items()] + [""]
    if meta.get("model"):
        md += [f"- model: {meta['model'].get('name')} ({meta['model'].get('source')})", ""]
    if meta.get("settings"):
        s = meta["settings"]
        md += ["## Settings", ""] + [f"- {k}: {v}" for k, v in s.items() if k != "options"]
        md += [f"- options: {s.get('options')}", ""]
    md += ["## Summary", "", markdown_table(summary), ""]
    md += ["Lossy methods (typical acceptance) are labelled `lossy`; `lossless_rate` is the share of greedy prompt "
           "turns whose tokens equal `ar`'s exactly (bf16/fp16 can flip near-ties).", ""]
    md += ["## Formulas", "", "```", FORMULAS, "```", ""]
    md += ["![speedup](speedup.png)", "![tokens per second](tokens_per_s.png)", "![tau](tau.png)", ""]
    md += tree_section(summary, meta.get("trees") or {}, run_dir)
    md += timeline.report_section(run_dir)  # sd / pearl runs: busy, idle, mutual waiting, Gantt PNGs
    (run_dir / "report.md").write_text("\n".join(md))
    return summary


def compare_runs(run_dirs: list[Path], out: Path) -> pd.DataFrame:
    """Side-by-side summary of several runs (a `label` column names each run folder)."""
    frames = []
    for d in run_dirs:
        s = write_run_report(Path(d))
        s.insert(0, "run", Path(d).name)
        frames.append(s)
    combined = pd.concat(frames, ignore_index=True)
    combined["label"] = combined.run + ":" + combined.method
    out.mkdir(parents=True, exist_ok=True)
    combined.drop(columns="label").to_csv(out / "comparison.csv", index=False)
    write_plots(combined, out)
    cols = ["run", "method", "dataset", "prompts", "tokens_per_s", "speedup", "speedup_mean", "tau",
            "lossless_rate", "exactness"]
    md = ["# specbench comparison", "", markdown_table(combined[cols]), "",
          "![speedup](speedup.png)", "![tokens per second](tokens_per_s.png)", "![tau](tau.png)", ""]
    (out / "summary.md").write_text("\n".join(md))
    return combined


def below_threshold(summary: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """Non-baseline rows whose headline speedup is below the threshold (a CI gate)."""
    rows = summary[(summary.method != "ar") & (summary.speedup < threshold)]
    return rows


def tree_section(summary: pd.DataFrame, trees: dict, run_dir: Path) -> list[str]:
    """Tree methods: measured vs predicted tau and speedup per tree (PPD Fig. 8c when a run swept sizes), with
    tree_sizes.png for a sweep."""
    rows = []
    for label, info in trees.items():
        for _, r in summary[summary.method == label].iterrows():
            rows.append({"method": label, "dataset": r.dataset, "size": info.get("size"),
                         "predicted_tau": info.get("predicted_tau"), "tau": r.tau,
                         "predicted_speedup": info.get("predicted_speedup"), "speedup": r.speedup})
    if not rows:
        return []
    frame = pd.DataFrame(rows).sort_values(["dataset", "size"])
    frame.to_csv(run_dir / "tree_sizes.csv", index=False)
    profile = next((i.get("profile") for i in trees.values() if i.get("profile")), None)
    md = ["## Trees: measured vs predicted", "", markdown_table(frame), "",
          f"Predicted tau from the acceptance table; predicted speedup from the latency profile "
          f"{profile or '(none for this hardware: run `specbench profile`)'}.", ""]
    if frame["size"].nunique() >= 2:
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for dataset, g in frame.groupby("dataset"):
            ax.plot(g["size"], g["speedup"], marker="o", label=f"measured ({dataset})")
        pred = frame.drop_duplicates("size")
        if pred["predicted_speedup"].notna().any():
            ax.plot(pred["size"], pred["predicted_speedup"], marker="x", linestyle="--", label="predicted")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xlabel("tree size n")
        ax.set_ylabel("speedup over ar")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(run_dir / "tree_sizes.png", dpi=120)
        plt.close(fig)
        md += ["![speedup per tree size](tree_sizes.png)", ""]
    return md
