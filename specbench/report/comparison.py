"""The text of a comparison of several runs (`specbench report A B ...`, summary.md): a warning when the runs differ
in what their numbers depend on (the comparison `--baseline` refuses on: settings_diff.py), each run's verdicts
(timing, partial, lossless failures), then the compact table with its timing column.

Shape of summary.md:
    # specbench comparison
    <title>.
    **Runs differ in settings**: ...        (only when they do)
    - a: timing ok                           (one line per run; PARTIAL / lossless FAILED when so)
    ## Lossless check FAILED                 (only when some lossless method failed)
    <compact table: run | method | dataset | ... | timing>
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..run.results import read_meta
from .lossless_check import LOSSLESS_TEXT
from .markdown import markdown_table
from . import compact, settings_diff
from .summary import disturbed


def setting_differences(run_dirs: list[Path]) -> list[str]:
    """Each later run against the first: '<what>: <value> (<run>) vs <value> (<first run>)'; a run without run.yaml
    is named as unchecked."""
    folders = [Path(d) for d in run_dirs]
    metas = [read_meta(d) for d in folders]
    out = [f"{d.name}: no run.yaml, so its settings cannot be compared" for d, m in zip(folders, metas) if not m]
    if not metas[0]:
        return out
    first = settings_diff.facts_of(metas[0])
    for folder, meta in zip(folders[1:], metas[1:]):
        if meta:
            out += settings_diff.differences(settings_diff.facts_of(meta), first, (folder.name, folders[0].name))
    return out


def differences_text(diffs: list[str]) -> list[str]:
    if not diffs:
        return []
    return ["**Runs differ in settings**: " + "; ".join(diffs) + ". Their numbers were measured under different "
            "conditions (`report --baseline` refuses such a pair); read the side-by-side rows with that in mind.",
            ""]


def run_verdict(name: str, summary: pd.DataFrame, meta: dict, failed: int) -> str:
    """'- a: timing ok' / '- b: timing DISTURBED (2 of 3 rows), PARTIAL, lossless check FAILED (3 turns)'."""
    if "timing" not in summary:
        said = ["timing not judged"]
    else:
        bad = disturbed(summary)
        said = [f"timing DISTURBED ({len(bad)} of {len(summary)} rows)" if len(bad) else "timing ok"]
    if meta.get("complete") is False:
        said.append("PARTIAL (interrupted)")
    if failed:
        said.append(f"lossless check FAILED ({failed} turn(s))")
    return f"- {name}: " + ", ".join(said)


def summary_md(title: str, combined: pd.DataFrame, verdicts: list[str], diffs: list[str],
               bad: pd.DataFrame) -> list[str]:
    """summary.md's lines (module docstring)."""
    md = ["# specbench comparison", "", f"{title}.", ""] + differences_text(diffs) + verdicts + [""]
    if len(bad):
        md += ["## Lossless check FAILED", "", f"**{len(bad)} prompt turn(s) of lossless methods differ from `ar` "
               "where rounding does not explain it** (see each run's report.md).", "", markdown_table(bad), ""]
    md += [markdown_table(compact.table(combined)), "",
           "Every column of every run is in comparison.csv; `timing` is each row's noise-guard verdict (why a row "
           "is disturbed: that run's report.md).", "", LOSSLESS_TEXT, "",
           "![speedup](speedup.png)", "![tokens per second](tokens_per_s.png)", "![tau](tau.png)", ""]
    return md
