"""The lossless check in reports: each turn's verdict against ar (match, near-tie, unexplained), the explained
rate, and the loud "Lossless check FAILED" section for lossless methods whose mismatches rounding does not explain
(run/lossless.py gives each mismatch its verdict while the run decodes)."""

from __future__ import annotations

import math

import pandas as pd

from ..run.lossless import explained_rate, lossless_verdicts  # noqa: F401  (read by summary.py)
from ..run.results import with_batch_columns
from .markdown import markdown_table


def exactness(method: str) -> str:
    from ..methods import REGISTRY

    cls = REGISTRY.get(method.split("@")[0])  # sweep labels: <method>@<tree size>
    return "" if cls is None else ("lossless" if cls.lossless else "lossy")


LOSSLESS_TEXT = (
    "Lossless check (temperature 0, every method's tokens against `ar`'s on the same prompt turn). "
    "`lossless_rate` = exact: the share of checked turns whose tokens equal `ar`'s, token for token; it guarantees "
    "identical text on those turns. `lossless_explained_rate` = exact or explained: also counts turns whose first "
    "differing token is a near-tie, i.e. `ar`'s logit margin between its own token and the method's "
    "(`mismatch_logit_gap` in records.csv) is within what the dtype's rounding can flip between a batched and a "
    "one-token forward (`specbench/run/lossless.py`: about 1.7 logits for SmolLM2 in bf16, 4e-4 in float32). It "
    "guarantees that no turn diverged where rounding cannot explain it: the method chose, at the first difference, a "
    "token `ar`'s own arithmetic could have chosen; the text after that point differs legitimately and is not "
    "compared. In float32 both rates should be 1.0; in bf16/fp16 the exact rate can be low while the explained rate "
    "stays 1.0. An unexplained mismatch of a lossless method is a defect to investigate.")


def unexplained_mismatches(records: pd.DataFrame) -> pd.DataFrame:
    """Turns of lossless methods that differ from ar where rounding does not explain it (the check has FAILED):
    method, dataset, prompt_id, turn, index (first differing token), gap (ar's logit margin, NaN when unknown) and
    verdict ("unexplained", or "no verdict" for runs older than the near-tie check)."""
    columns = ["method", "dataset", "prompt_id", "turn", "index", "gap", "verdict"]
    if records.empty or "lossless" not in records:
        return pd.DataFrame(columns=columns)
    verdicts = lossless_verdicts(records)
    batched = with_batch_columns(records).batch_size > 1  # batched ar is checked against batch-1 ar too
    # ar is checked where it has a reference of its own: batched ar against batch-1 ar, compiled ar against eager ar
    checked_ar = batched | (records["lossless"].astype(str) != "")
    lossless = records.method.map(lambda m: exactness(str(m)) != "lossy") & ((records.method != "ar") | checked_ar)
    bad = records[verdicts.isin(["unexplained", "no verdict"]) & lossless]
    gap = (pd.to_numeric(bad["mismatch_logit_gap"], errors="coerce") if "mismatch_logit_gap" in bad
           else pd.Series(math.nan, index=bad.index))
    return pd.DataFrame({"method": bad.method, "dataset": bad.dataset, "prompt_id": bad.prompt_id.astype(str),
                         "turn": bad.turn, "index": bad["lossless"].astype(str).str.split("@").str[-1].astype(int),
                         "gap": gap.round(6), "verdict": verdicts[bad.index]}, columns=columns).reset_index(drop=True)


def lossless_failed_section(records: pd.DataFrame) -> list[str]:
    """The report's loud "Lossless check FAILED" section; [] when every lossless method's mismatch is explained."""
    bad = unexplained_mismatches(records)
    if bad.empty:
        return []
    old = (bad.verdict == "no verdict").any()
    return ["## Lossless check FAILED", "",
            f"**{len(bad)} prompt turn(s) of lossless methods differ from `ar` where the dtype's rounding does not "
            "explain it** (gap = `ar`'s logit of its own token minus its logit of the method's token at the first "
            "differing index; a near-tie would be within the rounding tolerance). Investigate these before trusting "
            "the method's output or its speedup." + (" Rows marked `no verdict` were not classified: a run older "
                                                      "than the near-tie check, or a server that returns no logits "
                                                      "there (records.csv's mismatch_explained says why)."
                                                      if old else ""), "",
            markdown_table(bad), ""]
