"""The opening of report.md: the verdicts that change how to read the numbers, then one sentence per dataset.

Shape of what headline() returns (Markdown lines):

    **Timing: ok** - the noise guard trusts every row's timing (see "Timing check").
    **PARTIAL**: ...                                        (only an interrupted run)
    **Lossless check FAILED**: ...                          (only when a lossless method differs unexplained)
    **Not fully compiled** (--compile): ...                 (only when a method ran decode forwards eagerly)
    **Few prompts**: ...                                    (only below MIN_PROMPTS independent units)
    <blank>
    - On 6 humaneval prompts, pld is 1.24x ar (95% interval 1.09-1.51), lossless, timing ok.

The timing verdict always comes first, so that it sits within the report's first lines whatever else is said.
"""

from __future__ import annotations

import math

import pandas as pd

from ..run import noise
from .lossless_check import unexplained_mismatches
from .summary import disturbed, row_name

# Below this many independent units (prompts at batch 1, batches at B > 1) a percentile bootstrap interval only
# reshuffles what it saw: with 3 prompts there are 10 distinct resamples, and the interval covers the true
# speedup far less often than 95%. 10 is the usual floor for trusting it at all.
MIN_PROMPTS = 10
MOST_CLAUSES = 6  # a sweep can have dozens of rows; the sentence names the fastest few, the table has them all

PARTIAL_TEXT = ("**PARTIAL**: the run was interrupted; each method is compared with ar on the prompt turns both "
                "finished. Continue it with `specbench run ... --resume`.")


def _finite(value) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _size(r) -> int:
    try:
        return max(1, int(float(getattr(r, "batch_size", 1))))
    except (TypeError, ValueError):
        return 1


def timing_line(summary: pd.DataFrame) -> str:
    """The run's timing verdict in one line: ok, DISTURBED (which rows, what to do), or not judged."""
    if "timing" not in summary:
        return "**Timing: not judged** (a summary from before the noise guard)."
    bad = disturbed(summary)
    if bad.empty:
        return "**Timing: ok**: the noise guard trusts every row's timing (see \"Timing check\" below)."
    names = ", ".join(f"{row_name(r)} on {r.dataset}" for r in bad.itertuples(index=False))
    return (f"**Timing: DISTURBED** in {len(bad)} of {len(summary)} rows ({names}): their speedups are not "
            f"trustworthy (why: \"Timing check\" below); {noise.ADVICE}.")


def lossless_line(records: pd.DataFrame | None) -> str | None:
    """One line when a lossless method differs from ar where rounding does not explain it; else None."""
    if records is None:
        return None
    bad = unexplained_mismatches(records)
    if bad.empty:
        return None
    methods = ", ".join(dict.fromkeys(bad.method.astype(str)))
    return (f"**Lossless check FAILED**: {len(bad)} prompt turn(s) of lossless methods ({methods}) differ from ar "
            "where rounding does not explain it (the table is in \"Lossless check FAILED\" below): a defect, not "
            "numerics.")


def compile_line(summary: pd.DataFrame) -> str | None:
    """--compile: one line naming the methods with decode forwards that ran eagerly (their speedups mix compiled and
    eager steps, against a compiled ar); None when every forward ran compiled, or the run did not compile."""
    if "eager_forwards" not in summary:
        return None
    by_row: dict[str, list[str]] = {}  # a row name -> "dataset: eager of total" per dataset where it ran any eagerly
    for r in summary.itertuples(index=False):
        eager, compiled = getattr(r, "eager_forwards", math.nan), getattr(r, "compiled_forwards", math.nan)
        if _finite(eager) and float(eager) > 0:
            total = float(eager) + (float(compiled) if _finite(compiled) else 0.0)
            by_row.setdefault(row_name(r), []).append(f"{getattr(r, 'dataset', '?')}: {int(eager)} of {int(total)}")
    if not by_row:
        return None
    said = [f"{name} ({', '.join(dict.fromkeys(parts))} decode forwards eager)" for name, parts in by_row.items()]
    return (f"**Not fully compiled** (--compile): {'; '.join(said)}: their speedups mix eager and compiled forwards "
            "against a compiled ar (summary.csv: compiled_forwards, eager_forwards; run.yaml: compile).")


