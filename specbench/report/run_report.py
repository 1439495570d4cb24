"""The report files of a run folder (summary.csv, report.md, plots) and the comparison of several runs, computed
from result CSVs only (reports never re-run models). The numbers: summary.py; the lossless check: lossless_check.py;
report.md's other sections: sections.py, context.py (by prompt length); plots: plots.py."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..errors import SpecbenchError
from ..run.results import read_meta, with_batch_columns
from . import batchreport, context, timeline
from .lossless_check import LOSSLESS_TEXT, lossless_failed_section, unexplained_mismatches
from .markdown import markdown_table
from .plots import write_plots
from .sections import category_section, is_partial, noise_section, tree_section
from .shards import shard_section
from .summary import FORMULAS, named, read_records, summarize
from .titles import comparison_title, plot_title

# Importable from here as before (ci/, cli/, tests and benchmarks import them from report.report):
from .lossless_check import lossless_verdicts  # noqa: F401, E402
from .plots import plot_bars, plt  # noqa: F401, E402
from .summary import SUMMARY_COLUMNS, by_category, disturbed, row_name  # noqa: F401, E402


def write_run_report(run_dir: Path) -> pd.DataFrame:
    """summary.csv, report.md and plots for one run folder; returns the summary."""
    run_dir = Path(run_dir)
    records = read_records(run_dir)
    if records.empty:
        raise SpecbenchError(f"{run_dir}: the run has no results yet (every prompt was skipped or none finished).")
    meta = read_meta(run_dir)
    summary = summarize(records, latency_floor=(meta.get("noise_guard") or {}).get("latency_floor", 1.0))
    summary.to_csv(run_dir / "summary.csv", index=False)
    title = plot_title(meta, records)
    # one prompt at a time: bars, categories, trees; batch > 1 has its own section (batchreport.py)
    single = summary[summary.batch_size == 1] if (summary.batch_size == 1).any() else summary
    single_records = with_batch_columns(records)
    single_records = single_records[single_records.batch_size == 1] if len(single) < len(summary) else records
    write_plots(single, run_dir, title=title)
    md = [f"# specbench run: {run_dir.name}", ""]
    if is_partial(meta):
        md += ["**PARTIAL**: the run was interrupted; each method is compared with ar on the prompt turns both "
               "finished. Continue it with `specbench run ... --resume`.", ""]
    md += lossless_failed_section(records)  # loud, at the top: lossless methods that differ from ar unexplained
    if meta.get("environment"):
        md += ["## Environment", ""] + [f"- {k}: {v}" for k, v in meta["environment"].items()]
        md += [f"- peak memory (`peak_mem_mb`): {meta['peak_memory']}"] if meta.get("peak_memory") else []
        md += [""]
    if meta.get("model"):
        md += [f"- model: {meta['model'].get('name')} ({meta['model'].get('source')})", ""]
    if meta.get("settings"):
        s = meta["settings"]
        md += ["## Settings", ""] + [f"- {k}: {v}" for k, v in s.items() if k != "options"]
        md += [f"- options: {s.get('options')}", ""]
    md += ["## Summary", "", markdown_table(named(summary)), ""]
    md += shard_section(meta)  # a merged sharded run: hardware, prompts and ar tok/s of each shard
    md += ["Lossy methods (typical acceptance) are labelled `lossy`. " + LOSSLESS_TEXT, ""]
    floor = (meta.get("noise_guard") or {}).get("latency_floor", 1.0)
    md += category_section(single_records, single, run_dir, floor)
    md += context.section(single_records, run_dir, title, floor)  # tau and speedup by prompt length
    md += batchreport.section(summary, run_dir, title, meta.get("chosen"), meta.get("trees"))
    md += noise_section(summary, meta, records)
    md += ["## Formulas", "", "```", FORMULAS, "```", ""]
    md += ["![speedup](speedup.png)", "![tokens per second](tokens_per_s.png)", "![tau](tau.png)", ""]
    md += tree_section(single, meta.get("trees") or {}, run_dir, title=title)
    md += timeline.report_section(run_dir, title=title)  # sd / pearl runs: busy, idle, mutual waiting, Gantt PNGs
    (run_dir / "report.md").write_text("\n".join(md))
    return summary


def compare_runs(run_dirs: list[Path], out: Path) -> pd.DataFrame:
    """Side-by-side summary of several runs (a `label` column names each run folder)."""
    frames, runs, failed = [], [], []
    for d in run_dirs:
        s = write_run_report(Path(d))
        s.insert(0, "run", Path(d).name)
        frames.append(s)
        records = read_records(Path(d))
        runs.append((read_meta(Path(d)), records))
        bad = unexplained_mismatches(records)
        bad.insert(0, "run", Path(d).name)
        failed.append(bad)
    combined = pd.concat(frames, ignore_index=True)
    combined["label"] = combined.run + ":" + combined.method
    out.mkdir(parents=True, exist_ok=True)
    combined.drop(columns="label").to_csv(out / "comparison.csv", index=False)
    title = comparison_title(runs)
    write_plots(combined, out, title=title)
    cols = ["run", "method", "dataset", "prompts", "tokens_per_s", "speedup", "speedup_mean", "tau",
            "draft_ms_per_token", "lossless_rate", "lossless_explained_rate", "exactness"]
    bad = pd.concat(failed, ignore_index=True)
    md = ["# specbench comparison", "", f"{title}.", ""]
    if len(bad):
        md += ["## Lossless check FAILED", "", f"**{len(bad)} prompt turn(s) of lossless methods differ from `ar` "
               "where rounding does not explain it** (see each run's report.md).", "", markdown_table(bad), ""]
    md += [markdown_table(combined[cols]), "", LOSSLESS_TEXT, "",
           "![speedup](speedup.png)", "![tokens per second](tokens_per_s.png)", "![tau](tau.png)", ""]
    (out / "summary.md").write_text("\n".join(md))
    return combined
