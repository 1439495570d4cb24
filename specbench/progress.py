"""Shared rich console, spinners and progress bars (all output to stderr except tables)."""

from __future__ import annotations

from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console(stderr=True)
if not console.is_terminal:
    console = Console(stderr=True, width=160)
out = Console()
if not out.is_terminal:  # CI logs and pipes: wide enough that tables are not truncated
    out = Console(width=160)


@contextmanager
def status(message: str):
    with console.status(message):
        yield


def progress_bar() -> Progress:
    return Progress(
        TextColumn("[bold blue]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
        console=console, transient=False,
    )
