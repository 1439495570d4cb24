"""A run against a baseline run: per method x dataset, the change in speedup, tau, acceptance and lossless rate.

Changes: speedup and tau relative (percent of the baseline's value), acceptance and lossless rates in percentage
points (they are shares already). Rows are matched by method x dataset; a row only this run has is `new`, one only
the baseline has is `gone`. When both runs' records are at hand, the speedup's change is also compared turn by turn
on the prompts both ran, with its paired interval (paired.py: paired_change, paired_change_lo/_hi, in percent),
which is what the regression gate judges. Written as vs_baseline.csv, vs_baseline.md and vs_baseline.png.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ..errors import SpecbenchError
from ..report.markdown import markdown_table
from ..run.noise import is_disturbed
from . import paired

# summary column -> (short name in the comparison, relative change?)
MEASURES = {"speedup": ("speedup", True), "tau": ("tau", True), "acceptance_rate": ("acceptance", False),
            "lossless_rate": ("lossless", False), "lossless_explained_rate": ("explained", False)}
KEY = ["method", "dataset"]
INTERVAL = ("speedup_lo", "speedup_hi")  # run/intervals.py; NaN for summaries from before the interval


def compare(new: pd.DataFrame, old: pd.DataFrame, turn_by_turn: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per method x dataset of either run: <measure>_base, <measure>, <measure>_change, each side's speedup
    interval (speedup_lo/_hi[_base]; NaN where a summary has none), timing of each side, exactness and status
    (compared / new / gone), and the paired change of the speedup (paired.changes; NaN without both runs'
    records)."""
    def side(s: pd.DataFrame) -> pd.DataFrame:
        cols = {c: MEASURES[c][0] for c in MEASURES}
        frame = pd.DataFrame({k: s[k].astype(str) for k in KEY})
        for col, name in cols.items():
            frame[name] = pd.to_numeric(s[col], errors="coerce") if col in s else math.nan
        for col in INTERVAL:
            frame[col] = pd.to_numeric(s[col], errors="coerce") if col in s else math.nan
        frame["timing"] = s["timing"].astype(str) if "timing" in s else ""
        frame["exactness"] = s["exactness"].astype(str) if "exactness" in s else ""
        return frame

    merged = side(new).merge(side(old), on=KEY, how="outer", suffixes=("", "_base"), indicator=True, sort=False)
    merged["status"] = merged.pop("_merge").map({"both": "compared", "left_only": "new", "right_only": "gone"})
    merged["exactness"] = merged.exactness.where(merged.exactness.notna() & (merged.exactness != ""),
                                                 merged.exactness_base)
    columns = KEY + ["status"]
    for name, relative in MEASURES.values():
        a, b = merged[name], merged[f"{name}_base"]
        merged[f"{name}_change"] = ((a / b - 1) * 100 if relative else (a - b) * 100).round(2)
        columns += [f"{name}_base", name, f"{name}_change"]
    columns += [f"{c}{side}" for side in ("_base", "") for c in INTERVAL] + ["timing_base", "timing", "exactness"]
    pairs = paired.COLUMNS[2:]
    if turn_by_turn is not None and len(turn_by_turn):
        merged = merged.merge(turn_by_turn.astype({"method": str, "dataset": str}), on=KEY, how="left")
    else:
        merged = merged.assign(**dict.fromkeys(pairs, math.nan))
    columns += pairs
    return merged[columns].fillna({"timing": "", "timing_base": "", "exactness": ""}).reset_index(drop=True)


def _num(v, spec: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else spec.format(v)


def _span(r, side: str) -> str:
    """ ' [low-high]' of one side's speedup interval; nothing when it has none or it is a point (one turn)."""
    low, high = getattr(r, f"speedup_lo{side}", math.nan), getattr(r, f"speedup_hi{side}", math.nan)
    if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in (low, high)) or low == high:
        return ""
    return f" [{low:.2f}-{high:.2f}]"


