"""The Markdown report a CI job shows on its page: GitHub Actions' job summary ($GITHUB_STEP_SUMMARY, appended to,
as GitHub expects) or any file (--job-summary). Plots cannot be embedded there, so they are links: to
--artifact-url/<path> when given (GitLab: "$CI_JOB_URL/artifacts/file"), else on GitHub Actions to the run's
artefacts (upload the run folder), else the files' paths."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from ..core.store import relative_to_cwd
from ..errors import SpecbenchError
from .gate import GateOutcome, verdict
from ..report.markdown import markdown_table

RESULT_COLUMNS = ["method", "dataset", "prompts", "tokens_per_s", "speedup", "speedup_lo", "speedup_hi", "tau",
                  "acceptance_rate", "lossless_rate", "lossless_explained_rate", "timing"]
ICONS = {"PASSED": "✅", "FAILED": "❌", "NOT JUDGED": "⚠️", "WITHIN THE NOISE": "❔", "REPORT": "📊"}


def target(option: Path | None) -> Path | None:
    """Where the summary goes: --job-summary, else $GITHUB_STEP_SUMMARY, else nowhere."""
    if option is not None:
        return Path(option)
    env = os.environ.get("GITHUB_STEP_SUMMARY")
    return Path(env) if env else None


def link(path: Path, artifact_url: str | None) -> str:
    """Markdown link to a plot the job uploaded."""
    rel = relative_to_cwd(path)
    if artifact_url:
        return f"[{Path(path).name}]({artifact_url.rstrip('/')}/{rel})"
    server, repo, run = (os.environ.get(k) for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID"))
    if server and repo and run:
        return f"[{rel}]({server}/{repo}/actions/runs/{run}#artifacts)"
    return f"[{Path(path).name}]({rel})"


def render(name: str, title: str, summary: pd.DataFrame, checks: list[GateOutcome], gated: bool, comparison: list[str],
           plots: list[Path], artifact_url: str | None, notes: list[str] = ()) -> str:
    """The whole section: verdict, checks that failed or were not judged, results, the baseline comparison, plots."""
    word = verdict(checks, gated)
    md = [f"## {ICONS[word]} specbench {name}: {word}", "", f"{title}.", ""]
    counts = {s: sum(c.status == s for c in checks) for s in ("passed", "failed", "skipped")}
    if checks:
        md += [f"Checks: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"
               + (f" ({sum(c.not_judged for c in checks)} not judged: timing disturbed; re-run on a quiet machine "
                  "with --repeats 3, or pass --judge-disturbed)" if any(c.not_judged for c in checks) else "")
               + (f" ({sum(c.within_noise for c in checks)} within the noise: the 95% interval straddles the "
                  "threshold; more prompts or --repeats would tell)" if any(c.within_noise for c in checks) else "")
               + "." + (" **Some timings disturbed: judged anyway (--judge-disturbed).**"
                        if any("judged anyway" in c.message for c in checks) else ""), ""]
    md += [f"- {n}" for n in notes] + ([""] if notes else [])
    shown = [c for c in checks if c.status == "failed" or c.not_judged or c.within_noise]
    if shown:
        table = pd.DataFrame([{"check": c.name, "method": c.method, "dataset": c.dataset,
                               "result": "FAILED" if c.status == "failed" else "not judged" if c.not_judged
                               else "within the noise", "why": c.message} for c in shown])
        md += ["### Failed or not judged" + (" or within the noise" if any(c.within_noise for c in shown) else ""),
               "", markdown_table(table), ""]
    md += ["### Results", "", markdown_table(summary[[c for c in RESULT_COLUMNS if c in summary]]), ""]
    md += comparison
    if plots:
        md += ["### Plots", "", " · ".join(link(p, artifact_url) for p in plots), ""]
    return "\n".join(md) + "\n"


def append(path: Path, text: str) -> None:
    try:
        with Path(path).open("a", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise SpecbenchError(f"job summary {path}: cannot write it ({exc.strerror or exc})") from exc
