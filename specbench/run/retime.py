"""Healing disturbed timings (`specbench run --retime N`): a prompt turn whose timing ran beside other work is timed
again before its records are written.

A turn is disturbed when any of its methods' timings is: the /proc reading (core/machine/contention.py: other
processes used over 0.25 cores, or the hypervisor stole over 5%) or the outlier test (noise.py: its time per forward
over 1.5x its method's median among the earlier kept rows of this dataset, per forward and per token verified, and
beyond the turn's other methods). Then every method of the turn is timed again, `ar` included, so that the speedup
of that turn still compares timings taken side by side; each try rotates the order once more (as work.interleaved
rotates it per prompt), so that a recurring burst does not land on the same method.

Which timing is kept must not depend on one label's own numbers, or the rule cherry-picks: keeping "the try with
the fewest disturbed seconds" kept, for a method truly slow on a prompt (an outlier on every try), its fastest draw
while `ar` kept whatever it drew, which biased that method's speedup up by the minimum of N draws. So:
- tries stop at the first wholly quiet one (no label disturbed), and that try is kept for every label;
- when no try is wholly quiet, every try is kept and each label takes its median timing over them (the try whose
  time is the median; of two, the earlier), flagged (`timing_disturbed`) when that try was disturbed for it.
A median of N tries is what `--repeats` takes too; one burst in three tries does not move it, and a label that is
slow on every try keeps its slow time. The stop rule still reads the timings (a try is quiet when no label is an
outlier), but it judges the whole turn, every label by the same test, and keeps that one try for all of them. Each record says how many timings its turn took (`timing_tries`).

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

from ..core.machine import contention
from ..core.store import RunFolder
from . import noise
from .records import TurnResult


GIVE_UP = 3  # turns in a row left disturbed after re-timing: the machine is busy throughout, stop re-timing


class History:
    """Per dataset x method label: (time per forward, tokens verified per forward) of its kept, quiet turns so far
    (the outlier test's reference; disturbed rows are left out so that they do not raise the median), and how many
    turns in a row re-timing could not heal."""

    def __init__(self):
        self.forward_ms: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
        self.unhealed = 0

    @classmethod
    def of_run(cls, run_dir: Path) -> History:
        """A resumed run's history: the kept quiet batch-1 rows of its records.csv (empty for a new run)."""
        history, path = cls(), RunFolder(run_dir).records
        try:
            records = pd.read_csv(path, dtype=str, keep_default_na=False)
        except (OSError, pd.errors.EmptyDataError):  # no records yet
            return history
        if records.empty or "forward_ms" not in records:
            return history
        quiet = records[~records.get("timing_disturbed", "").str.lower().isin(["true", "1"])]
        quiet = quiet[quiet.get("batch_size", "1").isin(["1", ""])]
        for (dataset, label), rows in quiet.groupby(["dataset", "method"]):
            fwd = pd.to_numeric(rows.forward_ms, errors="coerce")
            drafted = rows["drafted"] if "drafted" in rows else pd.Series("0", index=rows.index)
            forwards = rows["target_forwards"] if "target_forwards" in rows else pd.Series("1", index=rows.index)
            wide = [noise.width(d or 0, f or 1) for d, f in zip(drafted, forwards)]
            history.forward_ms[(str(dataset), str(label))] = [(f, w) for f, w in zip(fwd, wide) if pd.notna(f)]
        return history

    def slowness(self, dataset: str, r: TurnResult) -> float:
        return noise.slowness(r.forward_ms, self.forward_ms[(dataset, r.label)], _width(r))

    def keep(self, dataset: str, rows: dict[str, TurnResult]) -> None:
        for label, r in rows.items():
            if not r.disturbed:
                self.forward_ms[(dataset, label)].append((r.forward_ms, _width(r)))


def _width(r: TurnResult) -> float:
    return noise.width(getattr(r.gen, "drafted", 0), r.gen.target_forwards)


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
        taken = [(first, disturbed(first, history, dataset))]  # (rows, their disturbed labels) per usable try
        tries = 1
        if taken[0][1] and history.unhealed == GIVE_UP:
            say(f"{dataset}: the machine stayed busy through {GIVE_UP} re-timed turns; flagging, not re-timing")
        while taken[-1][1] and tries <= retime and history.unhealed < GIVE_UP:
            order = _rotated([label for label in labels if label in first], tries)
            say(f"{dataset} re-timing turn {turn} ({', '.join(sorted(taken[-1][1]))} disturbed), try {tries + 1}")
            again = {label: retime_turn(label, first[label], position) for position, label in enumerate(order)}
            tries += 1
            if any(again[label].gen.tokens != first[label].gen.tokens for label in again):
                continue  # other tokens: not the same turn any more (see the module's note)
            taken.append((again, disturbed(again, history, dataset)))
        quiet = not taken[-1][1]
        if tries > 1 or quiet:  # a quiet first timing, or one re-timed: is the machine still busy throughout?
            history.unhealed = 0 if quiet else history.unhealed + 1
        kept = {label: dataclasses.replace(r, tries=tries, disturbed=bad) for label, (r, bad) in _kept(taken).items()}
        history.keep(dataset, kept)
        for label, rows in results.items():
            results[label] = [kept[label] if r.turn == turn else r for r in rows]


def _kept(taken: list[tuple[dict[str, TurnResult], set[str]]]) -> dict[str, tuple[TurnResult, bool]]:
    """label -> (kept timing, still disturbed): the last try when it was wholly quiet (tries stop there), else each
    label's median try over all of them (the same rule for every label, `ar` included)."""
    rows, bad = taken[-1]
    if not bad:
        return {label: (r, False) for label, r in rows.items()}
    out = {}
    for label in taken[0][0]:
        ranked = sorted(range(len(taken)), key=lambda i: (taken[i][0][label].seconds, i))
        n = len(ranked)
        pick = ranked[(n - 1) // 2] if n % 2 else min(ranked[n // 2 - 1], ranked[n // 2])  # of two, the earlier
        out[label] = (taken[pick][0][label], label in taken[pick][1])
    return out


def _rotated(labels: list[str], shift: int) -> list[str]:
    shift %= max(len(labels), 1)
    return labels[shift:] + labels[:shift]
