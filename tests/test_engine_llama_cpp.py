"""--engine llama.cpp on the embedded GGUF (llama-cpp-python in process): records with the engine column, tau from
the engine's own hooks (exact on a draft whose answer is known), the lossless check, and the error paths."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from specbench.cli import app
from specbench.errors import SpecbenchError
from specbench.run.config import RunConfig

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install "
                                "'specbench[llamacpp]'; `make test` installs it)")

from specbench.backends import llama_cpp as engine  # noqa: E402  (needs llama_cpp importable for its hooks)
from specbench.backends.common import check_methods  # noqa: E402
from specbench.run.work import load_datasets as load_work  # noqa: E402

# 1 thread: llama.cpp's OpenMP threads spin at their barriers, and on a loaded 2-core runner 2 threads crawl
QUICK = dict(max_new_tokens=24, threads=1, warmup=0, engine="llama.cpp", model="smollm2-135m")
REPEATS = "Repeat this line exactly three times: alpha beta gamma delta, alpha beta gamma delta."


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "repeat.jsonl"
    rows = [{"id": "repeat", "prompt": REPEATS}, {"id": "count", "prompt": "Count from 1 to 20, comma separated."}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def llama_run(prompts, tmp_path_factory):
    """One finished ar + pld run on the two prompts, read by the tests below (copied before any change)."""
    from specbench.run.benchmark import run

    return run(RunConfig(methods=("ar", "pld"), datasets=(str(prompts),), out=tmp_path_factory.mktemp("r") / "run",
                         **QUICK))


def test_ar_and_pld_records(llama_run):
    """Both methods' rows carry engine=llama.cpp and the serving columns; ar evaluates once per token (tau 1),
    prompt lookup verifies drafts (tau > 1 on a prompt that repeats itself); pld is checked against ar."""
    out = llama_run
    records = pd.read_csv(out / "records.csv", keep_default_na=False, dtype={"lossless": str})
    assert len(records) == 4 and set(records.engine) == {"llama.cpp"} and set(records.dtype) == {"Q4_1"}
    ar, pld = records[records.method == "ar"], records[records.method == "pld"]
    assert (ar.target_forwards == ar.new_tokens).all() and (ar.tau == 1.0).all() and (ar.drafted == 0).all()
    repeat = pld[pld.prompt_id == "repeat"].iloc[0]
    assert repeat.tau > 1 and repeat.accepted_drafts > 0 and repeat.drafted >= repeat.accepted_drafts
    assert repeat.target_forwards + repeat.accepted_drafts >= repeat.new_tokens  # each forward adds <= 1 own token
    assert all(v == "match" or v.startswith("mismatch@") for v in pld.lossless) and set(ar.lossless) == {""}
    assert (records.ttft_s.astype(float) > 0).all() and (records.ttft_s.astype(float) < records.wall_s).all()
    assert (records.itl_p50_ms.astype(float) >= 0).all() and (records.forward_s.astype(float) > 0).all()
    meta = yaml.safe_load((out / "run.yaml").read_text())
    assert meta["engine"]["name"] == "llama.cpp" and meta["engine"]["version"] == llama_cpp.__version__
    assert meta["chosen"]["pld"] == {"engine": "LlamaPromptLookupDecoding", "max_ngram_size": 3, "num_pred_tokens": 10}
    assert meta["complete"] is True
    tokens = [json.loads(line) for line in (out / "tokens.jsonl").read_text().splitlines()]
    assert len(tokens) == 4 and all(len(t["tokens"]) == n for t, n in zip(tokens, records.new_tokens))


class Oracle(llama_cpp.llama_speculative.LlamaDraftModel):
    """Proposes the next k tokens of a known answer (what ar emitted), wherever the sequence is."""

    def __init__(self, prompt_len: int, answer: list[int], k: int):
        self.prompt_len, self.answer, self.k = prompt_len, answer, k

    def __call__(self, input_ids, /, **kwargs):
        done = len(input_ids) - self.prompt_len  # tokens emitted so far
        return np.asarray(self.answer[done:done + self.k], dtype=np.intc)


def expected(n: int, k: int) -> tuple[int, int, int]:
    """(target forwards, drafted, accepted) of n tokens with an always-right k-token draft that stops at the answer's
    end: the prefill emits token 1; each verification takes min(k, tokens left) drafts and adds one of its own."""
    forwards, drafted, emitted = 1, 0, 1
    while emitted < n:
        d = min(k, n - emitted)
        forwards, drafted, emitted = forwards + 1, drafted + d, emitted + d + 1
    return forwards, drafted, drafted


def test_counts_on_a_known_answer(prompts):
    """The hooks count what the engine did: with a draft that proposes ar's own answer, every draft is accepted
    and the forwards are exactly 1 + ceil((n - 1) / (k + 1))."""
    from specbench.data import datasets as ds
    from specbench.backends.llama_hooks import MeteredDraft

    cfg = check_methods(RunConfig(methods=("ar", "pld"), datasets=(str(prompts),), **QUICK), engine.SUPPORTED,
                        "llama.cpp")
    loaded = load_work(cfg)
    llm = engine.LlamaCpp(cfg, engine.gguf_file("smollm2-135m", "--model"), None, loaded)
    prompt = loaded[0].prompts[1]  # counting: a deterministic answer
    ids, _ = llm.prompt_ids(ds.conversation(prompt, 0, []), prompt)
    answer = llm.generate_once("ar", ids, 24).tokens
    for k in (3, 5):
        target = llm.llms["pld"]
        target.draft_model = MeteredDraft(Oracle(len(ids), answer, k), target.meter)
        turn = llm.generate_once("pld", ids, 24)
        assert turn.tokens == answer  # the engine's verification kept ar's tokens on this prompt
        assert (turn.target_forwards, turn.drafted, turn.accepted_drafts) == expected(len(answer), k)
        assert turn.accepted_per_position == turn.drafted_per_position  # every position always accepted


def test_lossless_gap_from_ars_logits(prompts):
    """At a (forced) divergence the explanation replays ar's logits: ar's own token is their argmax, so the gap
    against any other token is >= 0, and a wrong token far below is no near-tie."""
    from specbench.data import datasets as ds

    cfg = check_methods(RunConfig(methods=("ar",), datasets=(str(prompts),), **QUICK), ("ar",), "llama.cpp")
    loaded = load_work(cfg)
    llm = engine.LlamaCpp(cfg, engine.gguf_file("smollm2-135m", "--model"), None, loaded)
    ids, _ = llm.prompt_ids(ds.conversation(loaded[0].prompts[0], 0, []), loaded[0].prompts[0])
    ar = llm.generate_once("ar", ids, 8).tokens
    logits = llm.ar_logits(ids, ar, 5)
    assert int(np.argmax(logits)) == ar[5]
    worst = int(np.argmin(logits))
    gap, verdict = engine.near_tie(logits, ar[5], worst, llm.layers)
    assert gap > 1 and verdict == "unexplained"


def test_errors_are_clear(prompts, tmp_path, monkeypatch):
    from specbench.run.benchmark import run

    with pytest.raises(SpecbenchError, match="no such file"):
        run(RunConfig(**{**QUICK, "model": str(tmp_path / "missing.gguf")}, out=tmp_path / "a"))
    text = tmp_path / "notes.gguf"
    text.write_text("not a model")
    with pytest.raises(SpecbenchError, match="not a GGUF file"):
        run(RunConfig(**{**QUICK, "model": str(text)}, out=tmp_path / "b"))
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\x00" * 64)
    monkeypatch.setenv("SPECBENCH_LLAMA_EXTRA_BUFFERS", "0")  # no probe of a file that cannot load
    with pytest.raises(SpecbenchError, match="llama.cpp could not load this GGUF"):
        run(RunConfig(**{**QUICK, "model": str(broken)}, datasets=(str(prompts),), out=tmp_path / "c"))
    with pytest.raises(SpecbenchError, match="runs ar, pld, sd"):
        run(RunConfig(**QUICK, methods=("ar", "medusa"), out=tmp_path / "d"))
    with pytest.raises(SpecbenchError, match="--compile compiles specbench's own loop, not --engine llama.cpp"):
        run(RunConfig(**QUICK, compile=True, out=tmp_path / "g"))
    with pytest.raises(SpecbenchError, match="--synthetic-acceptance decides acceptance inside specbench's own"):
        run(RunConfig(**QUICK, synthetic_acceptance="0.5", out=tmp_path / "h"))
    with pytest.raises(SpecbenchError, match="--draft-model SMALL.gguf"):
        run(RunConfig(**QUICK, methods=("ar", "sd"), out=tmp_path / "e"))
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # the extra not installed: importing it fails
    with pytest.raises(SpecbenchError, match=r"pip install 'specbench\[llamacpp\]'"):
        run(RunConfig(**QUICK, out=tmp_path / "f"))
    assert not any((tmp_path / x).exists() for x in "abcdefgh")  # nothing written


def test_cli_refusal_is_one_error_line(tmp_path):
    result = CliRunner().invoke(app, ["run", "--engine", "llama.cpp", "-m", "eagle", "--out", str(tmp_path / "x")])
    assert result.exit_code != 0 and "error:" in result.output and "Traceback" not in result.output
    assert "--engine llama.cpp runs ar, pld, sd" in " ".join(result.output.split())
    assert math.isfinite(result.exit_code)


def test_reports_say_the_engine_and_compare_engines(llama_run, tmp_path):
    """report.md names the engine and says pld's lossless result plainly; a comparison with a specbench run of the
    same prompts adds the cross-engine table (here the 'specbench' run is a relabelled copy of the same tokens, so
    its ar agreement is known: every turn equal, tok/s ratio 1)."""
    import shutil

    from specbench.report.backends import cross_backend_section, cross_backend_table, backend_section
    from specbench.report.summary import read_records

    report = "\n".join(backend_section(read_records(llama_run), yaml.safe_load((llama_run / "run.yaml").read_text())))
    assert "## Engine: llama.cpp" in report and "`pld` matched llama.cpp `ar` on " in report
    twin = tmp_path / "specbench"
    shutil.copytree(llama_run, twin)
    meta = yaml.safe_load((twin / "run.yaml").read_text())
    meta.pop("engine")
    (twin / "run.yaml").write_text(yaml.safe_dump(meta))
    records = pd.read_csv(twin / "records.csv", keep_default_na=False, dtype=str)
    records.assign(engine="specbench").to_csv(twin / "records.csv", index=False)
    table, shared = cross_backend_table([twin, llama_run])
    assert shared == 2 and set(table.engine) == {"specbench", "llama.cpp"}
    ar = table[(table.engine == "llama.cpp") & (table.method == "ar")].iloc[0]
    assert ar.same_as_specbench_ar == "2/2" and ar.vs_specbench_ar == 1.0 and ar.same_prompt_length == "2/2"
    pld = table[(table.engine == "llama.cpp") & (table.method == "pld")].iloc[0]
    assert pld.speedup > 0 and pld.tau > 1 and pld.lossless.endswith("/2")
    section = cross_backend_section([twin, llama_run], tmp_path)  # what `specbench report A B` adds to summary.md
    assert section[0] == "## Across engines" and (tmp_path / "engines.csv").exists()
    assert "llama.cpp `ar` (run) ran 1.00x specbench `ar`'s tok/s" in "\n".join(section)


def test_resume_runs_only_the_missing_prompt(llama_run, prompts, tmp_path):
    """An interrupted run (its last prompt's rows gone, run.yaml incomplete) continues with --resume: the kept
    prompt is not decoded again, the missing one is, and pld's check still has ar's kept tokens."""
    import shutil

    from specbench.run.benchmark import run

    llama_run = Path(shutil.copytree(llama_run, tmp_path / "run"))

    lines = (llama_run / "records.csv").read_text().splitlines()
    (llama_run / "records.csv").write_text("\n".join(lines[:-1]) + "\n")  # drop pld of the last prompt
    meta = yaml.safe_load((llama_run / "run.yaml").read_text())
    (llama_run / "run.yaml").write_text(yaml.safe_dump({**meta, "complete": False}, sort_keys=False))
    kept = pd.read_csv(llama_run / "records.csv", keep_default_na=False, dtype=str)
    run(RunConfig(methods=("ar", "pld"), datasets=(str(prompts),), out=llama_run, resume=True, **QUICK))
    after = pd.read_csv(llama_run / "records.csv", keep_default_na=False, dtype=str)
    assert len(after) == 4 and after.iloc[:3].wall_s.tolist() == kept.wall_s.tolist()
    assert after.iloc[3].method == "pld" and after.iloc[3].lossless != ""
    assert yaml.safe_load((llama_run / "run.yaml").read_text())["complete"] is True


def test_ctrl_c_keeps_whole_prompts(prompts, tmp_path, monkeypatch):
    """Ctrl-C while the second prompt decodes: the first prompt's rows stay (both methods), the error says how many
    and to resume (exit 130), run.yaml stays incomplete."""
    from specbench.run.benchmark import run
    from specbench.run.resume import Interrupted
    from specbench.run.runner import Runner

    real = Runner.run_prompt

    def stop_at_second(self, prompt, index, label, order):
        if prompt.id == "count":
            raise KeyboardInterrupt
        return real(self, prompt, index, label, order)

    monkeypatch.setattr(Runner, "run_prompt", stop_at_second)
    with pytest.raises(Interrupted, match="2 records kept .* --resume") as stopped:
        run(RunConfig(methods=("ar", "pld"), datasets=(str(prompts),), out=tmp_path / "run", **QUICK))
    assert stopped.value.exit_code == 130
    records = pd.read_csv(tmp_path / "run" / "records.csv", keep_default_na=False, dtype=str)
    assert list(zip(records.method, records.prompt_id)) == [("ar", "repeat"), ("pld", "repeat")]
    assert yaml.safe_load((tmp_path / "run" / "run.yaml").read_text())["complete"] is False


def test_retime_and_run_yaml_are_the_runners(prompts, tmp_path, monkeypatch):
    """llama.cpp is a backend of the same runner: a turn whose first timing ran beside foreign load is timed again
    (every method of the turn, the quiet timing kept, the tries counted) as for specbench's own methods, and run.yaml
    carries the noise guard and the data files like any run."""
    import dataclasses

    from specbench.core.machine import contention
    from specbench.run.benchmark import run
    from specbench.run.runner import Runner

    real, timings = Runner.time_turn, []

    def first_ar_busy(self, label, ids, index, turn, order):
        r = real(self, label, ids, index, turn, order)
        timings.append(label)
        if label == "ar" and index == 0 and timings.count("ar") == 1:
            return dataclasses.replace(r, noise={**r.noise, "foreign_cpu": contention.FOREIGN_CPU_LIMIT + 1})
        return r

    monkeypatch.setattr(Runner, "time_turn", first_ar_busy)
    monkeypatch.setattr(contention, "between", lambda before, after: {"foreign_cpu": 0.0, "steal": 0.0})  # this
    # machine's real load aside: only the injected reading is disturbed
    out = run(RunConfig(methods=("ar", "pld"), datasets=(str(prompts),), out=tmp_path / "run", retime=2, limit=1,
                        **QUICK))
    assert timings == ["ar", "pld", "pld", "ar"]  # the turn again, every method, the order rotated once more
    records = pd.read_csv(out / "records.csv", keep_default_na=False, dtype=str).set_index("method")
    assert set(records.timing_tries) == {"2"} and set(records.timing_disturbed) == {"False"}
    meta = yaml.safe_load((out / "run.yaml").read_text())
    assert meta["noise_guard"] == {"latency_floor": 1.0, "profile": None}
    assert set(meta["data_files"]) >= {"used", "skipped"} and meta["engine"]["name"] == "llama.cpp"


def test_retime_is_refused_where_a_backend_cannot_time_a_turn_again(tmp_path):
    """--engine openai measures load phases the server schedules: --retime given with it is one line, before any
    request."""
    result = CliRunner().invoke(app, ["run", "--engine", "openai", "--base-url", "http://127.0.0.1:9/v1", "--retime",
                                      "2", "--out", str(tmp_path / "x")])
    text = " ".join(result.output.split())
    assert result.exit_code != 0 and "--retime does not apply to --engine openai" in text and "Traceback" not in text
    assert not (tmp_path / "x").exists()
