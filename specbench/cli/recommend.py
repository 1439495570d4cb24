"""`specbench recommend`: predict every method's speedup here from the profiles and acceptance files, confirm the
best few beside `ar` in one short run, print and file the pick (run/recommend.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from ..progress import console, out
from .app import app
from .parse import prompt_limit


def _x(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


@app.command()
def recommend(
    model: Annotated[str, typer.Option(help="Model spec (as for `run`).")] = "smollm2-135m",
    dtype: Annotated[str, typer.Option(help="auto (what `run --dtype auto` picks here), float32, bfloat16, "
                                            "float16")] = "auto",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:<i>")] = "auto",
    dataset: Annotated[str, typer.Option(help="Dataset of the confirming run (name or .jsonl).")] = "gsm8k",
    confirm: Annotated[int, typer.Option(help="Measure the best K predicted methods beside ar, with the methods no "
                                              "model predicts (pld, suffix; sd and pearl where the model has a drafter); 0 = "
                                              "prediction only, no decoding: the pick is filed as not confirmed.")]
    = 2,
    limit: Annotated[str, typer.Option(help="Prompts in the confirming run: the first N, or all.")] = "5",
    max_new_tokens: Annotated[int, typer.Option(help="Cap on new tokens per turn in the confirming run.")] = 64,
    data_file: Annotated[Optional[str], typer.Option(show_default="the set's own", help="Read the named --dataset "
                                                     "from this file.")] = None,
    threads: Annotated[Optional[int], typer.Option(show_default="torch's choice", help="torch CPU threads.")] = None,
    out_dir: Annotated[Optional[Path], typer.Option("--out", show_default="results/recommend-<time>", help="Folder "
                       "for recommendation.yaml and the confirming run.")] = None,
    allow_disturbed_profile: Annotated[bool, typer.Option("--allow-disturbed-profile", help="Use profiles and trees "
                                       "measured on a disturbed machine (skipped otherwise, with a line saying "
                                       "which).")] = False,
    compile: Annotated[bool, typer.Option("--compile", help="Pick for `run --compile`: predictions from the "
                       "compiled profile (`profile --compile`) and trees built from it, the confirming run compiled; "
                       "filed apart (<hardware>@compiled.yaml), read by `run --method auto --compile`.")] = False,
):
    """Which method to use for a model on this machine: predicted from files, confirmed by a short measured run."""
    from ..run.recommend import RecommendRequest
    from ..run.recommend import recommend as run_recommend

    from ..report.run_report import write_run_report
    from .run import file_host_work

    result = run_recommend(RecommendRequest(model, dtype, device, dataset, confirm, prompt_limit(limit),
                                            max_new_tokens, out_dir, data_file, threads,
                                            allow_disturbed_profile, compile))
    if result.run:  # summary.csv, report.md and plots beside the records, as `specbench run` writes them
        file_host_work(Path(result.run), write_run_report(result.run))
    table = Table(title=f"{model} on {result.hardware} ({result.dtype}): predicted and measured speedup over ar")
    for col in ("method", "tree / gamma", "dtype", "predicted", "measured", "lossless", "why not available"):
        table.add_column(col, justify="right" if col in ("predicted", "measured", "lossless") else "left")
    for row in result.rows:
        tree = f"size {row.size}" if row.size is not None else "-"
        style = "bold green" if row is result.pick else None
        table.add_row(row.method, tree, result.dtype if not row.why_not else "-", _x(row.predicted), _x(row.measured),
                      "-" if row.lossless is None else f"{row.lossless:.0%}", escape(row.why_not), style=style)
    out.print(table)
    for note in result.notes:
        console.print(f"[yellow]note[/] {escape(note)}")
    pick = result.pick
    numbers = f"measured {_x(pick.measured)} beside ar, predicted {_x(pick.predicted)}" if result.run else \
        f"predicted {_x(pick.predicted)} (not measured: --confirm 0; not confirmed, and the methods without a " \
        "prediction were not considered)"
    tree = f", tree {escape(pick.tree)}" if pick.tree else ""
    console.print(f"[bold]Use {pick.method}[/] ({result.dtype}{tree}): {numbers}.")
    where = escape(str(result.out / "recommendation.yaml"))
    run = f"; confirming run {escape(str(result.run))}" if result.run else ""
    if result.filed is None:  # a measured recommendation was kept (the note says so)
        console.print(f"Wrote {where}{run}. `specbench run --method auto --model {escape(model)} --recommendation "
                      f"{where}` runs it.")
        return
    from ..core.store import said_where

    console.print(f"Wrote {where} and filed {escape(said_where(result.filed))}{run}. `specbench run --method auto "
                  f"--model {escape(model)}` runs it.")
