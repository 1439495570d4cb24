"""`specbench report`: re-draw, compare, compare with a baseline, gate CI, history."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from ..errors import SpecbenchError
from ..progress import console, out
from .app import app
from .show import print_summary, warn_unexplained


@app.command()
def report(
    runs: Annotated[list[Path], typer.Argument(help="Run folders written by `specbench run` (with --history: runs of "
                                                    "successive commits, oldest first).")],
    out_dir: Annotated[Optional[Path], typer.Option(
        "--out", show_default="specbench-report/; with --baseline the run folder; with --history specbench-history/",
        help="Where a comparison of several runs goes; with one run, its report (the run's files copied there, its "
             "own report.md left alone); with --baseline, the vs_baseline files; with --history, history.csv and "
             ".png.")] = None,
    fail_below: Annotated[Optional[float], typer.Option(
        metavar="SPEEDUP", show_default="off",
        help="Exit 1 when a method's speedup interval lies below this (or a lossless method differs from ar beyond "
             "rounding); pass only when its lower end clears it; exit 4 when the interval straddles it, 3 (not "
             "judged) when the noise guard marks timings disturbed.")] = None,
    judge_disturbed: Annotated[bool, typer.Option(help="With --fail-below / --fail-regression: judge disturbed "
                                                       "timings anyway (they are still listed).")] = False,
    baseline: Annotated[Optional[Path], typer.Option(
        show_default="none",
        help="Compare with this earlier run (its folder or summary.csv, e.g. the last main-branch run): change in "
             "speedup, tau, acceptance and lossless rate per method x dataset. Refused when hardware, model, dtype "
             "or settings differ.")] = None,
    fail_regression: Annotated[Optional[str], typer.Option(
        metavar="PCT", show_default="off",
        help="With --baseline: exit 1 when a speedup or tau fell by more than PCT percent of the baseline's (the "
             "speedup beyond the noise, turn by turn on the prompts both ran), or a lossless rate fell; exit 4 when "
             "the interval cannot tell.")] = None,
    allow_different: Annotated[bool, typer.Option(help="Compare with a baseline from other hardware, model, dtype or "
                                                       "settings anyway (the report says so).")] = False,
    junit: Annotated[Optional[Path], typer.Option(
        show_default="none",
        help="Write JUnit XML: one test case per method x dataset check (lossless, floor, regression); not judged = "
             "skipped.")] = None,
    job_summary: Annotated[Optional[Path], typer.Option(
        show_default="$GITHUB_STEP_SUMMARY when set", help="Append the Markdown report to this file.")] = None,
    artifact_url: Annotated[Optional[str], typer.Option(
        show_default="on GitHub Actions, the run's artefacts",
        help="Job summary: link plots as URL/<path> (GitLab: $CI_JOB_URL/artifacts/file).")] = None,
    history: Annotated[bool, typer.Option("--history", help="Draw speedup and tau per method over the runs "
                                                            "(successive commits) as history.png and history.csv "
                                                            "in --out.")] = False,
):
    """Re-draw tables and plots from result CSVs, compare runs, compare with a baseline, and gate CI.

    Exit codes with --fail-below or --fail-regression: 0 passed; 1 a check failed; 3 not judged (timing disturbed);
    4 within the noise (a speedup's 95% interval straddles its threshold: more prompts or --repeats would tell);
    2 bad input."""
    from ..ci import flow as ci
    from ..report.run_report import compare_runs, write_run_report

    opts = ci.CiOptions(baseline=baseline, fail_below=fail_below, fail_regression=ci.parse_percent(fail_regression),
                        judge_disturbed=judge_disturbed, allow_different=allow_different, junit=junit,
                        job_summary=job_summary, artifact_url=artifact_url)
    for run in [] if history else runs:  # a mistyped folder is named as missing (ci/ checks --history's runs)
        if not run.exists():
            raise SpecbenchError(f"{run}: no such folder; pass a run folder written by `specbench run`")
    old = ci.prepare(opts, runs, history)  # bad input is refused before any work
    if history:
        from ..ci.history import write

        frame, paths, notes = write(runs, out_dir or Path("specbench-history"))
        _print_history(frame)
        for note in notes:
            console.print(f"[yellow]note[/] {escape(note)}")
        console.print(f"Wrote {escape(', '.join(str(p) for p in paths))}")
        return
    if len(runs) == 1:
        drawn = runs[0]
        if out_dir is not None and baseline is None:  # --out: the report goes there, the run folder stays as it is
            drawn = _copy_run(runs[0], out_dir)
        summary = write_run_report(drawn)
        print_summary(summary, str(drawn))
        warn_unexplained([drawn])
        console.print(f"Wrote {escape(str(drawn))}/summary.csv, report.md and plots.")
    else:
        out_dir = out_dir or Path("specbench-report")
        summary = compare_runs(runs, out_dir)
        summary["method"] = summary.run + ":" + summary.method
        print_summary(summary, "comparison")
        warn_unexplained(runs)
        from ..report.comparison import setting_differences  # what --baseline refuses on, a warning here

        for diff in setting_differences(runs):
            console.print(f"[bold yellow]runs differ in settings[/]: {escape(diff)}")
        console.print(f"Wrote {escape(str(out_dir))}/comparison.csv, summary.md and plots.")
    code = ci.judge(summary, runs, out_dir or runs[0], opts, old)
    if code:
        raise typer.Exit(code)


def _copy_run(run: Path, out_dir: Path) -> Path:
    """One run reported into --out: its result files (run.yaml, records.csv, tokens.jsonl, timeline.jsonl) copied
    there, so that the report drawn from them leaves the run's own report.md alone. Refused when --out holds
    another run."""
    import shutil

    from ..core.store import RunFolder

    source, target = RunFolder(run), RunFolder(out_dir)
    if out_dir.resolve() == run.resolve():
        return run
    if not source.is_run():
        raise SpecbenchError(f"{run}: not a run folder (no run.yaml); pass a run folder written by `specbench run`")
    if target.is_run():
        raise SpecbenchError(f"--out {out_dir} already holds a run; choose an empty folder for the report, or drop "
                             f"--out to redraw {run}'s own report.md")
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in (source.meta, source.records, source.tokens, source.timeline):
        if name.exists():
            shutil.copy2(name, out_dir / name.name)
    return out_dir


def _print_history(frame) -> None:
    from ..run.noise import is_disturbed

    table = Table(title="history (oldest first)")
    for col in ("commit", "method", "dataset", "speedup", "tau", "timing"):
        table.add_column(col, justify="right" if col in ("speedup", "tau") else "left")
    for r in frame[frame.method != "ar"].itertuples(index=False):
        table.add_row(escape(r.commit), escape(r.method), escape(r.dataset), f"{r.speedup:.2f}x", f"{r.tau:.2f}",
                      "[bold red]DISTURBED[/]" if is_disturbed(r.timing) else r.timing)
    out.print(table)
