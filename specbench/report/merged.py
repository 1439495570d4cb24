"""The reports of a merge (run/merge.py): each merged run's report, and for shards on several hardware keys the
top-level report.md / summary.csv that list each key's merged run side by side without pooling them."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml

from ..core.store import RunFolder
from .compact import timing_word
from .markdown import markdown_table
from .run_report import write_run_report
from .shards import shard_section


def report_merged(out: Path, runs: list[Path]) -> pd.DataFrame:
    """summary.csv, report.md and plots of each merged run, and the per-hardware top when there are several;
    returns the summary (with a `hardware` column when there are several keys)."""
    summaries = [write_run_report(run) for run in runs]
    return summaries[0] if len(runs) == 1 else write_per_hardware(out, runs)


def write_per_hardware(out: Path, runs: list[Path]) -> pd.DataFrame:
    """The top of a per-hardware merge: summary.csv (each key's summary with a `hardware` column) and report.md
    linking each key's own report; the keys are never pooled into one number."""
    out = Path(out)
    top = RunFolder(out)
    merged = yaml.safe_load(top.merge.read_text())
    frames = [pd.read_csv(RunFolder(run).summary).assign(hardware=run.name) for run in runs]
    summary = pd.concat(frames, ignore_index=True)
    summary = summary[["hardware"] + [c for c in summary.columns if c != "hardware"]]
    summary.to_csv(top.summary, index=False)
    cols = [c for c in ("hardware", "method", "dataset", "prompts", "tokens_per_s", "speedup", "speedup_lo",
                        "speedup_hi", "tau", "lossless_rate", "timing") if c in summary]
    md = [f"# specbench sharded run: {out.name}", "",
          f"**The shards ran on {len(runs)} hardware keys; their numbers are reported per key, never pooled** (a "
          "speedup is a ratio on one kind of device). Each key has its own merged run folder and report:", ""]
    md += [f"- `{run.name}`: [{run.name}/report.md]({run.name}/report.md)" for run in runs] + [""]
    md += ["## Summary per hardware key", "", markdown_table(summary[cols].assign(**(
        {"timing": summary.timing.map(timing_word)} if "timing" in summary else {}))), ""]
    md += shard_section({"shards": merged.get("shards")})
    top.report.write_text("\n".join(md))
    return summary

