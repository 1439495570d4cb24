"""Shared rich console, spinners and progress bars (all output to stderr except tables)."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

console = Console(stderr=True)
if not console.is_terminal:
    console = Console(stderr=True, width=160)
out = Console()
if not out.is_terminal:  # CI logs and pipes: wide enough that tables are not truncated
    out = Console(width=160)


SAY_DONE_AFTER_S = 2.0  # a phase that took longer says how long when it ends
HEARTBEAT_S = 30.0  # logs and pipes (no spinner): a line this often while a phase goes on


@contextmanager
def status(message: str):
    """A long phase (loading, de-quantising, warm-up, compiling): a spinner on a terminal, a line when it starts and
    every HEARTBEAT_S seconds in logs and pipes, and its duration when it ends. Nested phases update the one shown;
    inside a progress bar (a live display already running) they print their lines instead of a second spinner."""
    start = time.monotonic()
    live = getattr(console, "_live_stack", None)
    if console.is_terminal and _shown:  # nested: the outer spinner says what runs now
        outer, before = _shown[-1], _shown[-1].status
        outer.update(message)
        try:
            yield
        finally:
            outer.update(before)
    elif console.is_terminal and not live:
        with console.status(message) as shown:
            _shown.append(shown)
            try:
                yield
            finally:
                _shown.pop()
    else:
        console.print(f"{message} ...", highlight=False)
        stop = threading.Event()
        beat = threading.Thread(target=_heartbeat, args=(message, start, stop), daemon=True)
        beat.start()
        try:
            yield
        finally:
            stop.set()
    took = time.monotonic() - start
    if took >= SAY_DONE_AFTER_S:
        console.print(f"[dim]{escape(message)}: done in {_duration(took)}[/]")


_shown: list = []  # the spinner on screen (rich allows one live display at a time)


def _heartbeat(message: str, start: float, stop: threading.Event) -> None:
    while not stop.wait(HEARTBEAT_S):
        console.print(f"{message}: still going ({_duration(time.monotonic() - start)})", highlight=False)


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 90 else f"{seconds // 60:.0f} min {seconds % 60:02.0f} s"


def progress_bar() -> Progress:
    cls = Progress if console.is_terminal else LogProgress
    return cls(
        TextColumn("[bold blue]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
        console=console, transient=False,
        speed_estimate_period=SPEED_WINDOW_S,
    )


# The ETA's rate is taken over this much of the recent past: a run's steps (a method's turn: seconds to minutes) are
# uneven, and rich's default 30 s holds one or two of them, so its ETA would swing with whichever method ran last.
SPEED_WINDOW_S = 600.0


class LogProgress(Progress):
    """For logs and pipes (no live bar there): a plain line at every 10% of a task, or each minute if slower."""

    LINE_EVERY_S = 60.0

    def __init__(self, *columns, **kwargs):
        super().__init__(*columns, **kwargs)
        self._logged: dict = {}  # task id -> (tenths done, time of the last line)

    def update(self, task_id, **kwargs) -> None:
        super().update(task_id, **kwargs)
        task = next(t for t in self.tasks if t.id == task_id)
        if not task.total or task.finished:
            return  # the finished bar is printed once when the progress stops
        tenths = int(10 * task.completed / task.total)
        last_tenths, last_t = self._logged.get(task_id, (0, task.start_time or 0.0))
        now = self.get_time()
        if tenths > last_tenths or now - last_t >= self.LINE_EVERY_S:
            self._logged[task_id] = (tenths, now)
            left = f", about {task.time_remaining:.0f} s left" if task.time_remaining else ""
            info = f" {task.fields.get('info')}" if task.fields.get("info") else ""
            self.console.print(f"{task.description}: {task.completed:g}/{task.total:g}{info} "
                               f"({task.elapsed or 0:.0f} s{left})", highlight=False)


def quiet_libraries() -> None:
    """transformers' logging, progress bars and user warnings off (the CLI's entry point; shard workers on Ray).

    Through the environment, which transformers and huggingface_hub read when they load, so that the entry point
    imports neither (`specbench --help` stays fast); where transformers is loaded already, directly as well. A
    user's own TRANSFORMERS_VERBOSITY or HF_HUB_DISABLE_PROGRESS_BARS wins."""
    import logging
    import os
    import sys
    import warnings

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=UserWarning, module="transformers")
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
