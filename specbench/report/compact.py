"""The compact summary table: the columns the console prints after a run (cli/show.py), as display strings, for
report.md and a comparison's summary.md. Every column of the summary is in summary.csv and report.md's appendix.

One row per summary row:
    method | dataset | prompts | tok/s | speedup vs ar | 95% interval | median ratio | tau | accept | lossless |
    [padding | tau min, when some row ran at batch > 1] | timing
A speculative method that drafted nothing shows "ERROR: 0 drafts" for its speedup.
"""

from __future__ import annotations

import math

import pandas as pd

from ..run import noise
from .summary import row_name


def _fmt(value, spec: str = "{:.2f}") -> str:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return "-"
    return "-" if math.isnan(v) else spec.format(v)


def _lossless(r) -> str:
    """'100%', '60% (100% explained)', '80% (lossy)'; '-' where nothing was checked."""
    exact, explained = getattr(r, "lossless_rate", math.nan), getattr(r, "lossless_explained_rate", math.nan)
    text = _fmt(exact, "{:.0%}")
    if str(getattr(r, "exactness", "")) == "lossy":
        return text + " (lossy)"
    if _fmt(explained) != "-" and _fmt(exact) != "-" and float(explained) != float(exact):
        text += f" ({float(explained):.0%} explained)"
    return text


def timing_word(timing) -> str:
    """A `timing` cell for a table: "DISTURBED" (the reasons stay in the CSV and the timing check), else as is."""
    return "DISTURBED" if noise.is_disturbed(timing) else str(timing)


def _timing(r) -> str:
    word = timing_word(str(getattr(r, "timing", "") or ""))
    return f"**{word}**" if word == "DISTURBED" else word


def _batched(summary: pd.DataFrame) -> bool:
    return "batch_size" in summary and (pd.to_numeric(summary.batch_size, errors="coerce").fillna(1) > 1).any()


def interval_text(r) -> str:
    """A summary row's 95% interval as "low-high"; with no width nothing was resampled, so none is shown: "-" for ar
    (against itself) and rows without one, "n/a (1 prompt)" for a method measured on a single prompt."""
    low, high = getattr(r, "speedup_lo", math.nan), getattr(r, "speedup_hi", math.nan)
    if "-" not in (_fmt(low), _fmt(high)) and float(high) > float(low):
        return f"{_fmt(low)}-{_fmt(high)}"
    single = str(getattr(r, "prompts", "")) == "1" and str(getattr(r, "method", "ar")).split("@")[0] != "ar"
    return "n/a (1 prompt)" if single else "-"


def _never_drafted(r) -> bool:
    """A speculative method's row (not a baseline's) that drafted no token at all."""
    from ..methods import REGISTRY

    cls = REGISTRY.get(str(getattr(r, "method", "")).split("@")[0])
    drafted = getattr(r, "drafted", math.nan)
    return cls is not None and cls.kind != "baseline" and _fmt(drafted) != "-" and float(drafted) == 0


def table(summary: pd.DataFrame) -> pd.DataFrame:
    """The compact table (module docstring); a `run` column first when the summary has one (a comparison)."""
    batched = _batched(summary)
    rows = []
    for r in summary.itertuples(index=False):
        span = interval_text(r)
        row = {"run": getattr(r, "run", None), "method": row_name(r), "dataset": r.dataset, "prompts": str(r.prompts),
               "tok/s": _fmt(r.tokens_per_s), "speedup vs ar": _fmt(r.speedup, "{:.2f}x"), "95% interval": span,
               "median ratio": _fmt(getattr(r, "speedup_median", math.nan), "{:.2f}x"), "tau": _fmt(r.tau),
               "accept": _fmt(getattr(r, "acceptance_rate", math.nan)), "lossless": _lossless(r)}
        if _never_drafted(r):  # its speed is ar's plus overhead: an error, not a 1.00x row
            row["speedup vs ar"] = "ERROR: 0 drafts"
        if batched:
            row.update({"padding": _fmt(getattr(r, "padding_ratio", math.nan), "{:.0%}"),
                        "tau min": _fmt(getattr(r, "tau_batch_min", math.nan))})
        row["timing"] = _timing(r)
        rows.append(row)
    frame = pd.DataFrame(rows)
    if "run" not in summary and "run" in frame:
        frame = frame.drop(columns="run")
    return frame
