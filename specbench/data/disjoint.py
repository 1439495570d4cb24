"""Training prompts against benchmark prompts: no training prompt may equal or contain a prompt of a benchmark set.

The benchmark sets are every named dataset (datasets/*.yaml) but the validation set alpaca-eval, which `estimate`
scores guesses on (its first prompts, which trainers hold out) and which the training mix uses from prompt 100 on.
A benchmark prompt is its raw text (a GSM8K question, a HumanEval stub, each MT-Bench turn, a CNN/DM article, a
joined long-context text), whole: a training prompt that contains one, with any instruction around it, is a
benchmark prompt trained on. Texts are compared with whitespace runs collapsed and case folded. Every record of a
set counts, not only its default --limit. Sets are read offline only (SPECBENCH_DATA_DIR, a package, the cache); a
set not found there is named as unchecked, never fetched.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from functools import lru_cache

from ..errors import SpecbenchError
from .joined import joined_records
from .sources import find_records
from .specs import Prompt, dataset_names, get_spec

VALIDATION_SETS = ("alpaca-eval",)  # scored by estimate, held out of training: not a benchmark set


def benchmark_sets() -> list[str]:
    return [name for name in dataset_names() if name not in VALIDATION_SETS]


def normal(text: str) -> str:
    return " ".join(text.split()).casefold()


@lru_cache(maxsize=None)
def benchmark_texts(name: str) -> tuple[str, ...] | None:
    """Every prompt text of a benchmark set (normalised), or None when it is not found offline."""
    spec = get_spec(name)
    try:
        records = (joined_records if spec.join else find_records)(spec, None, None, True)
    except SpecbenchError:
        return None
    texts = []
    for record in records:
        parts = (record.get(spec.turns_field) or []) if spec.turns_field else [record.get(spec.text_field)]
        texts += [normal(str(p)) for p in parts if p and normal(str(p))]
    return tuple(texts)


@dataclass(frozen=True)
class Overlap:
    benchmark: str  # set name
    record: int  # index of the benchmark text in benchmark_texts(set)
    source: str  # training source
    prompt: int  # index among that source's training prompts given


@dataclass(frozen=True)
class DisjointOutcome:
    """The outcome over every benchmark set: overlaps found, sets checked, sets not found offline, training sources
    that are themselves benchmark sets."""

    overlaps: list[Overlap]
    checked: dict[str, int]  # set -> prompts compared
    unchecked: list[str]
    benchmark_sources: list[str]

    @property
    def disjoint(self) -> bool:
        return not self.overlaps and not self.benchmark_sources

    def statement(self) -> str:
        """One line for an artefact's metadata."""
        sets = ", ".join(f"{name} ({n})" for name, n in self.checked.items())
        if self.benchmark_sources:
            return f"NOT disjoint from the benchmark sets: trained on {', '.join(self.benchmark_sources)}"
        if self.overlaps:
            first = self.overlaps[0]
            return (f"NOT disjoint from the benchmark sets: {len(self.overlaps)} training prompt(s) equal or contain "
                    f"a benchmark prompt (first: {first.source} prompt {first.prompt} holds {first.benchmark} "
                    f"prompt {first.record})")
        line = (f"disjoint from every benchmark set: no training prompt equals or contains a prompt of {sets} "
                "(specbench.data.disjoint, checked when trained)")
        return line + (f"; not checked against {', '.join(self.unchecked)} (not found offline)" if self.unchecked
                       else "")


def check(training: dict[str, list[Prompt]]) -> DisjointOutcome:
    """Compare training prompts (source -> its prompts, every turn and system text) with every benchmark set."""
    names = benchmark_sets()
    keys, texts = [], []
    for source, prompts in training.items():
        for i, p in enumerate(prompts):
            keys.append((source, i))
            texts.append(normal("\n".join(((p.system,) if p.system else ()) + tuple(p.turns))))
    # one string of every training text, \x00 between them (no benchmark text holds one), and where each starts
    joined = "\x00".join(texts)
    starts = [0]
    for t in texts[:-1]:
        starts.append(starts[-1] + len(t) + 1)
    overlaps, checked, unchecked = [], {}, []
    for name in names:
        bench = benchmark_texts(name)
        if bench is None:
            unchecked.append(name)
            continue
        checked[name] = len(bench)
        for r, text in enumerate(bench):
            at = joined.find(text)
            while at >= 0:
                source, prompt = keys[bisect.bisect_right(starts, at) - 1]
                overlaps.append(Overlap(name, r, source, prompt))
                at = joined.find(text, at + 1)
    return DisjointOutcome(overlaps, checked, unchecked, [s for s in training if s in names])
