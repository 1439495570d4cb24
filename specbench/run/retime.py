"""Healing disturbed timings (`specbench run --retime N`): a prompt turn whose timing ran beside other work is timed
again before its records are written, and the quiet timing is kept.

A turn is disturbed when any of its methods' timings is: the /proc reading (core/contention.py: other processes
used over 0.25 cores, or the hypervisor stole over 5%) or the outlier test (noise.py: its time per forward over 1.5x
its method's median among the earlier kept rows of this dataset, and beyond the turn's other methods). Then every
method of the turn is timed again, not only the slow one, so that the speedup of that turn still compares timings
taken side by side; each try rotates the order once more (as work.interleaved rotates it per prompt), so that a
recurring burst does not land on the same method. Tries stop at the first quiet one, or after N; then the try with
the fewest disturbed seconds is kept and its disturbed rows are flagged (`timing_disturbed`), for the noise guard.
Each record says how many timings its turn took (`timing_tries`).

A machine that is busy throughout cannot be waited out, and re-timing every turn there would triple the run for
nothing: after GIVE_UP turns in a row that re-timing could not heal, turns are only flagged, until a turn is timed
quiet again (then re-timing resumes).

A re-timing uses the turn's own prompt ids and seed, so it generates the same tokens; a try whose tokens differ
(nondeterministic kernels) is not used, since the next turn's prompt was built from the first answer.
Batch > 1 jobs are flagged, not re-timed (one job decodes many prompts at once).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from ..core import contention
from . import noise
from .records import TurnResult


GIVE_UP = 3  # turns in a row left disturbed after re-timing: the machine is busy throughout, stop re-timing


class History:
    """Per dataset x method label: the time per forward of its kept, quiet turns so far (the outlier test's
    reference; disturbed rows are left out so that they do not raise the median), and how many turns in a row
    re-timing could not heal."""

    def __init__(self):
        self.forward_ms: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.unhealed = 0

    @classmethod
    def of_run(cls, run_dir: Path) -> History:
        """A resumed run's history: the kept quiet batch-1 rows of its records.csv (empty for a new run)."""
        history, path = cls(), Path(run_dir) / "records.csv"
        try:
            records = pd.read_csv(path, dtype=str, keep_default_na=False)
        except (OSError, pd.errors.EmptyDataError):  # no records yet
            return history
        if records.empty or "forward_ms" not in records:
            return history
        quiet = records[~records.get("timing_disturbed", "").str.lower().isin(["true", "1"])]
        quiet = quiet[quiet.get("batch_size", "1").isin(["1", ""])]
        for (dataset, label), rows in quiet.groupby(["dataset", "method"]):
            history.forward_ms[(str(dataset), str(label))] = pd.to_numeric(rows.forward_ms, errors="coerce").dropna(
            ).tolist()
        return history

    def slowness(self, dataset: str, r: TurnResult) -> float:
        return noise.slowness(r.forward_ms, self.forward_ms[(dataset, r.label)])

    def keep(self, dataset: str, rows: dict[str, TurnResult]) -> None:
        for label, r in rows.items():
            if not r.disturbed:
                self.forward_ms[(dataset, label)].append(r.forward_ms)


def disturbed(rows: dict[str, TurnResult], history: History, dataset: str) -> set[str]:
    """The labels of one turn's rows whose timing is disturbed: by /proc, or the outlier test."""
    busy = {label for label, r in rows.items() if contention.disturbed(r.noise)}
    return busy | noise.outliers({label: history.slowness(dataset, r) for label, r in rows.items()})


def heal_prompt(retime_turn: Callable[[str, TurnResult, int], TurnResult], dataset: str,
                results: dict[str, list[TurnResult]], labels: list[str], history: History, retime: int,
                say: Callable[[str], None] = lambda text: None) -> None:
    """Judge, and re-time up to `retime` times, every turn of one prompt (results: label -> its turns, as
    Runner.run_prompt returns them; replaced in place by the kept timings, with `tries` and `disturbed` set).
    retime_turn(label, first timing, position in this try's order) times one method's turn again."""
    turns = sorted({r.turn for rows in results.values() for r in rows})
    for turn in turns:
        first = {label: r for label, rows in results.items() for r in rows if r.turn == turn}
        kept, bad = first, disturbed(first, history, dataset)
        tries = 1
        if bad and history.unhealed == GIVE_UP:
            say(f"{dataset}: the machine stayed busy through {GIVE_UP} re-timed turns; flagging, not re-timing")
        while bad and tries <= retime and history.unhealed < GIVE_UP:
            order = _rotated([label for label in labels if label in first], tries)
            say(f"{dataset} re-timing turn {turn} ({', '.join(sorted(bad))} disturbed), try {tries + 1}")
            again = {label: retime_turn(label, first[label], position) for position, label in enumerate(order)}
            tries += 1
            if any(again[label].gen.tokens != first[label].gen.tokens for label in again):
                continue  # other tokens: not the same turn any more (see the module's note)
            again_bad = disturbed(again, history, dataset)
            if _disturbed_s(again, again_bad) < _disturbed_s(kept, bad):
                kept, bad = again, again_bad
        if tries > 1 or not bad:  # a quiet first timing, or one re-timed: is the machine still busy throughout?
            history.unhealed = history.unhealed + 1 if bad else 0
        kept = {label: dataclasses.replace(r, tries=tries, disturbed=label in bad) for label, r in kept.items()}
        history.keep(dataset, kept)
        for label, rows in results.items():
            results[label] = [kept[label] if r.turn == turn else r for r in rows]


def _rotated(labels: list[str], shift: int) -> list[str]:
    shift %= max(len(labels), 1)
    return labels[shift:] + labels[:shift]


def _disturbed_s(rows: dict[str, TurnResult], bad: set[str]) -> float:
    """Seconds of one try that ran disturbed (the guard weighs time, not rows: noise.py)."""
    return sum(r.seconds for label, r in rows.items() if label in bad)
