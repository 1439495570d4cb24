"""The report files of a run folder (summary.csv, report.md, plots) and the comparison of several runs, computed
from result CSVs only (reports never re-run models). The numbers: summary.py; the lossless check: lossless_check.py;
report.md's verdict: verdict.py; its compact table: compact.py; other sections: sections.py, context.py (by prompt
length), runinfo.py (settings, environment); a comparison's text: comparison.py; plots: plots.py."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..core import random_weights
from ..core.store import RunFolder
from ..errors import SpecbenchError
from ..run.results import read_meta, with_batch_columns
from . import (acceptance, batchreport, compact, comparison, context, map_report, roofline, synthetic_prediction,
               timeline, verdict)
from .lossless_check import LOSSLESS_TEXT, lossless_failed_section, unexplained_mismatches
from .backends import cross_backend_section, backend_section
from .markdown import markdown_table
from .plots import write_plots
from .runinfo import environment_section, settings_section
from .sections import category_section, is_partial, noise_section, tree_section
from .serving import section as serving_section
from .shards import shard_section
from .summary import FORMULAS, named, read_records, summarize
from .titles import comparison_title, plot_title

# Importable from here too (ci/, cli/, tests and benchmarks import them from report/run_report.py):
from .lossless_check import lossless_verdicts  # noqa: F401, E402
from .plots import plot_bars, plt  # noqa: F401, E402
from .summary import SUMMARY_COLUMNS, by_category, disturbed, row_name  # noqa: F401, E402


def write_run_report(run_dir: Path) -> pd.DataFrame:
    """summary.csv, report.md and plots for one run folder; returns the summary.

    report.md leads with its verdict and keeps the detail for later:
        # specbench run: <folder>
        <title: model on hardware key, dtype, prompts>
        ## Verdict        timing ok / DISTURBED first, PARTIAL, lossless FAILED, few prompts; a sentence per dataset
        ## Summary        the compact table the console prints
        ... lossless failures, categories, prompt length, batching, timing check, formulas, plots, trees, timeline
        ## Settings, ## Environment   (run.yaml, without None values or Python reprs)
        ## Appendix: every summary column   (the table summary.csv holds)
    """
    run_dir = Path(run_dir)
    records = read_records(run_dir)
    if records.empty:
        raise SpecbenchError(f"{run_dir}: the run has no results yet (every prompt was skipped or none finished).")
    meta = read_meta(run_dir)
    summary = summarize(records, latency_floor=(meta.get("noise_guard") or {}).get("latency_floor", 1.0),
                        roofline=meta.get("roofline"))
    summary.to_csv(RunFolder(run_dir).summary, index=False)
    title = plot_title(meta, records) + (", PARTIAL run (interrupted)" if is_partial(meta) else "")
    # one prompt at a time: bars, categories, trees; batch > 1 has its own section (batchreport.py)
    single = summary[summary.batch_size == 1] if (summary.batch_size == 1).any() else summary
    single_records = with_batch_columns(records)
    single_records = single_records[single_records.batch_size == 1] if len(single) < len(summary) else records
    write_plots(single.assign(partial=is_partial(meta)), run_dir, title=title)
    md = [f"# specbench run: {run_dir.name}", "", f"{title}.", ""] + acceptance.synthetic_lines(meta)
    md += random_weights.lines(meta) + ["## Verdict", ""]
    md += acceptance.never_drafted_lines(records)  # a speculative method with 0 draft tokens: an error, not 1.00x
    md += verdict.headline(summary, meta, records)  # the timing verdict is its first line
    line = roofline.verdict_line(summary, meta.get("roofline"), records)  # ar against the bandwidth bound, and why
    md += [line, ""] if line else []
    md += ["## Summary", "", markdown_table(compact.table(summary)), "",
           "`speedup vs ar`: total tokens / total time against `ar` on the same prompt turns; `95% interval`: "
           "bootstrap over prompts; `median ratio`: the median per-turn ratio; `tau`: tokens per target forward; "
           "`lossless`: turns whose tokens equal `ar`'s (explained: or differ at a near-tie). Every column is in "
           "summary.csv and the appendix.", ""]
    md += backend_section(records, meta)  # another engine's run (llama.cpp, a server): what it was, lossless plainly
    md += lossless_failed_section(records)  # the turns behind a "Lossless check FAILED" verdict
    md += shard_section(meta)  # a merged sharded run: hardware, prompts and ar tok/s of each shard
    md += acceptance.section(records, meta)  # tau token- and request-weighted, per position; the synthetic check
    md += (["Lossless check: not applicable (synthetic acceptance: the kept drafts were drawn, not the model's).", ""]
           if meta.get("synthetic_acceptance") else
           ["Lossy methods (typical acceptance) are labelled `lossy`. " + LOSSLESS_TEXT, ""])
    md += synthetic_prediction.section(run_dir, single, single_records, meta)  # synthetic: plan's prediction beside
    floor = (meta.get("noise_guard") or {}).get("latency_floor", 1.0)
    md += category_section(single_records, single, run_dir, floor)
    md += context.cut_note(records)  # prompts cut from the left to fit the context
    md += context.section(single_records, run_dir, title, floor)  # tau and speedup by prompt length
    ems = summary[summary.batching.isin(["-", "padded", "unpadded"])]  # a server's load levels: serving.py
    md += batchreport.section(ems, run_dir, title, meta.get("chosen"), meta.get("trees"))
    md += map_report.write(run_dir, records, summary, meta, title)  # a batch-size sweep: where each method pays
    md += serving_section(records, run_dir, meta, title)  # ttft / itl / tpot percentiles, throughput, goodput
    md += noise_section(summary, meta, records)
    md += ["## Formulas", "", "```", FORMULAS, "```", ""]
    md += ["![speedup](speedup.png)", "![tokens per second](tokens_per_s.png)", "![tau](tau.png)", ""]
    md += tree_section(single, meta.get("trees") or {}, run_dir, title=title)
    md += timeline.report_section(run_dir, title=title)  # sd / pearl runs: busy, idle, mutual waiting, Gantt PNGs
    md += settings_section(meta) + environment_section(meta)
    md += ["## Appendix: every summary column", "", "The table summary.csv holds (formulas above).", "",
           markdown_table(named(summary)), ""]
    acceptance.write_profiles(records, run_dir, meta)  # speculation_profiles/<method>.json: measured, portable
    RunFolder(run_dir).report.write_text("\n".join(md))
    return summary


def compare_runs(run_dirs: list[Path], out: Path) -> pd.DataFrame:
    """Side-by-side summary of several runs (a `label` column names each run folder): comparison.csv, plots and
    summary.md (comparison.py: a warning when the runs differ in settings, each run's verdicts, the compact table
    with its timing column)."""
    frames, runs, failed, verdicts = [], [], [], []
    for d in run_dirs:
        s = write_run_report(Path(d))
        records, meta = read_records(Path(d)), read_meta(Path(d))
        bad = unexplained_mismatches(records)
        verdicts.append(comparison.run_verdict(Path(d).name, s, meta, len(bad)))
        s.insert(0, "run", Path(d).name)
        frames.append(s.assign(partial=is_partial(meta)))
        runs.append((meta, records))
        bad.insert(0, "run", Path(d).name)
        failed.append(bad)
    combined = pd.concat(frames, ignore_index=True)
    combined["label"] = combined.run + ":" + combined.method
    out.mkdir(parents=True, exist_ok=True)
    combined.drop(columns=["label", "partial"]).to_csv(out / "comparison.csv", index=False)
    title = comparison_title(runs)
    write_plots(combined, out, title=title)
    md = comparison.summary_md(title, combined, verdicts, comparison.setting_differences(run_dirs),
                               pd.concat(failed, ignore_index=True))
    md += cross_backend_section(run_dirs, out)  # runs of several engines: tok/s side by side, agreement with ar
    (out / "summary.md").write_text("\n".join(md))
    return combined.drop(columns="partial")
