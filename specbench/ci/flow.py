"""`specbench report` in a CI job: compare with a baseline run, gate on regressions and speedup floors, write JUnit
XML and the job summary. The CLI parses options into CiOptions; `prepare` refuses bad input before any work,
`judge` prints, writes and returns the exit code (gate.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from rich.markup import escape
from rich.table import Table

from ..core.store import RunFolder
from ..errors import SpecbenchError
from ..progress import console, out
from . import baseline as bl
from . import gate, jobsummary, junit, paired, regress
from ..run.results import read_meta
from ..report.titles import comparison_title, plot_title


@dataclass
class CiOptions:
    baseline: Path | None = None
    fail_below: float | None = None
    fail_regression: float | None = None  # percent
    judge_disturbed: bool = False
    allow_different: bool = False
    junit: Path | None = None
    job_summary: Path | None = None
    artifact_url: str | None = None

    @property
    def gated(self) -> bool:
        return self.fail_below is not None or self.fail_regression is not None


def parse_percent(text: str | None, option: str = "--fail-regression") -> float | None:
    """'10', '10%' or '2.5' -> percent; negative, NaN, infinite or not a number: an error that says what to give."""
    if text is None:
        return None
    try:
        value = float(str(text).strip().removesuffix("%"))
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise SpecbenchError(f"{option}: expected a percentage of the baseline's value, 0 or more (e.g. 10 or 10%), "
                             f"got {text!r}")
    return value


@dataclass
class Baseline:
    """A loaded baseline, this run's identity, and the differences the report must state (--allow-different)."""

    old: bl.Side
    new: bl.Side
    notes: list[str]


def prepare(opts: CiOptions, runs: list[Path], history: bool) -> Baseline | None:
    """Refuse option mistakes, unwritable outputs and an incomparable baseline before any work; returns the loaded
    baseline (or None)."""
    if history:
        used = [flag for flag, value in (("--baseline", opts.baseline), ("--fail-below", opts.fail_below),
                                          ("--fail-regression", opts.fail_regression), ("--junit", opts.junit),
                                          ("--job-summary", opts.job_summary)) if value is not None]
        if used:
            raise SpecbenchError(f"--history draws speedup and tau over commits and gates nothing: leave out "
                                 f"{', '.join(used)} (run `specbench report NEW --baseline OLD` to gate)")
        return None
    if opts.baseline is None:
        for flag, value in (("--fail-regression", opts.fail_regression), ("--allow-different", opts.allow_different
                                                                          or None)):
            if value is not None:
                raise SpecbenchError(f"{flag} needs --baseline OLD: the earlier run (its folder or summary.csv) to "
                                     "compare with")
    elif len(runs) != 1:
        raise SpecbenchError(f"--baseline compares one run with it; got {len(runs)} runs. Pass one run folder (or "
                             "leave out --baseline to compare the runs side by side)")
    if opts.junit is not None:
        junit.check_writable(opts.junit, "--junit")
    summary_path = jobsummary.target(opts.job_summary)
    if summary_path is not None:
        junit.check_writable(summary_path, "--job-summary" if opts.job_summary else "GITHUB_STEP_SUMMARY")
    if opts.baseline is None:
        return None
    old = bl.load_side(opts.baseline)
    new = bl.identify(bl.Side(runs[0], pd.DataFrame()), runs[0])  # run.yaml / records.csv of the run
    return Baseline(old, new, bl.check_comparable(new, old, opts.allow_different))


