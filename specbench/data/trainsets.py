"""Training-only prompt sources for self-distillation (`specbench train ... --dataset NAME[,NAME...]`).

The benchmark sets stay for measuring; these give chat, code, maths and summarising prompts that none of them
contains (tests/test_disjoint.py and data/disjoint.py check it), built offline on any machine:

- `stdlib-code`: public functions, then methods, of the Python standard library that have a docstring, cut to
  signature + docstring (the body dropped), asked in HumanEval's words. Real code and documentation, no download.
- `word-problems`: grade-school word problems from 40 templates (word_problems.py), asked in GSM8K's words. Only
  the questions matter: the answers distilled are the target's own.
- `stdlib-docs`: the standard library's class and module docstrings and pydoc's language reference topics, each
  asked twice: summarised in three sentences (CNN/DM's words) and explained with an example.
- `chat-tasks`: everyday chat requests from 30 templates (chat_tasks.py): writing, explaining, advice, planning.

All are deterministic (fixed order and seeds; a text met before is skipped, so no two prompts of a source are the
same), so held-out prompts and caches are stable across runs.
"""

from __future__ import annotations

import sys
from itertools import count

from ..errors import SpecbenchError
from . import datasets as ds
from .chat_tasks import chat_task
from .stdlib_text import stdlib_docs, stdlib_stubs
from .word_problems import TEMPLATES, word_problem

__all__ = ["SOURCES", "TEMPLATES", "cache_tag", "chat_task", "load", "refuse_as_benchmark", "stdlib_docs",
           "stdlib_stubs", "word_problem"]

# what a source's prompts depend on besides its name: stdlib sources change with the Python version; a version
# tag changes when a source's prompts change (word-problems v2: 40 templates; stdlib-code v2: methods after the
# functions), so caches of the old prompts are not reused
VERSIONS = {"word-problems": "v2", "stdlib-code": "v2"}


def cache_tag(name: str) -> str:
    """What a source's prompts depend on, for cache keys."""
    tag = f"{name}-{VERSIONS[name]}" if name in VERSIONS else name
    return f"{tag}-py{sys.version_info[0]}.{sys.version_info[1]}" if name.startswith("stdlib") else tag


def load(name: str, limit: int) -> list[ds.Prompt]:
    """The first `limit` prompts of a training source (fewer when it has fewer)."""
    if name not in SOURCES:
        raise SpecbenchError(f"unknown training source {name!r}; choose from {', '.join(SOURCES)}")
    return SOURCES[name][1](limit)


def _stdlib_prompts(limit: int) -> list[ds.Prompt]:
    template = ds.get_spec("humaneval").template
    return [ds.Prompt(id=f"stdlib-{i}", turns=(template.format(prompt=stub),))
            for i, stub in enumerate(stdlib_stubs(limit))]


def _unique(texts, limit: int) -> list[str]:
    """The first `limit` distinct texts of an endless sequence."""
    seen: dict[str, None] = {}
    for text in texts:
        if len(seen) >= limit:
            break
        seen.setdefault(text)
    return list(seen)


def _word_prompts(limit: int) -> list[ds.Prompt]:
    template = ds.get_spec("gsm8k").template
    return [ds.Prompt(id=f"word-{i}", turns=(template.format(question=q),))
            for i, q in enumerate(_unique(map(word_problem, count()), limit))]


def _chat_prompts(limit: int) -> list[ds.Prompt]:
    return [ds.Prompt(id=f"chat-{i}", turns=(text,)) for i, text in enumerate(_unique(map(chat_task, count()),
                                                                                           limit))]


SUMMARY = "Summarize the following documentation in three sentences.\n\n{text}"
EXPLAIN = "Explain what the Python {kind} `{name}` is for, in plain words, and give a short example.\n\n{text}"


def _docs_prompts(limit: int) -> list[ds.Prompt]:
    """Each text twice, first all summaries then all explanations (both in stdlib_docs' order)."""
    docs = stdlib_docs()
    asks = [SUMMARY.format(text=text) for _, _, text in docs]
    asks += [EXPLAIN.format(kind=kind, name=name, text=text) for kind, name, text in docs]
    return [ds.Prompt(id=f"docs-{i}", turns=(text,)) for i, text in enumerate(_unique(asks, limit))]


# name -> (description for `specbench list datasets`, builder of the first `limit` prompts)
SOURCES = {
    "stdlib-code": ("Python standard-library functions and methods (signature + docstring), HumanEval's "
                    "instruction", _stdlib_prompts),
    "word-problems": ("templated grade-school word problems (40 templates), GSM8K's instruction", _word_prompts),
    "stdlib-docs": ("Python standard-library documentation to summarise or explain", _docs_prompts),
    "chat-tasks": ("templated everyday chat requests (30 templates)", _chat_prompts),
}


def refuse_as_benchmark(name: str) -> None:
    """A training-only source given where benchmark prompts are read (run --dataset, estimate --dataset): say so."""
    if name in SOURCES and name not in ds.dataset_names():
        raise SpecbenchError(f"{name} is a training-only prompt source (`specbench train ... --dataset {name}`); "
                             f"benchmark with one of {', '.join(ds.dataset_names())}")
