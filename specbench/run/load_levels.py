"""Load levels through the one run loop (benchmark.py), for a backend whose requests a server schedules: a level
(one request at a time, N in flight, Poisson arrivals at R per second) is measured whole by the backend, every
server of the run in turn at that level, since how many requests are in flight is the measurement. Everything
around it is the runner's, as for turns: which levels are still to run (--resume), the lossless check against
`ar` at the same level (Runner.check_prompt: a mismatch explained by the backend), the records
(records.build_record), Ctrl-C. The summary's speedup and its interval come from these records, as every
backend's do (report/summary.py over run/intervals.py).

A level is what a resumed run keeps, whole: every server's phase of a level runs in one session, back to back, so
each spec-vs-ar pairing (the speedup, the lossless check) is of rows measured together; only different levels may
come from different sessions. A level is finished once the backend filed it (`file_level`, after its rows are
written); on --resume the rows of levels it did not file are dropped and those levels run again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pandas as pd
from rich.markup import escape

from ..core.store import RunFolder
from ..data import datasets as ds
from ..progress import console
from .backend import Backend
from .config import RunConfig
from .records import TurnResult, build_record
from .resume import Interrupted, keep_tokens, mark_complete
from .results import RECORD_COLUMNS, Record, RecordWriter, with_batch_columns
from .runner import Runner
from .work import LoadedDataset

KEPT = "only whole load levels are kept: every server's phase of a level, written together"


@dataclass(frozen=True)
class Level:
    """One load level: records.csv's batching and batch_size columns, and an open loop's arrival rate."""

    batching: str  # "-" (one request at a time), "closed" (N in flight), "poisson@R" (an open loop)
    batch_size: int  # requests in flight: 1 at "-", N in a closed loop, 0 in an open loop
    rate: float | None = None  # requests per second (an open loop)

    @property
    def key(self) -> tuple[int, str]:
        return self.batch_size, self.batching

    def describe(self) -> str:
        return {"-": "concurrency 1", "closed": f"concurrency {self.batch_size}"}.get(self.batching, self.batching)


@dataclass
class LevelRow:
    """One answered request of a level, as the runner checks and records it."""

    dataset: str
    prompt: ds.Prompt
    result: TurnResult  # label, turn, ids (the conversation sent), generation, seconds, batch columns, tries
    model: str  # records' `model`: the name the server was asked for
    prompt_tokens: int  # the server's count of the prompt's tokens
    saved: list = field(default_factory=list)  # tokens.jsonl's tokens (token strings, or the text)


@dataclass
class LevelRun:
    """What a backend measured at one level: its answered requests (failed ones are the backend's to file)."""

    level: Level
    rows: list[LevelRow] = field(default_factory=list)
    own: object = None  # what the backend files of the level itself (a server's phases and failed requests)


class LevelBackend(Backend, Protocol):
    """A backend that measures load levels (Measures.phases): the levels of the run in order, one level measured
    whole, the levels it filed earlier (--resume) and the filing of a finished one (its own file: serving.json)."""

    def levels(self) -> list[Level]:
        """Every load level of the run, in the order they run."""

    def measure_level(self, level: Level, items: Sequence[tuple[str, ds.Prompt]]) -> LevelRun:
        """Every (dataset, prompt) conversation at `level` on every server of the run."""

    def finished_levels(self, out: Path) -> set[tuple[int, str]]:
        """--resume: the levels (Level.key) the interrupted run filed whole; what it filed of others is forgotten."""

    def file_level(self, out: Path, run: LevelRun) -> None:
        """After a level's rows are written: the backend's own record of it (phases, failures, counters)."""


def run_levels(cfg: RunConfig, out: Path, backend: LevelBackend, loaded: list[LoadedDataset]) -> Path:
    """Every pending load level, measured by the backend, checked and written whole; returns the run folder,
    marked complete. Ctrl-C keeps the finished levels (--resume runs the others)."""
    runner = Runner(cfg, backend)
    levels = backend.levels()
    kept = keep_levels(out, backend.finished_levels(out)) if cfg.resume else set()
    pending = [level for level in levels if level.key not in kept]
    if kept:
        console.print(f"Resuming {escape(str(out))}: {len(kept)} load level(s) kept, {len(pending)} to go.")
    items = [(d.name, p) for d in loaded for p in d.prompts]
    writer = RecordWriter(out)
    try:
        for level in pending:
            run = backend.measure_level(level, items)
            write_level(runner, run, writer)
            backend.file_level(out, run)
    except KeyboardInterrupt:
        writer.close()
        raise Interrupted(out, sum(1 for _ in open(RunFolder(out).records)) - 1, KEPT) from None
    writer.close()
    backend.close(out)
    mark_complete(out)
    return out


def write_level(runner: Runner, run: LevelRun, writer: RecordWriter) -> None:
    """A level's rows checked per prompt (every server's turns against ar's at this level: Runner.check_prompt)
    and written, prompt by prompt in the datasets' order."""
    prompts: dict[tuple[str, str], dict[str, list[TurnResult]]] = {}
    rows: dict[tuple, LevelRow] = {}
    for row in run.rows:
        r = row.result
        prompts.setdefault((row.dataset, row.prompt.id), {}).setdefault(r.label, []).append(r)
        rows[(r.label, row.dataset, row.prompt.id, r.turn)] = row
    for (dataset, prompt_id), results in prompts.items():
        for turns in results.values():
            turns.sort(key=lambda r: r.turn)
        prompt = rows[next((r.label, dataset, prompt_id, r.turn) for t in results.values() for r in t)].prompt
        for label, r, outcome in runner.check_prompt(dataset, prompt, results, {}):
            row = rows[(label, dataset, prompt_id, r.turn)]
            record = build_record(runner.cfg, runner.backend.env, row.model, label, dataset, prompt, r, outcome,
                                  prompt_tokens=row.prompt_tokens)
            writer.write(record, row.saved)


def keep_levels(out: Path, finished: set[tuple[int, str]]) -> set[tuple[int, str]]:
    """--resume: records.csv and tokens.jsonl keep the rows of the finished levels only (a level cut off by Ctrl-C
    runs again whole); returns the finished levels."""
    path = RunFolder(out).records
    if not path.exists() or path.stat().st_size == 0:
        keep_tokens(out, set())
        return set(finished)
    df = with_batch_columns(pd.read_csv(path, dtype={"prompt_id": str, "batching": str}, keep_default_na=False))
    keep = df[[(int(b), str(m)) in finished for b, m in zip(df.batch_size, df.batching)]]
    for column in RECORD_COLUMNS:
        if column not in keep:
            keep = keep.assign(**{column: getattr(Record, column, "")})
    keep[RECORD_COLUMNS].to_csv(path, index=False)
    keep_tokens(out, {(m, d, str(p), int(b), str(g)) for m, d, p, b, g in
                      zip(keep.method, keep.dataset, keep.prompt_id, keep.batch_size, keep.batching)})
    return set(finished)
