"""The command line end to end on a tiny random model: outputs, resume, Ctrl-C, reports and bad input."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench import __version__
from specbench.run.runner import Runner
from specbench.cli import app

cli = CliRunner()
TINY = ["--model", "random:tiny", "--max-new-tokens", "24", "--warmup", "0"]


def invoke(*args):
    return cli.invoke(app, [str(a) for a in args])


def test_help_and_version():
    result = invoke("--help")
    assert result.exit_code == 0 and "run" in result.output and "report" in result.output
    assert invoke("--version").output.strip() == f"specbench {__version__}"
    assert "--max-new-tokens" in invoke("run", "--help").output


def test_list_and_env():
    methods = invoke("list", "methods")
    assert methods.exit_code == 0 and "ar" in methods.output and "pld" in methods.output
    assert "lossless" in methods.output
    datasets = invoke("list", "datasets")
    assert datasets.exit_code == 0 and "humaneval" in datasets.output and "mt-bench" in datasets.output
    assert "stdlib-code" in datasets.output and "training only" in datasets.output
    training_only = invoke("run", "--dataset", "word-problems", "--limit", 1)
    assert training_only.exit_code != 0 and "training-only prompt source" in training_only.output
    env = invoke("env")
    assert env.exit_code == 0 and "torch" in env.output and "threads" in env.output


def test_run_writes_records_summary_report_and_plots(tmp_path, prompts_file):
    out = tmp_path / "run"
    result = invoke("run", *TINY, "--dataset", prompts_file, "--limit", 4, "--out", out)
    assert result.exit_code == 0, result.output
    for name in ("records.csv", "summary.csv", "report.md", "speedup.png", "tokens_per_s.png", "tau.png", "run.yaml"):
        assert (out / name).exists(), name
    records = pd.read_csv(out / "records.csv")
    assert len(records) == 2 * 5  # 2 methods x (3 one-turn prompts + 1 two-turn prompt)
    summary = pd.read_csv(out / "summary.csv")
    pld = summary[summary.method == "pld"].iloc[0]
    assert pld.lossless_rate == 1.0 and pld.tau >= 1.0 and pld.speedup > 0
    assert "speedup vs ar" in result.output
    rows = [json.loads(line) for line in (out / "tokens.jsonl").read_text().splitlines()]
    assert len(rows) == 10 and all(isinstance(r["text"], str) and r["tokens"] for r in rows)  # the text beside ids


def test_repeats_record_one_row_per_turn(tmp_path, prompts_file):
    out = tmp_path / "run"
    assert invoke("run", *TINY, "--dataset", prompts_file, "--limit", 1, "--repeats", 3, "--out", out).exit_code == 0
    assert len(pd.read_csv(out / "records.csv")) == 2


def test_existing_run_needs_resume(tmp_path, prompts_file):
    out = tmp_path / "run"
    assert invoke("run", *TINY, "--dataset", prompts_file, "--limit", 1, "--out", out).exit_code == 0
    again = invoke("run", *TINY, "--dataset", prompts_file, "--limit", 1, "--out", out)
    assert again.exit_code != 0 and "--resume" in again.output
    other = invoke("run", *TINY, "--dataset", prompts_file, "--limit", 1, "--max-new-tokens", 20, "--out", out,
                   "--resume")
    assert other.exit_code != 0 and "options differ" in other.output and "max_new_tokens: 24 -> 20" in other.output
    extended = invoke("run", *TINY, "--dataset", prompts_file, "--limit", 2, "--out", out, "--resume")
    assert extended.exit_code == 0, extended.output  # a larger --limit: the kept prompt plus the next one
    assert set(pd.read_csv(out / "records.csv").prompt_id.astype(str)) == {"0", "1"}
    fewer = invoke("run", *TINY, "--dataset", prompts_file, "--limit", 1, "--out", out, "--resume")
    assert fewer.exit_code != 0 and "options differ" in fewer.output and "limit: 2 -> 1" in fewer.output


def test_resume_of_a_folder_that_is_not_a_run_is_one_line(tmp_path, prompts_file):
    stranger = tmp_path / "notes"
    stranger.mkdir()
    (stranger / "x.txt").write_text("mine")
    for out in (tmp_path / "absent", stranger):
        result = invoke("run", *TINY, "--dataset", prompts_file, "--limit", 1, "--out", out, "--resume")
        assert result.exit_code != 0 and "not a run folder" in result.output and "Traceback" not in result.output
        assert result.exception is None or isinstance(result.exception, SystemExit)
    assert not (tmp_path / "absent").exists() and (stranger / "x.txt").read_text() == "mine"


def test_out_folder_of_a_run_without_results_is_reused(tmp_path, prompts_file, monkeypatch):
    def interrupt(self, *args, **kwargs):
        raise KeyboardInterrupt

    out = tmp_path / "run"
    real = Runner.run_prompt
    monkeypatch.setattr(Runner, "run_prompt", interrupt)
    assert invoke("run", *TINY, "--dataset", prompts_file, "--limit", 1, "--out", out).exit_code == 130
    assert (out / "run.yaml").exists()
    monkeypatch.setattr(Runner, "run_prompt", real)
    again = invoke("run", *TINY, "--dataset", prompts_file, "--limit", 1, "--max-new-tokens", 16, "--out", out)
    assert again.exit_code == 0 and "recorded no results" in " ".join(again.output.split()), again.output
    assert len(pd.read_csv(out / "records.csv")) == 2


def test_ctrl_c_keeps_records_and_resume_finishes(tmp_path, prompts_file, monkeypatch):
    out = tmp_path / "run"
    real = Runner.run_prompt
    calls = {"n": 0}

    def interrupt_on_fourth(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Runner, "run_prompt", interrupt_on_fourth)
    args = ["run", *TINY, "--dataset", prompts_file, "--limit", 4, "--out", out]
    result = invoke(*args)
    assert result.exit_code == 130 and "--resume" in result.output
    kept = pd.read_csv(out / "records.csv")  # whole prompts only: prompt 0 (ar, pld); prompt 1 was cut after one
    assert len(kept) == 2 and set(kept.method) == {"ar", "pld"} and set(kept.prompt_id.astype(str)) == {"0"}
    assert "PARTIAL" in (out / "report.md").read_text()

    monkeypatch.setattr(Runner, "run_prompt", real)
    resumed = invoke(*args, "--resume")
    assert resumed.exit_code == 0, resumed.output
    records = pd.read_csv(out / "records.csv")
    assert len(records) == 10
    assert not records.duplicated(["method", "dataset", "prompt_id", "turn"]).any()


def test_resume_refuses_another_environment_and_names_it(tmp_path, prompts_file, monkeypatch):
    """Resuming with other CPU kernels (or versions, hardware, dtype) would mix two sets of numbers."""
    out = tmp_path / "run"
    args = ["run", *TINY, "--dataset", prompts_file, "--limit", 2, "--out", out]
    real, calls = Runner.run_prompt, {"n": 0}

    def interrupt_on_third(self, *args, **kwargs):  # prompt 0 kept, prompt 1 left to resume
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Runner, "run_prompt", interrupt_on_third)
    assert invoke(*args).exit_code == 130
    monkeypatch.setattr(Runner, "run_prompt", real)
    run_yaml = (out / "run.yaml").read_text()
    monkeypatch.setenv("SPECBENCH_CPU_LINEAR", "mkl" if "cpu_linear: onednn" in run_yaml else "onednn")
    refused = invoke(*args, "--resume")
    text = " ".join(refused.output.split())
    assert refused.exit_code != 0 and "another environment: cpu_linear:" in text and "Traceback" not in text
    assert (out / "run.yaml").read_text() == run_yaml  # the refused resume changed nothing


def test_ctrl_c_before_the_first_record_exits_130_with_the_resume_hint(tmp_path, prompts_file, monkeypatch):
    def interrupt(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Runner, "run_prompt", interrupt)
    result = invoke("run", *TINY, "--dataset", prompts_file, "--limit", 2, "--out", tmp_path / "run")
    text = " ".join(result.output.split())
    assert result.exit_code == 130 and "no results yet" in text and "--resume" in text


def test_methods_run_in_an_order_rotated_per_prompt(tmp_path, prompts_file):
    from specbench.run.work import interleaved

    assert [interleaved(["ar", "pld", "sd"], i) for i in range(3)] == [["ar", "pld", "sd"], ["pld", "sd", "ar"],
                                                                       ["sd", "ar", "pld"]]
    out = tmp_path / "run"
    # --retime 0: a re-timed turn (a busy test machine) records the order of the try it kept, rotated further
    assert invoke("run", *TINY, "--dataset", prompts_file, "--limit", 2, "--out", out, "--retime", 0).exit_code == 0
    records = pd.read_csv(out / "records.csv", dtype={"prompt_id": str})
    first = records[records.turn == 0].set_index(["prompt_id", "method"]).order
    assert first[("0", "ar")] == 0 and first[("1", "ar")] == 1  # pld ran first on the second prompt
    assert records.lossless[records.method == "pld"].eq("match").all()  # checked against ar even when ar ran later


def test_long_prompt_is_truncated_not_fatal(tmp_path):
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"prompt": "word " * 400}) + "\n")  # 2000 bytes > 512-token context
    result = invoke("run", *TINY, "--dataset", path, "--out", tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert "exceed the context" in result.output
    cut = pd.read_csv(tmp_path / "run" / "records.csv")
    assert (cut.prompt_cut > 0).all() and (cut.prompt_tokens == 512 - 24).all()  # noted on every row
    assert "Prompts cut to fit the context" in (tmp_path / "run" / "report.md").read_text()
    skipped = invoke("run", "--model", "random:tiny", "--max-new-tokens", 600, "--warmup", 0,
                     "--dataset", path, "--out", tmp_path / "run2")
    assert skipped.exit_code != 0 and "skip" in skipped.output and "no results" in skipped.output


def test_report_compares_runs_and_gates_on_speedup(tmp_path, prompts_file):
    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:
        assert invoke("run", *TINY, "--dataset", prompts_file, "--limit", 2, "--out", run).exit_code == 0
    single = invoke("report", runs[0])
    assert single.exit_code == 0 and (runs[0] / "summary.csv").exists()
    own = (runs[0] / "report.md").read_text()
    (runs[0] / "report.md").write_text(own + "\nmine")
    elsewhere = invoke("report", runs[0], "--out", tmp_path / "one")
    assert elsewhere.exit_code == 0, elsewhere.output
    assert (tmp_path / "one" / "report.md").exists() and (runs[0] / "report.md").read_text() == own + "\nmine"
    both = invoke("report", *runs, "--out", tmp_path / "cmp", "--fail-below", 0.01, "--judge-disturbed")
    assert both.exit_code == 0, both.output
    assert (tmp_path / "cmp" / "summary.md").exists() and (tmp_path / "cmp" / "comparison.csv").exists()
    gate = invoke("report", runs[0], "--fail-below", 100, "--judge-disturbed")
    assert gate.exit_code == 1 and "FAIL" in gate.output


@pytest.mark.parametrize("args, message", [
    (["--method", "nope"], "unknown method"),
    (["--dataset", "nope"], "unknown dataset"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
    (["--limit", "-1"], "--limit must be at least 1"),
    (["--dtype", "float8"], "unknown dtype"),
    (["--repeats", "0"], "--repeats must be at least 1"),
    (["--method", "sd", "--gamma", "-3"], "--gamma must be at least 1"),
    (["--method", "pearl", "--pearl-exec", "warp"], "unknown --pearl-exec 'warp'"),
    (["--method", "sd", "--drafter", "./no-such-drafter"], "model path not found"),
    (["--temperature", "nan"], "--temperature must be a number >= 0 (got nan)"),
    (["--top-p", "inf"], "--top-p must be a number in (0, 1] (got inf)"),
    (["--threads", "-2"], "--threads must be at least 1"),
    (["--threads", "0"], "--threads must be at least 1"),
    (["--method", "pld", "--pld-ngram", "0"], "--pld-ngram must be at least 1"),
    (["--method", "pld", "--pld-draft-tokens", "0"], "--pld-draft-tokens must be at least 1"),
    (["--dataset", "/tmp/[/x]nope.jsonl"], "/tmp/[/x]nope.jsonl: no such file"),
    (["--dataset", "/tmp/my[data].jsonl"], "/tmp/my[data].jsonl: no such file"),
    (["--concurrency", "4"], "--concurrency: applies to --engine openai only"),
    (["--per-category"], "--per-category: humaneval has no categories"),
])
def test_bad_run_options(tmp_path, args, message):
    result = invoke("run", "--model", "random:tiny", "--out", tmp_path / "r", *args)
    assert result.exit_code != 0
    assert message in " ".join(result.output.split())  # rich wraps long lines
    assert "Traceback" not in result.output
    assert not (tmp_path / "r" / "run.yaml").exists()  # refused before the run folder holds a run


def test_method_options_come_from_the_methods(tmp_path, prompts_file):
    """Each method's declared options are CLI flags, listed per method, kept per method in run.yaml."""
    from specbench.methods import REGISTRY, all_options

    declared = all_options(REGISTRY)
    assert {"pld_ngram", "gamma", "pearl_exec", "tree", "artifact"} <= set(declared)
    assert set(declared["gamma"][1]) >= {"sd", "pearl"} and declared["pld_ngram"][1] == ["pld"]
    helped = invoke("run", "--help").output
    assert all(spec.flag in helped for spec, _ in declared.values())
    assert "--pld-ngram" in invoke("list", "methods").output
    out = tmp_path / "r"
    result = invoke("run", *TINY, "--dataset", prompts_file, "--limit", 1, "--pld-ngram", 2, "--gamma", 3,
                    "--out", out)
    assert result.exit_code == 0, result.output
    assert "--gamma is an option of" in " ".join(result.output.split())  # no method of this run takes it
    import yaml

    options = yaml.safe_load((out / "run.yaml").read_text())["settings"]["options"]
    assert options == {"ar": {}, "pld": {"pld_ngram": 2, "pld_draft_tokens": 10}}


