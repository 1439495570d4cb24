"""Training-only prompt sources for self-distillation (`specbench train drafter|ppd --data NAME[,NAME...]`).

The benchmark sets stay for measuring; these give code and maths prompts that none of them contains, built
offline on any machine:

- `stdlib-code`: public functions of the Python standard library that have a docstring, cut to signature +
  docstring (the body dropped), asked in HumanEval's words. Real code and real documentation, no download.
- `word-problems`: grade-school word problems generated from templates (names, items, numbers drawn from a
  seeded RNG), asked in GSM8K's words. Only the questions matter: the answers distilled are the target's own.

Both are deterministic (fixed order, seed 0), so held-out prompts and caches are stable across runs.
"""

from __future__ import annotations

import ast
import copy
import random
import sys
import sysconfig
from pathlib import Path

from ..errors import SpecbenchError
from . import datasets as ds

SKIP_DIRS = {"site-packages", "dist-packages", "idlelib", "lib2to3", "turtledemo", "ensurepip"}


def cache_tag(name: str) -> str:
    """What a source's prompts depend on, for cache keys: stdlib-code changes with the Python version."""
    return f"{name}-py{sys.version_info[0]}.{sys.version_info[1]}" if name == "stdlib-code" else name


def load(name: str, limit: int) -> list[ds.Prompt]:
    """The first `limit` prompts of a training source."""
    if name not in SOURCES:
        raise SpecbenchError(f"unknown training source {name!r}; choose from {', '.join(SOURCES)}")
    return SOURCES[name][1](limit)


def _stdlib_prompts(limit: int) -> list[ds.Prompt]:
    template = ds.get_spec("humaneval").template
    return [ds.Prompt(id=f"stdlib-{i}", turns=(template.format(prompt=stub),))
            for i, stub in enumerate(stdlib_stubs(limit))]


def _word_prompts(limit: int) -> list[ds.Prompt]:
    template = ds.get_spec("gsm8k").template
    return [ds.Prompt(id=f"word-{i}", turns=(template.format(question=word_problem(i)),)) for i in range(limit)]


# ---------------------------------------------------------------------------------------------------- code

def stdlib_stubs(limit: int) -> list[str]:
    """`def f(args):` + docstring of up to `limit` public stdlib functions, shuffled across modules (seed 0)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    stubs: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if any(part.startswith(("_", "test", "config-")) or part in SKIP_DIRS for part in rel):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        for node in tree.body:
            stub = _stub(node)
            if stub and node.name not in stubs:
                stubs[node.name] = stub
    order = sorted(stubs)
    random.Random(0).shuffle(order)
    return [stubs[name] for name in order[:limit]]


def _stub(node: ast.stmt) -> str | None:
    """A public function's signature and docstring as source (None if private, undocumented or odd-sized)."""
    if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
        return None
    doc = ast.get_docstring(node)
    if not doc or not 40 <= len(doc) <= 600:
        return None
    indented = "\n".join(("    " + line) if line else "" for line in doc.splitlines())
    head = copy.copy(node)  # the same def (every field this Python's ast has), decorators and body dropped
    head.decorator_list, head.body = [], [ast.Pass()]
    signature = ast.unparse(head).rsplit("\n", 1)[0]  # drop the placeholder body
    return f'{signature}\n    """{indented.lstrip()}\n    """\n'


# ---------------------------------------------------------------------------------------------------- maths

NAMES = ["Ava", "Ben", "Chloe", "Diego", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Kate", "Liam",
         "Maya", "Noah", "Olga", "Priya", "Quinn", "Rosa", "Sam", "Tariq", "Uma", "Victor", "Wen", "Zoe"]
ITEMS = ["apples", "books", "stickers", "marbles", "cupcakes", "pencils", "stamps", "cookies", "shells", "cards"]
GOODS = [("notebook", "notebooks"), ("sandwich", "sandwiches"), ("ticket", "tickets"), ("plant", "plants"),
         ("shirt", "shirts"), ("bracelet", "bracelets")]

# Each template's fields: a, b (people), item (plural), good / goods, n1..n4 (small counts), p1, p2 (prices),
# pct (a percentage), h (hours), r (a rate).
TEMPLATES = [
    "{a} has {n1} {item}. {b} gives {a} {n2} more, and then {a} gives away {n3}. How many {item} does {a} have "
    "now?",
    "{a} buys {n1} {goods} at ${p1} each and {n2} more at ${p2} each. How much does {a} spend in total?",
    "A box holds {n4} {item}. {a} fills {n1} boxes and has {n3} {item} left over. How many {item} did {a} have?",
    "{a} earns ${r} an hour and works {h} hours a day for {n2} days. How much money does {a} earn?",
    "{a} reads {n3} pages every day. The book has {n4} pages more than {n1} times that. How many days does it "
    "take {a} to finish the book?",
    "A {good} costs ${p1}. It is on sale for {pct}% off. {a} buys {n2} of them. How much does {a} pay?",
    "{a} is {n2} years older than {b}. In {n3} years {b} will be {n4}. How old is {a} now?",
    "{a} has ${p2}. {a} spends a quarter of it on {goods} and ${p1} on lunch. How much money is left?",
    "There are {n4} students in a school. {pct}% of them take the bus and the rest walk. How many students walk?",
    "{a} runs {n1} miles on Monday, twice as far on Tuesday and {n3} miles less than that on Wednesday. How many "
    "miles does {a} run in the three days?",
    "{a} and {b} share {n4} {item} so that {a} gets {n1} more than {b}. How many {item} does {b} get?",
    "A farm has {n4} chickens and {n2} cows. How many legs do the animals have altogether?",
    "{a} saves ${r} every week. How many weeks does it take to save enough for a {good} that costs ${p2}?",
    "A train travels at {r} miles per hour for {h} hours, then {n1} miles more. How far does it go in total?",
    "{a} bakes {n4} {item} and sells them in packs of {n1} for ${p1} a pack. How much money does {a} make if all "
    "full packs are sold?",
    "{a} had {n4} {item}. {a} lost {pct}% of them and then bought {n3} more. How many {item} does {a} have now?",
]


def word_problem(index: int) -> str:
    """The index-th templated word problem (template cycles, fields from a per-index RNG)."""
    rng = random.Random(index)
    a, b = rng.sample(NAMES, 2)
    good, goods = rng.choice(GOODS)
    fields = {"a": a, "b": b, "item": rng.choice(ITEMS), "good": good, "goods": goods,
              "n1": rng.randint(2, 12), "n2": rng.randint(2, 15), "n3": rng.randint(2, 9),
              "n4": rng.randint(20, 120), "p1": rng.randint(2, 25), "p2": rng.randint(40, 200),
              "pct": rng.choice([10, 20, 25, 30, 40, 50, 75]), "h": rng.randint(2, 9), "r": rng.randint(8, 60)}
    return TEMPLATES[index % len(TEMPLATES)].format(**fields)


# name -> (description for `specbench list datasets`, builder of the first `limit` prompts)
SOURCES = {
    "stdlib-code": ("Python standard-library functions (signature + docstring), HumanEval's instruction",
                    _stdlib_prompts),
    "word-problems": ("templated grade-school word problems, GSM8K's instruction", _word_prompts),
}


def refuse_as_benchmark(name: str) -> None:
    """A training-only source given where benchmark prompts are read (run --dataset, estimate --data): say so."""
    if name in SOURCES and name not in ds.dataset_names():
        raise SpecbenchError(f"{name} is a training-only prompt source (`specbench train ... --data {name}`); "
                             f"benchmark with one of {', '.join(ds.dataset_names())}")