def units(r) -> int:
    """Independent units behind a row's interval: prompts at batch 1, batches (prompts / B, rounded up) at B > 1."""
    prompts = int(r.prompts) if _finite(r.prompts) else 0
    return -(-prompts // _size(r))


def few_prompts_line(summary: pd.DataFrame) -> str | None:
    """One line naming the datasets (and batch sizes) whose interval rests on fewer than MIN_PROMPTS units."""
    said = []
    for r in summary.itertuples(index=False):
        if r.method == "ar" or units(r) >= MIN_PROMPTS:
            continue
        n, size = units(r), _size(r)
        said.append(f"{r.dataset}: {n} prompt{'s' if n != 1 else ''}" if size == 1 else
                    f"{r.dataset} at B={size}: {n} batch{'es' if n != 1 else ''}")
    said = list(dict.fromkeys(said))
    if not said:
        return None
    units_word = "prompts (batches at B > 1)" if any("B=" in x for x in said) else "prompts"
    return (f"**Few prompts**: {'; '.join(said)}. A 95% bootstrap interval over fewer than {MIN_PROMPTS} "
            f"{units_word} only reshuffles those few and is narrower than the truth: read the speedups as rough. "
            f"Run with `--limit {MIN_PROMPTS}` or more for an interval that means something.")


def lossless_phrase(r, temperature: float | None = None) -> str:
    """'lossless', 'lossless within rounding (...)', 'LOSSLESS CHECK FAILED (...)', 'lossy by design', or what was
    not checked."""
    exact, explained = getattr(r, "lossless_rate", math.nan), getattr(r, "lossless_explained_rate", math.nan)
    kind = str(getattr(r, "exactness", "") or "")
    if kind == "lossy":
        return "lossy by design" + (f" ({float(exact):.0%} of turns equal ar's)" if _finite(exact) else "")
    if not _finite(exact):
        return "lossless not checked (temperature > 0)" if temperature else "lossless not checked"
    if float(exact) >= 1:
        return "lossless"
    if _finite(explained) and float(explained) >= 1:
        return (f"lossless within rounding ({float(exact):.0%} of turns token-identical to ar's, the others first "
                "differ at a near-tie the dtype's rounding can flip)")
    shown = f"{1 - float(explained):.0%}" if _finite(explained) else "some"
    return f"LOSSLESS CHECK FAILED ({shown} of turns differ unexplained)"


def speed_phrase(r) -> str:
    """'pld is 1.24x ar (95% interval 1.09-1.51)', with the interval's reading when it straddles 1."""
    at = "" if _size(r) == 1 else f" at B={_size(r)}"
    if not _finite(r.speedup):
        return f"{row_name(r)} ran without ar to compare with ({float(r.tokens_per_s):.1f} tok/s)"
    text = f"{row_name(r)} is {float(r.speedup):.2f}x ar{at}"
    low, high = getattr(r, "speedup_lo", math.nan), getattr(r, "speedup_hi", math.nan)
    if _finite(low) and _finite(high) and float(high) > float(low):
        reading = ""
        if float(low) <= 1 <= float(high):
            reading = ", not distinguishable from ar"
        text += f" (95% interval {float(low):.2f}-{float(high):.2f}{reading})"
    elif units(r) <= 1:
        text += " (one prompt: no interval)"
    return text


def timing_phrase(r) -> str:
    timing = str(getattr(r, "timing", "") or "")
    if not timing:
        return ""
    return "timing DISTURBED" if noise.is_disturbed(timing) else f"timing {timing}"


def dataset_sentence(dataset: str, rows: pd.DataFrame, temperature: float | None = None) -> str:
    """'On 6 humaneval prompts, pld is 1.24x ar (95% interval 1.09-1.51), lossless, timing ok; ...'."""
    ar = rows[rows.method == "ar"]
    prompts = int(ar.prompts.max() if len(ar) else rows.prompts.max())
    opening = f"On {prompts} {dataset} prompt{'s' if prompts != 1 else ''}, "
    others = rows[rows.method != "ar"]
    if others.empty:
        tps = float(ar.tokens_per_s.iloc[0]) if len(ar) else math.nan
        return opening + f"ar ran alone at {tps:.1f} tok/s (no method to compare with)."
    order = others.assign(_b=[_size(r) for r in others.itertuples(index=False)],
                          _s=pd.to_numeric(others.speedup, errors="coerce").fillna(-1))
    order = order.sort_values(["_b", "_s"], ascending=[True, False], kind="stable")
    clauses = []
    for r in order.head(MOST_CLAUSES).itertuples(index=False):
        parts = [speed_phrase(r), lossless_phrase(r, temperature), timing_phrase(r)]
        clauses.append(", ".join(p for p in parts if p))
    more = len(order) - MOST_CLAUSES
    tail = f"; and {more} more row(s) in the table below" if more > 0 else ""
    return opening + "; ".join(clauses) + tail + "."


def headline(summary: pd.DataFrame, meta: dict, records: pd.DataFrame | None = None) -> list[str]:
    """report.md's opening lines (see the module docstring): verdicts first, then one sentence per dataset."""
    temperature = (meta.get("settings") or {}).get("temperature")
    lines = [timing_line(summary)]
    if meta.get("complete") is False:
        lines.append(PARTIAL_TEXT)
    lines += [line for line in (lossless_line(records), compile_line(summary), few_prompts_line(summary)) if line]
    lines = [line + "  " for line in lines[:-1]] + lines[-1:]  # Markdown hard breaks: one verdict a line
    lines.append("")
    for dataset, rows in summary.groupby("dataset", sort=False):
        lines.append("- " + dataset_sentence(str(dataset), rows, temperature))
    return lines + [""]
