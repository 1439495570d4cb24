"""--engine openai against a real OpenAI-compatible server: llama-cpp-python's own (`python -m llama_cpp.server`) on
the embedded GGUF, started here on free ports, once plain (the baseline, `ar`) and once with its prompt-lookup draft
(`spec`): streaming, concurrency 1 and 2, the lossless check between the two. Skipped without llama_cpp (the
`specbench[llamacpp]` extra)."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import time
import urllib.request

import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench.cli import app

pytestmark = [pytest.mark.slow, pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                                   reason="llama_cpp not installed (pip install 'specbench[llamacpp]')")]

# The server, with llama.cpp's extra weight buffers off: llama-cpp-python 0.3.36 built natively on an AMX Xeon
# crashes (SIGSEGV in ggml_backend_amx_mul_mat) on the Q4_1 GGUF with them on (backends/llama_cpp.py checks it the
# same way); Llama takes no argument for it, so the default model parameters are patched before the server loads.
LAUNCH = """
import sys
import llama_cpp
import llama_cpp.llama as L
default = llama_cpp.llama_model_default_params
def params():
    p = default()
    p.use_extra_bufts = False
    return p
L.llama_cpp.llama_model_default_params = params
from llama_cpp.server.__main__ import main
main()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(gguf: str, *extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, "--model", gguf, "--port", str(port), "--n_threads", "1",
                             "--n_ctx", "1024", "--interrupt_requests", "False", "--verbose", "False", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return proc, f"http://127.0.0.1:{port}/v1"


def wait_up(proc: subprocess.Popen, url: str, seconds: float = 180) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama_cpp.server exited {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/models", timeout=2) as resp:
                if json.loads(resp.read())["data"]:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"llama_cpp.server did not answer at {url} within {seconds} s")


@pytest.fixture(scope="module")
def servers():
    from specbench.core.model.gguf import embedded_gguf_path

    gguf = str(embedded_gguf_path(announce=False))
    plain = start(gguf)
    lookup = start(gguf, "--draft_model", "prompt-lookup-decoding", "--draft_model_num_pred_tokens", "4")
    try:
        for proc, url in (plain, lookup):
            wait_up(proc, url)
        yield plain[1], lookup[1]
    finally:
        for proc, _ in (plain, lookup):
            proc.terminate()
            proc.wait(timeout=30)


def test_spec_against_baseline_at_concurrency_1_and_2(servers, tmp_path, prompts_file):
    plain, lookup = servers
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "--engine", "openai", "--base-url", lookup, "--baseline-url", plain,
                                      "--concurrency", "1,2", "--dataset", str(prompts_file), "--limit", "2",
                                      "--max-new-tokens", "16", "--warmup", "1", "--slo", "ttft=60000,tpot=10000",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    records = pd.read_csv(out / "records.csv", keep_default_na=False, na_values={"lossless": []})
    assert set(records.method) == {"ar", "spec"} and set(records.engine) == {"openai"}
    assert sorted(set(zip(records.batch_size, records.batching))) == [(1, "-"), (2, "closed")]
    assert len(records) == 2 * 2 * 2  # 2 servers x 2 prompts x 2 levels
    assert (pd.to_numeric(records.ttft_s) > 0).all() and (records.new_tokens > 1).all()
    itl = pd.to_numeric(records.itl_p50_ms)
    assert itl.notna().all() and (pd.to_numeric(records.itl_p99_ms) >= itl).all()
    # the lossless check ran on every spec row against the baseline's same prompt turn and level
    spec = records[records.method == "spec"]
    assert spec.lossless.str.match(r"^(match|mismatch@\d+)$").all()
    assert (records[records.method == "ar"].lossless == "").all()
    # at concurrency 2 a row's wall_s is its share of its phase: the shares add up to the phase's time
    closed = records[records.batching == "closed"]
    for _, g in closed.groupby("method"):
        assert g.wall_s.sum() == pytest.approx(g.batch_wall_s.iloc[0], rel=1e-3)
        assert (g.latency_s >= g.wall_s * 0).all()
    serving = json.loads((out / "serving.json").read_text())
    assert serving["lossless_unit"] == "tokens" and serving["failed"] == []
    assert all(p["acceptance"] == "not exposed by this server" for p in serving["phases"])
    summary = pd.read_csv(out / "summary.csv")
    assert summary[summary.method == "spec"].speedup.notna().all()
    report = (out / "report.md").read_text()
    assert "## Serving" in report and "not exposed by this server" in report and "goodput" in report
    assert (out / "throughput_latency.png").exists()
    tokens = [json.loads(line) for line in (out / "tokens.jsonl").read_text().splitlines()]
    assert len(tokens) == len(records) and all(isinstance(t, str) for row in tokens for t in row["tokens"])


def test_map_of_two_servers_over_concurrency(servers, tmp_path, prompts_file):
    """`specbench map --engine openai`: speculation on against off at each level, measured only, a break-even."""
    plain, lookup = servers
    out = tmp_path / "map"
    result = CliRunner().invoke(app, ["map", "--engine", "openai", "--base-url", lookup, "--baseline-url", plain,
                                      "--concurrency", "1,2", "--dataset", str(prompts_file), "--limit", "2",
                                      "--max-new-tokens", "16", "--out", str(out)])
    assert result.exit_code == 0, result.output
    frame = pd.read_csv(out / "map.csv")
    assert set(frame.batch_size) == {1, 2} and set(frame.method) == {"ar", "spec"}
    assert frame.measured_tok_s.gt(0).all() and frame.predicted_tok_s.isna().all()  # no curve of a server here
    spec = frame[frame.method == "spec"]
    assert spec.measured_speedup.notna().all() and spec.break_even.str.contains("N").all()
    assert "measured only" in (out / "report.md").read_text()
