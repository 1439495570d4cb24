"""The two sides of a baseline comparison: each run's summary and what its numbers depend on (hardware identity,
model, dtype, settings), and whether the two may be compared.

A side is a run folder (records.csv, else summary.csv; run.yaml for the identity) or a bare summary.csv. A bare
summary.csv takes its identity from run.yaml beside it, else from records.csv beside it (hardware, model, dtype
only), else from `hardware` / `model` / `dtype` columns it may carry. The hardware must be known to compare: without
it the comparison needs --allow-different. Settings are checked only where both sides have run.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ..core.store import RunFolder
from ..errors import SpecbenchError
from ..report import csvcheck, settings_diff
from ..run.results import read_meta

SUMMARY_NUMBERS = ("speedup", "tau", "acceptance_rate", "lossless_rate", "lossless_explained_rate", "tokens_per_s")
NOT_COMPARED = settings_diff.NOT_COMPARED  # settings a comparison leaves out (report/settings_diff.py)


@dataclass
class Side:
    """One run of a comparison: its summary and what its numbers depend on (None: unknown)."""

    path: Path
    summary: pd.DataFrame
    hardware: str | None = None
    identity: dict | None = None
    model: str | None = None
    dtype: str | None = None
    settings: dict | None = None  # run.yaml settings, options per method included
    environment: dict = field(default_factory=dict)
    source: str = "identity from run.yaml"  # where the identity came from
    records: pd.DataFrame | None = None  # the run's records.csv when the side is a run folder (paired comparison)


def load_side(path: Path, role: str = "baseline") -> Side:
    """A run folder or a summary.csv as one side of a comparison (errors say what to pass instead)."""
    path = Path(path)
    if path.is_dir():
        folder, summary_csv = path, RunFolder(path).summary
        if RunFolder(folder).records.exists():
            summary = summary_of(folder)  # recomputed in memory: same formulas on both sides, nothing written
            return identify(Side(path, summary, records=records_of(folder)), folder)
        elif summary_csv.exists():
            summary = read_summary(summary_csv)
        else:
            raise SpecbenchError(f"--{role} {path}: no summary.csv or records.csv in this folder; pass a run folder "
                                 "written by `specbench run` (or its summary.csv).")
    elif path.is_file():
        if path.suffix.lower() != ".csv":
            raise SpecbenchError(f"--{role} {path}: expected a run folder or its summary.csv")
        folder, summary = path.parent, read_summary(path)
    else:
        raise SpecbenchError(f"--{role} {path}: no such file or folder; pass the run folder of the earlier run (e.g. "
                             "the downloaded artefact of the last main-branch run) or its summary.csv.")
    return identify(Side(path, summary), folder)


def read_summary(path: Path) -> pd.DataFrame:
    """summary.csv, checked: the columns a comparison needs, numbers where numbers belong."""
    df = csvcheck.read_csv(path, "summary CSV", keep_default_na=False)
    csvcheck.require_columns(df, path, {"method", "dataset", "speedup", "tau"}, "summary.csv")
    df = csvcheck.numeric(df, path, SUMMARY_NUMBERS)
    df["method"], df["dataset"] = df.method.astype(str), df.dataset.astype(str)
    from ..report.run_report import named

    df = named(df)  # batched rows: "sd B=8 unpadded"
    twice = df[df.duplicated(["method", "dataset"], keep=False)]
    if len(twice):  # e.g. two summaries pasted together: which row is the baseline is unknowable
        first, second = (int(i) + 2 for i in twice.index[:2])
        r = twice.iloc[0]
        raise SpecbenchError(f"{path}: lines {first} and {second} are both {r.method} on {r.dataset}; a summary has "
                             "one row per method x dataset (re-create it with `specbench report RUN`)")
    return df


def summary_of(run_dir: Path) -> pd.DataFrame:
    """The summary of a run folder from its records, in memory (a downloaded baseline may be read-only)."""
    from ..report.run_report import named, read_records, summarize

    records = read_records(run_dir)
    if records.empty:
        raise SpecbenchError(f"{run_dir}: records.csv has no results")
    meta = read_meta(run_dir)
    return named(summarize(records, latency_floor=(meta.get("noise_guard") or {}).get("latency_floor", 1.0)))


def records_of(run_dir: Path) -> pd.DataFrame:
    """A run folder's records (read and checked as the report reads them)."""
    from ..report.summary import read_records

    return read_records(run_dir)


def identify(side: Side, folder: Path) -> Side:
    """Fill in what `side`'s numbers depend on from run.yaml in `folder`, else records.csv beside it, else the
    summary's own columns."""
    meta = read_meta(folder)
    if meta:
        env = meta.get("environment") or {}
        side.environment = env
        side.hardware, side.identity, side.dtype = env.get("hardware"), env.get("identity"), env.get("dtype")
        side.model = (meta.get("model") or {}).get("spec") or (meta.get("settings") or {}).get("model")
        side.settings = meta.get("settings")
        return side
    records = RunFolder(folder).records
    if records.exists():
        side.source = f"identity from records.csv beside {side.path.name}; no run.yaml, so settings not checked"
        table = csvcheck.read_csv(records, "records CSV", keep_default_na=False,
                                  usecols=lambda c: c in ("hardware", "model", "dtype", "git", "torch"))
    else:
        side.source = (f"identity from the columns of {side.path.name}; no run.yaml or records.csv beside it, so "
                       "settings not checked")
        table = side.summary
    values = {c: " / ".join(dict.fromkeys(str(v) for v in table[c] if str(v))) or None
              for c in ("hardware", "model", "dtype", "git", "torch") if c in table}
    side.hardware, side.model, side.dtype = values.get("hardware"), values.get("model"), values.get("dtype")
    side.environment = {k: v for k, v in values.items() if v and k in ("git", "torch")}
    if side.hardware is None:
        side.source = f"no run.yaml or records.csv beside {side.path}, and no hardware column in it"
    return side


def differences(new: Side, old: Side) -> list[str]:
    """What the two runs' numbers depend on and differ in, naming both values: 'hardware: X (this run) vs Y
    (baseline)'. Only what both sides state is compared (unknown() says what is not); `report A B` warns on the
    same comparison (report/settings_diff.py)."""
    return settings_diff.differences(vars(new), vars(old))


def unknown(old: Side) -> list[str]:
    """What cannot be checked about the baseline: 'hardware' (then --allow-different is required), 'settings'."""
    return [name for name, value in (("hardware", old.hardware), ("model", old.model), ("dtype", old.dtype),
                                     ("settings", old.settings)) if value is None]


def check_comparable(new: Side, old: Side, allow_different: bool) -> list[str]:
    """Refuse (SpecbenchError) a baseline whose numbers depend on other hardware, model, dtype or settings, or whose
    hardware is unknown, unless allowed; returns the differences and unknowns the report must state."""
    diffs, missing = differences(new, old), unknown(old)
    notes = diffs + ([f"baseline {', '.join(missing)} unknown ({old.source})"] if missing else [])
    if allow_different:
        return notes
    if diffs:
        raise SpecbenchError(f"--baseline {old.path} is not comparable with {new.path}: {'; '.join(diffs)}. Speedups "
                             "measured on other hardware or with other settings are different numbers; compare with "
                             "a baseline run on the same hardware with the same command, or pass --allow-different "
                             "to compare anyway (the report then says so).")
    if "hardware" in missing:
        raise SpecbenchError(f"--baseline {old.path}: its hardware identity cannot be checked ({old.source}); "
                             "pass the whole run folder (with run.yaml), or --allow-different to compare anyway.")
    return notes