def judge(summary: pd.DataFrame, runs: list[Path], out_dir: Path, opts: CiOptions, base: Baseline | None) -> int:
    """Compare, check, print, write JUnit / job summary; returns the exit code (0 without a gate)."""
    notes, comparison, delta, written, old = [], [], None, [], None
    from ..report.run_report import named

    summary = named(summary)  # batched rows keyed "sd B=8 unpadded"
    if base is not None:
        old, new, notes = base.old, base.new, base.notes
        delta = regress.compare(summary, old.summary, _paired(runs[0], old))
    checks = gate.lossless_checks(summary)
    if opts.fail_below is not None:
        checks += gate.floor_checks(summary, opts.fail_below, opts.judge_disturbed)
    if opts.fail_regression is not None and delta is not None:
        checks += gate.regression_checks(delta, opts.fail_regression, opts.judge_disturbed)
    if delta is not None:
        comparison = regress.markdown(delta, _verdicts(checks), _header(new, old, notes, opts))
        written = regress.write(delta, comparison, out_dir, title=_title(runs))
        _print_comparison(delta, checks, old, notes, opts)
        console.print(f"Wrote {escape(', '.join(str(p) for p in written))}")
    _print_checks(checks, opts, old)
    code = gate.exit_code(checks, opts.gated)
    properties = {"run": ", ".join(map(str, runs)), "baseline": opts.baseline, "verdict": gate.verdict(checks,
                                                                                                       opts.gated)}
    properties.update(_identity_properties(runs))
    if opts.junit is not None:
        junit.write(opts.junit, checks, f"specbench report {' '.join(p.name for p in runs)}", properties)
        console.print(f"Wrote JUnit XML {escape(str(opts.junit))} ({len(checks)} test cases)")
    target = jobsummary.target(opts.job_summary)
    if target is not None:
        plots = _plots(runs, out_dir) + [p for p in written if p.suffix == ".png"]
        jobsummary.append(target, jobsummary.render(
            runs[0].name if len(runs) == 1 else "comparison", _title(runs), summary, checks, opts.gated, comparison,
            plots, opts.artifact_url, notes))
        console.print(f"Appended the Markdown report to {escape(str(target))}")
    return code


def _paired(run: Path, old: bl.Side) -> pd.DataFrame | None:
    """The turn-by-turn changes against the baseline (paired.py) when both runs' records are at hand, else None."""
    if old.records is None or not RunFolder(run).records.exists():
        return None
    return paired.changes(bl.records_of(run), old.records)


def _identity_properties(runs: list[Path]) -> dict:
    env = read_meta(runs[0]).get("environment") or {}
    model = (read_meta(runs[0]).get("model") or {}).get("spec")
    return {"model": model, "hardware": env.get("hardware"), "dtype": env.get("dtype"), "git": env.get("git")}


def _title(runs: list[Path]) -> str:
    from ..report.run_report import read_records

    if len(runs) == 1:
        return plot_title(read_meta(runs[0]), read_records(runs[0]))
    return comparison_title([(read_meta(d), read_records(d)) for d in runs])


def _plots(runs: list[Path], out_dir: Path) -> list[Path]:
    folder = runs[0] if len(runs) == 1 else out_dir
    return [p for p in RunFolder(folder).plots if p.exists()]


def _header(new: bl.Side, old: bl.Side, notes: list[str], opts: CiOptions) -> list[str]:
    md = [f"### Against the baseline `{old.path}`", ""]
    same = f"{new.model or '?'} on {new.hardware or '?'}, {new.dtype or '?'}"
    revs = f"this run git {new.environment.get('git', '?')}, baseline git {old.environment.get('git', '?')}"
    for lib in ("torch", "transformers"):  # allowed to differ (an upgrade is something CI measures), but said
        a, b = new.environment.get(lib), old.environment.get(lib)
        if a and b and a != b:
            revs += f"; {lib} {a} (this run) vs {b} (baseline)"
    if notes and opts.allow_different:
        md += ["**NOT COMPARABLE: compared anyway (--allow-different)**. The runs differ: " + "; ".join(notes) + ".",
               "", f"This run: {same}; {revs}."]
    else:
        md += [f"Same hardware, model, dtype and settings{' as far as known' if notes else ''}: {same}; {revs}."
               + (f" Note: {'; '.join(notes)}." if notes else "")]
    if opts.fail_regression is not None:
        pct = f"{opts.fail_regression:g}%"
        md += ["", f"Gate (--fail-regression {pct}): a speedup more than {pct} below the baseline's and beyond the "
               "noise (compared turn by turn on the prompts both runs ran, its 95% paired interval wholly below no "
               f"change; without the baseline's records, this run's 95% interval wholly below the baseline's), a tau "
               f"more than {pct} below, or a fall in exactness, fails; a speedup whose interval reaches more than "
               f"{pct} down without ruling out the opposite is within the noise (exit 4)."]
    return md


