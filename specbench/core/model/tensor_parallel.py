"""Tensor parallelism (--tp N): transformers' tp_plan="auto" under torchrun. Every rank loads its shard of each
layer and runs the same decode loop (the same tokens: greedy decoding is deterministic, sampling uses the same
seed); only rank 0 writes records, run.yaml, profiles and reports.

Every forward is collective, so the ranks must run the same forwards in the same order, with the same shapes. Any
decision that changes the work is therefore taken once, on rank 0, and handed to every rank (`from_writer`,
`on_writer`): which prompts a resumed run still owes (only rank 0 has the run folder; the others write scratch), the
reference tokens a lossless check and its explanation read, each timed turn's wall time and /proc reading (from
which retime.py decides whether to time a turn again, and the outlier test judges it), and the drafting time a
`--tree auto` tree is built from. Left to each rank, those differ (a rank's clock and its view of the machine are its
own), and a rank that goes elsewhere leaves the others waiting in a collective for ever. `same_on_every_rank` turns
what must agree but is derived on each rank (the trees the methods resolved) into a refusal instead of a hang.

The ranks of one machine run side by side on purpose: each files its pid as a sibling of the run
(contention.watching_run), so the noise guard records their CPU time as `sibling_cpu`, not as foreign load."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import TypeVar

from ...errors import SpecbenchError

T = TypeVar("T")


def launched_ranks() -> int:
    """How many processes torchrun started (WORLD_SIZE), 1 when not under torchrun."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def rank() -> int:
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def is_writer() -> bool:
    """Whether this process writes files: rank 0, or the only process."""
    return rank() == 0


def rank_out(out):
    """The run folder this process writes: `out` on rank 0; on other ranks a scratch folder of their own (they run
    the same decode loop, their forwards being collective, but their records are rank 0's and are not kept)."""
    if is_writer():
        return out
    import tempfile
    from pathlib import Path

    return Path(tempfile.mkdtemp(prefix=f"specbench-rank{rank()}-"))


def check_launch(tp: int) -> None:
    """Refuse --tp N outside a torchrun launch of N processes (and a torchrun launch without --tp)."""
    ranks = launched_ranks()
    if tp > 1 and ranks != tp:
        where = "outside torchrun" if ranks == 1 else f"under torchrun with {ranks} processes"
        raise SpecbenchError(f"--tp {tp} runs {where}: launch it as `torchrun --nproc-per-node {tp} -m specbench "
                             f"... --tp {tp}` (one process per tensor-parallel rank)")
    if tp == 1 and ranks > 1:
        raise SpecbenchError(f"launched under torchrun with {ranks} processes but without --tp {ranks}: every "
                             f"process would run the whole benchmark; add --tp {ranks}")


def active() -> bool:
    """Whether this process is one of several ranks with their process group up (transformers starts it when it
    loads a model with tp_plan), so that collectives can be called."""
    if launched_ranks() < 2:
        return False
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def from_writer(value: T) -> T:
    """Rank 0's `value`, on every rank (what the others pass is ignored); `value` itself without tensor parallel."""
    if not active():
        return value
    import torch.distributed as dist

    box = [value if is_writer() else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def on_writer(decide: Callable[[], T]) -> T:
    """Call `decide` on rank 0 only and hand its result to every rank. A refusal there is every rank's: raised on
    rank 0 as it was, on the others as a SpecbenchError with its words (rather than leaving them in a collective)."""
    if not active():
        return decide()
    outcome, failure = None, None
    if is_writer():
        try:
            outcome = ("value", decide())
        except Exception as exc:  # noqa: BLE001 (handed on, then raised again below)
            failure, outcome = exc, ("refused", str(exc) if isinstance(exc, SpecbenchError)
                                     else f"rank 0 failed: {type(exc).__name__}: {exc}")
    kind, value = from_writer(outcome)
    if failure is not None:
        raise failure
    if kind == "refused":
        raise SpecbenchError(value)
    return value


def same_on_every_rank(value, what: str) -> None:
    """Refuse on every rank, naming the ranks and their values, when `value` (derived on each rank) differs from
    rank 0's: the ranks would decode with different shapes and wait on each other for ever."""
    if not active():
        return
    import torch.distributed as dist

    values: list = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    odd = [i for i, v in enumerate(values) if v != values[0]]
    if odd:
        said = "; ".join(f"rank {i}: {values[i]}" for i in [0, *odd])
        raise SpecbenchError(f"--tp: the ranks disagree on {what} ({said}); every rank must decode alike. Give them "
                             "the same files (run every rank on one machine, or pass --tree PATH)")


_ranks = ExitStack()  # watch_ranks' pid filing, held for the process's life (one run per torchrun launch)
_watched: list[Path] = []


def watch_ranks() -> None:
    """File this rank's pid beside its fellow ranks' (a folder rank 0 names), so that each rank's noise guard counts
    the others' CPU time as the run's own (`sibling_cpu`), not as foreign load. Once per process; returns when every
    rank has filed."""
    if not active() or _watched:
        return
    import atexit
    import shutil

    import torch.distributed as dist

    from ..machine import contention

    folder = Path(from_writer(tempfile.mkdtemp(prefix="specbench-tp-") if is_writer() else None))
    _ranks.enter_context(contention.watching_run(folder, f"rank{rank():04d}"))  # mkdir on another machine's ranks
    _watched.append(folder)
    if is_writer():  # a rank still reading it then finds no pids, which only ends its sibling readings
        atexit.register(shutil.rmtree, folder, True)
    dist.barrier()  # every rank filed before any is timed