def cells(r) -> dict[str, str]:
    """Display strings of one comparison row: 'base -> new (change)' per measure, and its timing."""
    out = {}
    for name, relative in MEASURES.values():
        base, new, change = getattr(r, f"{name}_base"), getattr(r, name), getattr(r, f"{name}_change")
        spec = "{:.2f}x" if name == "speedup" else "{:.2f}" if name == "tau" else "{:.0%}"
        text = f"{_num(base, spec)}{_span(r, '_base')} -> {_num(new, spec)}{_span(r, '')}" if name == "speedup" \
            else f"{_num(base, spec)} -> {_num(new, spec)}"
        if not (isinstance(change, float) and math.isnan(change)):
            text += f" ({change:+.1f}%)" if relative else f" ({change:+.0f} pt)"
        if name == "speedup":
            text += paired_text(r)
        out[name] = text
    marks = [f"disturbed ({who})" for who, t in (("this run", r.timing), ("baseline", r.timing_base))
             if is_disturbed(t)]
    out["timing"] = ", ".join(marks) or ("ok" if r.status == "compared" else "")
    return out


def paired_text(r) -> str:
    """' paired -10.2% [-12.0% .. -8.1%] on 20 turns' for a row with a paired change (nothing without one)."""
    change = getattr(r, "paired_change", math.nan)
    if change is None or (isinstance(change, float) and math.isnan(change)):
        return ""
    low, high = getattr(r, "paired_change_lo", math.nan), getattr(r, "paired_change_hi", math.nan)
    span = "" if any(isinstance(v, float) and math.isnan(v) for v in (low, high)) else \
        f" [{low:+.1f}% .. {high:+.1f}%]"
    return f" paired {change:+.1f}%{span} on {int(r.paired_turns)} turns"


def markdown(delta: pd.DataFrame, verdicts: dict, header: list[str]) -> list[str]:
    """The comparison as Markdown lines: `header` (what was compared, and any differences allowed), then one row
    per method x dataset with its regression verdict (verdicts: (method, dataset) -> text)."""
    rows = []
    for r in delta[delta.method.astype(str) != "ar"].itertuples(index=False):  # ar: 1.00 by definition (CSV has it)
        c = cells(r)
        rows.append({"method": r.method, "dataset": r.dataset, "status": r.status, "speedup": c["speedup"],
                     "tau": c["tau"], "acceptance": c["acceptance"], "lossless (exact)": c["lossless"],
                     "exact or explained": c["explained"], "timing": c["timing"],
                     "verdict": verdicts.get((r.method, r.dataset), "")})
    table = pd.DataFrame(rows, columns=["method", "dataset", "status", "speedup", "tau", "acceptance",
                                        "lossless (exact)", "exact or explained", "timing", "verdict"])
    return header + ["", markdown_table(table), "",
                     "Speedup and tau: baseline -> this run (relative change), speedups with their 95% bootstrap "
                     "interval [low-high] and, where both runs' records share prompt turns, the change measured turn "
                     "by turn with its 95% paired interval; acceptance and lossless rates in "
                     "percentage points. `new`: no baseline row; `gone`: only the baseline has it.", ""]


def write(delta: pd.DataFrame, md: list[str], out: Path, title: str = "") -> list[Path]:
    """vs_baseline.csv, vs_baseline.md and vs_baseline.png (speedup, baseline vs this run) in `out`."""
    from ..report.run_report import plot_bars

    try:
        out.mkdir(parents=True, exist_ok=True)
        delta.to_csv(out / "vs_baseline.csv", index=False)
        (out / "vs_baseline.md").write_text("\n".join(md))
    except OSError as exc:
        raise SpecbenchError(f"cannot write the comparison to {out} ({exc.strerror or exc}); choose another --out") \
            from exc
    shown = delta[delta.method != "ar"]
    frames = []
    for label, suffix in (("baseline", "_base"), ("this run", "")):
        f = pd.DataFrame({"dataset": shown.dataset, "label": label + ": " + shown.method,
                          "speedup": shown[f"speedup{suffix}"], "tau": shown[f"tau{suffix}"]})
        frames.append(f)
    both = pd.concat(frames, ignore_index=True)
    paths = [out / "vs_baseline.csv", out / "vs_baseline.md"]
    if len(shown):
        plot_bars(both, "speedup", "speedup over ar: baseline vs this run", out / "vs_baseline.png", baseline=1.0,
                  title=title)
        paths.append(out / "vs_baseline.png")
    return paths
