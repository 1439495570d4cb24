"""Console output shared by `run` and `report`: the summary table and the loud warnings."""

from __future__ import annotations

import math

from rich.markup import escape
from rich.table import Table

from ..progress import console, out


def print_summary(summary, title: str) -> None:
    from ..run.noise import is_disturbed
    from ..report.compact import interval_text
    from ..report.summary import row_name

    batched = "batch_size" in summary and (summary.batch_size.fillna(1) > 1).any()
    table = Table(title=title)
    for col in ("method", "dataset", "prompts", "tok/s", "speedup vs ar", "95% interval", "median ratio", "tau",
                "accept",
                "lossless") + (("padding", "tau min") if batched else ()) + ("timing",):
        table.add_column(col, justify="left" if col in ("method", "dataset", "timing") else "right")

    def fmt(v, spec="{:.2f}"):
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else spec.format(v)

    for r in summary.itertuples(index=False):
        span = interval_text(r)  # none where it has no width (ar against itself, a single prompt)
        explained = getattr(r, "lossless_explained_rate", math.nan)
        loss = fmt(r.lossless_rate, "{:.0%}") + ("" if r.exactness != "lossy" else " (lossy)")
        if not (isinstance(explained, float) and math.isnan(explained)) and explained != r.lossless_rate:
            loss += f" ({explained:.0%} explained)"
        timing = str(getattr(r, "timing", "") or "")
        batch = (fmt(r.padding_ratio, "{:.0%}"), fmt(r.tau_batch_min)) if batched else ()
        table.add_row(escape(row_name(r)), r.dataset, str(r.prompts), fmt(r.tokens_per_s), fmt(r.speedup, "{:.2f}x"),
                      span, fmt(getattr(r, "speedup_median", math.nan), "{:.2f}x"), fmt(r.tau), fmt(r.acceptance_rate),
                      loss, *batch,
                      "[bold red]DISTURBED[/]" if is_disturbed(timing) else timing)
    out.print(table)
    warn_disturbed(summary)


def warn_unexplained(run_dirs) -> None:
    """Say loudly when a lossless method differs from ar where the dtype's rounding does not explain it."""
    from ..report.lossless_check import unexplained_mismatches
    from ..report.summary import read_records

    for run_dir in run_dirs:
        bad = unexplained_mismatches(read_records(run_dir))
        if len(bad):
            console.print(f"[bold red]lossless check FAILED[/] in {escape(str(run_dir))}: {len(bad)} prompt turn(s) "
                          "differ from ar beyond rounding (a defect, not numerics):")
            for r in bad.head(10).itertuples(index=False):
                console.print(f"  {escape(r.method)} {escape(r.dataset)} prompt {escape(r.prompt_id)} turn {r.turn}: "
                              f"first difference at token {r.index}, logit gap {r.gap} ({r.verdict})")


def warn_disturbed(summary) -> None:
    """Say loudly which rows the noise guard distrusts, why, and what to do."""
    from ..run.noise import ADVICE
    from ..report.summary import disturbed, row_name

    bad = disturbed(summary)
    if len(bad):
        console.print("[bold red]timing disturbed[/]: these speedups are not trustworthy:")
        for r in bad.itertuples(index=False):
            console.print(f"  {escape(row_name(r))} on {escape(r.dataset)}: "
                          f"{escape(r.timing.removeprefix('disturbed: '))}")
        console.print(f"  Advice: {ADVICE}.")
