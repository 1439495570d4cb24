"""Training-only prompt sources: real stdlib code stubs and templated word problems, deterministic, in the
benchmark sets' own instructions, and mixable with datasets through --data a,b."""

from __future__ import annotations

import ast

import pytest

from specbench.data import datasets as ds
from specbench.data import trainsets
from specbench.train.selfdistill import check_sources, load_source, source_names
from specbench.errors import SpecbenchError


def test_stdlib_stubs_are_documented_python_signatures():
    stubs = trainsets.stdlib_stubs(200)
    assert len(stubs) == 200 and len(set(stubs)) == 200
    assert stubs == trainsets.stdlib_stubs(200)  # same order every time (held-out prompts stay held out)
    for stub in stubs:
        fn = ast.parse(stub).body[0]  # parses: a def whose body is only its docstring
        assert isinstance(fn, ast.FunctionDef) and not fn.name.startswith("_")
        assert len(fn.body) == 1 and ast.get_docstring(fn)


def test_word_problems_are_deterministic_and_use_every_template():
    problems = [trainsets.word_problem(i) for i in range(len(trainsets.TEMPLATES))]
    assert problems == [trainsets.word_problem(i) for i in range(len(trainsets.TEMPLATES))]
    assert all("{" not in p and p.endswith("?") for p in problems)
    assert len(set(problems)) == len(problems)


def test_sources_use_the_benchmark_instructions():
    code = trainsets.load("stdlib-code", 2)
    maths = trainsets.load("word-problems", 2)
    assert code[0].turns[0].startswith(ds.get_spec("humaneval").template.split("{")[0])
    assert maths[0].turns[0].startswith(ds.get_spec("gsm8k").template.split("{")[0])
    assert load_source("word-problems", 2) == maths


def test_mixes_and_bad_names():
    assert source_names(" alpaca-eval, stdlib-code ,") == ["alpaca-eval", "stdlib-code"]
    with pytest.raises(SpecbenchError, match="names no dataset"):
        source_names(" , ")
    with pytest.raises(SpecbenchError, match="unknown training source"):
        trainsets.load("poems", 3)
    assert check_sources("alpaca-eval,stdlib-code") == ["alpaca-eval", "stdlib-code"]
    with pytest.raises(SpecbenchError, match="unknown source 'poems'.*word-problems"):
        check_sources("alpaca-eval,poems")  # refused before the first source's slow self-distillation
    with pytest.raises(SpecbenchError, match="no such file"):
        check_sources("missing.jsonl")