def _verdicts(checks: list[gate.GateOutcome]) -> dict:
    """(method, dataset) -> the regression verdict shown in the comparison table."""
    out = {}
    for c in checks:
        if c.name == "regression":
            out[(c.method, c.dataset)] = {"failed": "REGRESSION", "passed": "ok"}.get(
                c.status, "not judged" if c.not_judged else "within the noise" if c.within_noise else "-")
    return out


def _print_comparison(delta, checks, old, notes, opts) -> None:
    """The comparison table on the console (ar left out: 1.00 by definition) and the differences allowed."""
    verdicts = _verdicts(checks)
    different = notes and opts.allow_different
    title = f"against the baseline {escape(str(old.path))}" + (" [bold red](NOT COMPARABLE: --allow-different)[/]"
                                                               if different else "")
    table = Table(title=title)
    for col in ("method", "dataset", "speedup", "tau", "accept", "lossless", "timing", "verdict"):
        table.add_column(col, justify="right" if col in ("speedup", "tau", "accept", "lossless") else "left")
    for r in gate.methods_only(delta).itertuples(index=False):
        c = regress.cells(r)
        lossless = c["lossless"] + ("" if c["explained"] == c["lossless"] else f"; explained {c['explained']}")
        v = verdicts.get((r.method, r.dataset), "") if r.status == "compared" else r.status
        v = {"REGRESSION": "[bold red]REGRESSION[/]", "not judged": "[yellow]not judged[/]",
             "within the noise": "[yellow]within the noise[/]"}.get(v, v)
        timing = "[bold red]" + c["timing"] + "[/]" if "disturbed" in c["timing"] else c["timing"]
        table.add_row(escape(r.method), escape(r.dataset), c["speedup"], c["tau"], c["acceptance"], lossless,
                      timing, v)
    out.print(table)
    for n in notes:
        console.print(f"[yellow]note[/] {escape(n)}")


def _print_checks(checks: list[gate.GateOutcome], opts: CiOptions, old: bl.Side | None) -> None:
    """The gate's verdict, one line per failed or not-judged check."""
    if not opts.gated:
        return
    for c in checks:
        if c.status == "failed":
            console.print(f"[red]FAIL[/] {escape(c.method)} on {escape(c.dataset)} ({c.name}): {escape(c.message)}")
    shaky = [c for c in checks if c.not_judged]
    if shaky:
        gates = " and ".join(g for g in (f"--fail-below {opts.fail_below}" if opts.fail_below is not None else "",
                                         f"--fail-regression {opts.fail_regression:g}%"
                                         if opts.fail_regression is not None else "") if g)
        rows = len({(c.method, c.dataset) for c in shaky})
        console.print(f"[bold red]NOT JUDGED[/]: {gates} {'is' if ' and ' not in gates else 'are'} not applied to "
                      f"disturbed timings ({rows} row(s) above); re-run them quietly, or pass --judge-disturbed.")
    noisy = [c for c in checks if c.within_noise]
    for c in noisy:
        console.print(f"[yellow]WITHIN THE NOISE[/] {escape(c.method)} on {escape(c.dataset)} ({c.name}): "
                      f"{escape(c.message.removeprefix('within the noise: '))}")
    if noisy and not shaky and not any(c.status == "failed" for c in checks):
        console.print(f"[bold yellow]WITHIN THE NOISE[/]: {len(noisy)} check(s) cannot tell (exit "
                      f"{gate.NOISE_EXIT}); more prompts, --repeats 3 or a quieter machine narrow the interval.")
    if any(c.status == "failed" for c in checks) or shaky or noisy:
        return
    judged_anyway = any("judged anyway" in c.message for c in checks)
    if opts.fail_below is not None:
        console.print(f"[green]OK[/] every method's speedup clears {opts.fail_below} (the lower end of its 95% "
                      "interval)"
                      + (" (some timings disturbed: judged anyway, --judge-disturbed)" if judged_anyway else ""))
    if opts.fail_regression is not None and old is not None:
        console.print(f"[green]OK[/] no speedup or tau more than {opts.fail_regression:g}% below "
                      f"{escape(str(old.path))} beyond the noise, and no fall in exactness")
