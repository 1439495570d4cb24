"""`specbench merge`: shard folders of `run --shard I/N` into one run folder with its report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from ..progress import console
from .app import app
from .show import print_summary, warn_unexplained


@app.command()
def merge(
    folders: Annotated[list[Path], typer.Argument(help="Shard folders (written by `specbench run --shard I/N`).")],
    out: Annotated[Path, typer.Option("--out", help="The merged run folder.")],
    allow_partial: Annotated[bool, typer.Option(help="Merge even with shards missing or unfinished (the report "
                                                     "says partial).")] = False,
    per_hardware: Annotated[bool, typer.Option(help="Shards on several hardware keys: one merged run per key "
                                                    "(OUT/<hardware>/), never pooled. Without it they are refused.")]
    = False,
):
    """Merge shard folders into one records.csv / tokens.jsonl / summary.csv / report.md, with a per-shard table."""
    import pandas as pd

    from ..core.store import RunFolder
    from ..report.merged import report_merged
    from ..run.merge import merge as merge_shards

    runs = merge_shards(folders, out, allow_partial=allow_partial, per_hardware=per_hardware)
    report_merged(out, runs)
    for run in runs:
        print_summary(pd.read_csv(RunFolder(run).summary), f"merged shards ({run})")
    warn_unexplained(runs)
    if len(runs) > 1:
        console.print(f"[yellow]note[/] the shards ran on {len(runs)} hardware keys: one merged run per key, never "
                      f"pooled; see {escape(str(out))}/report.md")
    console.print(f"Merged: {escape(str(out))}/records.csv, tokens.jsonl, summary.csv, report.md")
