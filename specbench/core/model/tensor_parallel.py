"""Tensor parallelism (--tp N): transformers' tp_plan="auto" under torchrun. Every rank loads its shard of each
layer and runs the same decode loop (the same tokens: greedy decoding is deterministic, sampling uses the same
seed); only rank 0 writes records, run.yaml, profiles and reports."""

from __future__ import annotations

import os

from ...errors import SpecbenchError


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