def test_unknown_model(tmp_path, prompts_file):
    result = invoke("run", "--model", "no-such-model", "--dataset", prompts_file, "--out", tmp_path / "r")
    assert result.exit_code != 0 and "unknown model" in result.output


def test_malformed_jsonl(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "ok"}\n{not json\n')
    result = invoke("run", *TINY, "--dataset", path, "--out", tmp_path / "r")
    assert result.exit_code != 0 and "line 2" in result.output


def test_offline_without_data(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_DATA_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SPECBENCH_OFFLINE", "1")
    result = invoke("run", *TINY, "--dataset", "gsm8k", "--out", tmp_path / "r")
    assert result.exit_code != 0
    assert "SPECBENCH_DATA_DIR" in result.output


def test_unwritable_out(tmp_path, prompts_file):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = invoke("run", *TINY, "--dataset", prompts_file, "--out", blocker / "sub")
    assert result.exit_code != 0 and "cannot write to --out" in result.output


def test_report_of_a_folder_without_records(tmp_path):
    (tmp_path / "empty").mkdir()
    result = invoke("report", tmp_path / "empty")
    assert result.exit_code != 0 and "records.csv" in result.output


@pytest.mark.skipif(not os.environ.get("SPECBENCH_DATA_DIR"), reason="needs SPECBENCH_DATA_DIR")
def test_run_on_mt_bench_two_turns(tmp_path):
    result = invoke("run", *TINY, "--dataset", "mt-bench", "--limit", 1, "--out", tmp_path / "r")
    assert result.exit_code == 0, result.output
    records = pd.read_csv(tmp_path / "r" / "records.csv")
    assert sorted(records.turn.unique()) == [0, 1]
    turn2 = records[(records.turn == 1) & (records.method == "ar")].iloc[0]
    turn1 = records[(records.turn == 0) & (records.method == "ar")].iloc[0]
    assert turn2.prompt_tokens > turn1.prompt_tokens + turn1.new_tokens  # turn 2 sees the model's own answer


@pytest.mark.skipif(not os.environ.get("SPECBENCH_DATA_DIR"), reason="needs SPECBENCH_DATA_DIR")
def test_long_set_past_the_context_is_truncated_and_reported_by_length(tmp_path):
    """cnn-dm-long's prompts pass the tiny model's 512-token context: each is cut from the left with the warning,
    and report.md carries the "By prompt length" section (context.csv beside it)."""
    result = invoke("run", *TINY, "--method", "pld", "--dataset", "cnn-dm-long", "--limit", 1, "--out", tmp_path / "r")
    assert result.exit_code == 0, result.output
    assert "exceed the context" in result.output and "kept the last 488" in " ".join(result.output.split())
    assert "## By prompt length" in (tmp_path / "r" / "report.md").read_text()
    table = pd.read_csv(tmp_path / "r" / "context.csv")
    assert set(table.bucket) == {"256-1k"} and set(table.method) == {"ar", "pld"}  # 488 tokens after the cut


def test_hub_model_offline_fails_at_once(tmp_path, monkeypatch):
    """A Hugging Face id missing from the local cache, offline: a clear error without the hub's retries."""
    import time

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    result = invoke("run", "--model", "someorg/not-cached-model", "--limit", 1, "--out", tmp_path / "r")
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "not in the local Hugging Face cache" in " ".join(result.output.split())
    assert time.perf_counter() - start < 30  # the hub client alone retried for ~68 s


def test_method_rejects_options_it_does_not_declare(tiny):
    from specbench.errors import SpecbenchError
    from specbench.methods import get_method

    with pytest.raises(SpecbenchError, match="method pld does not take --gamma"):
        get_method("pld")(tiny, {"gamma": 3})
    assert get_method("pld")(tiny, {"pld_ngram": 2}).options.pld_ngram == 2
    assert get_method("pld")(tiny).options.pld_draft_tokens == 10  # the declared default
