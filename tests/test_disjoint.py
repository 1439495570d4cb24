"""Training prompts never equal or contain a benchmark prompt: the check itself (data/disjoint.py), the default
training sources over the ranges the shipped artefacts are retrained on, and what training does with a prompt that
holds one (left out, named in the metadata)."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from specbench.data import disjoint
from specbench.data.specs import Prompt
from specbench.train.settings import TRAINING_MIX
from specbench.train.selfdistill import load_source, source_names, without_benchmark_prompts

needs_data = pytest.mark.skipif(not os.environ.get("SPECBENCH_DATA_DIR"),
                                reason="needs SPECBENCH_DATA_DIR (the benchmark sets)")
RETRAIN_PROMPTS = 1000  # per source: the ranges docs/training.md's retraining commands use (100..1099)


@pytest.fixture
def fake_benchmarks(monkeypatch):
    """Two benchmark sets of known texts instead of the real ones."""
    texts = {"quiz": (disjoint.normal("What is 2 + 2?"), disjoint.normal("Name a  red fruit.")), "essays": None}
    monkeypatch.setattr(disjoint, "benchmark_sets", lambda: list(texts))
    monkeypatch.setattr(disjoint, "benchmark_texts", texts.get)
    return texts


def test_equal_or_containing_prompts_are_found(fake_benchmarks):
    training = {"mine": [Prompt("a", ("Please answer:\n\nwhat is 2 +  2?",)), Prompt("b", ("What is 2 + 3?",)),
                         Prompt("c", ("name a red fruit.",))],
                "other": [Prompt("d", ("Name a red fruit",))]}  # without the full stop: not the benchmark text
    found = disjoint.check(training)
    assert [(o.benchmark, o.record, o.source, o.prompt) for o in found.overlaps] == [("quiz", 0, "mine", 0),
                                                                                   ("quiz", 1, "mine", 2)]
    assert found.checked == {"quiz": 2} and found.unchecked == ["essays"] and not found.disjoint
    assert found.statement().startswith("NOT disjoint") and "mine prompt 0 holds quiz prompt 0" in found.statement()
    clean = disjoint.check({"other": training["other"]})
    assert clean.disjoint and "no training prompt equals or contains a prompt of quiz (2)" in clean.statement()
    assert "not checked against essays" in clean.statement()
    kept, dropped = without_benchmark_prompts("mine", training["mine"], 100)
    assert [p.id for p in kept] == ["b"] and dropped == (100, 102)
    assert disjoint.check({"quiz": training["other"]}).statement() == ("NOT disjoint from the benchmark sets: trained "
                                                                       "on quiz")


@needs_data
def test_the_training_mix_holds_no_benchmark_prompt():
    """Every default source over prompts 100..1099 (as many as it has), less what training leaves out, against every
    prompt of every benchmark set; the held-out prompts 0..99 are no training prompt of their source either."""
    disjoint.benchmark_texts.cache_clear()
    assert set(disjoint.benchmark_sets()) == {"mt-bench", "gsm8k", "humaneval", "cnn-dm", "cnn-dm-long", "spec-bench"}
    kept, dropped = {}, {}
    for name in source_names(TRAINING_MIX):
        prompts = load_source(name, 100 + RETRAIN_PROMPTS)
        kept[name], dropped[name] = without_benchmark_prompts(name, prompts[100:], 100)
        held = {p.turns for p in prompts[:100]}
        assert not held & {p.turns for p in kept[name]}, name
        assert len(kept[name]) >= 700, name  # ~10x the 360 sequences of the artefacts shipped before
    found = disjoint.check(kept)
    assert found.disjoint and not found.unchecked, found.statement()
    assert found.checked["gsm8k"] == 1319 and found.checked["humaneval"] == 164 and found.checked["mt-bench"] == 160
    assert found.checked["spec-bench"] >= 480  # its 480 questions, MT-Bench's with both turns
    # AlpacaEval holds two MT-Bench first turns (prompts 791 and 801); the other sources hold none
    assert dropped == {"alpaca-eval": (791, 801), **{n: () for n in kept if n != "alpaca-eval"}}


@needs_data
def test_training_leaves_out_a_benchmark_prompt_and_says_so(deep, tmp_path, monkeypatch):
    from specbench.data import datasets as ds
    from specbench.methods.medusa.training import MedusaConfig, train

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    question = ds.load_prompts("gsm8k", 1)[1][0].turns[0].split("\n\n", 1)[1]  # GSM8K's first question, raw
    data = tmp_path / "p.jsonl"
    rows = [{"instruction": f"Count {i} {i + 1} {i + 2} now."} for i in range(5)]
    rows[3] = {"instruction": f"Here is a problem.\n{question}\nSolve it."}
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = train(MedusaConfig(model=deep.spec, data=str(data), prompts=4, held_out=1, new_tokens=8, dtype="float32",
                             device="cpu", steps=1, positions=4, out=tmp_path / "m"))
    meta = yaml.safe_load((out / "medusa.yaml").read_text())
    facts = meta["data"]
    assert facts["sources"][str(data)] == {"prompts": "1..4", "sequences": 3,
                                           "dropped": {"prompts": [3], "why": "they contain a benchmark prompt"}}
    assert facts["disjoint"].startswith("disjoint from every benchmark set") and "gsm8k (1319)" in facts["disjoint"]
    assert facts["held_out"].startswith("prompts 0..0 of each source")
