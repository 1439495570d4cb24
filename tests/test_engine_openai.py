"""--engine openai without a model server: percentiles, goodput, seeded Poisson arrivals, the acceptance readers on
the formats vLLM, SGLang and llama.cpp document, the streaming client against a small stdlib HTTP server (a closed
port, a server that answers 500 then 200, one that never finishes), option parsing, and the serving columns of
specbench's own runs (batch 1 and batched)."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench.cli import app
from specbench.backends import openai_acceptance as acc
from specbench.backends.openai_client import Endpoint, ServerError
from specbench.backends.openai_load import closed_loop, open_loop, poisson_arrivals, request_arrivals
from specbench.data.specs import Prompt
from specbench.backends.openai_server import ask, converse, parse_concurrency, parse_slo, Server
from specbench.errors import SpecbenchError
from specbench.methods.base import Generation
from specbench.report.serving import goodput, percentile, serving_numbers, serving_table
from specbench.run.records import serving_view

cli = CliRunner()


# ------------------------------------------------------------------------------------------- arithmetic

def test_percentile_interpolates_and_skips_missing():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10, float("nan"), 20], 50) == 15.0  # NaN (an unmeasured row) left out
    assert percentile([0, 100], 99) == pytest.approx(99.0)
    assert math.isnan(percentile([], 50))


def test_goodput_counts_requests_within_the_slo_over_the_time_taken():
    rows = pd.DataFrame({"ttft_s": [0.1, 0.3, 0.1, 0.1], "tpot_ms": [20.0, 20.0, 80.0, float("nan")],
                         "wall_s": [1.0, 1.0, 1.0, 1.0]})
    # within ttft 200 ms and tpot 50 ms: rows 0 and 3 (a one-token request has no tpot and meets any limit)
    assert goodput(rows, {"ttft_ms": 200, "tpot_ms": 50}) == pytest.approx(2 / 4.0)
    assert goodput(rows, {"ttft_ms": 200}) == pytest.approx(3 / 4.0)
    assert math.isnan(goodput(rows, {}))


def test_poisson_arrivals_are_seeded_and_have_the_rate():
    a, b = poisson_arrivals(2000, 4.0, seed=7), poisson_arrivals(2000, 4.0, seed=7)
    assert a == b and a[0] == 0.0 and all(x <= y for x, y in zip(a, a[1:]))
    assert poisson_arrivals(50, 4.0, seed=8) != a[:50]
    assert a[-1] / 1999 == pytest.approx(0.25, rel=0.1)  # mean gap 1 / rate
    with pytest.raises(ValueError):
        poisson_arrivals(3, 0.0, seed=0)


def test_closed_loop_keeps_at_most_n_in_flight_and_the_items_order():
    lock, state = threading.Lock(), {"now": 0, "most": 0}

    def job(x):
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        threading.Event().wait(0.02)
        with lock:
            state["now"] -= 1
        return x * 10

    results, wall = closed_loop(list(range(8)), 3, job)
    assert results == [x * 10 for x in range(8)] and state["most"] == 3 and wall > 0
    results, _ = open_loop([1, 2, 3], [0.0, 0.01, 0.02], lambda x: -x)
    assert results == [-1, -2, -3]


def test_serving_view_of_token_times():
    view = serving_view([0.5, 0.6, 0.6, 0.9])  # tokens 2 and 3 from one forward (an accepted draft): one arrival
    assert view["ttft_s"] == 0.5
    assert view["tpot_ms"] == pytest.approx((0.9 - 0.5) * 1e3 / 3)
    assert view["itl_gaps_ms"] == "100.000 300.000"  # one gap per arrival, as vLLM's bench serve counts them
    assert view["itl_p50_ms"] == pytest.approx(200.0)
    assert view["itl_p99_ms"] == pytest.approx(298.0)  # gaps 100, 300: 100 + 0.99 x 200
    assert math.isnan(serving_view([0.2])["tpot_ms"]) and math.isnan(serving_view([])["ttft_s"])
    assert serving_view([0.2, 0.2])["itl_gaps_ms"] == "" and math.isnan(serving_view([0.2, 0.2])["itl_p50_ms"])


def test_itl_is_pooled_over_every_gap_not_a_percentile_of_percentiles(tmp_path):
    # one request with 99 gaps of 10 ms, one with a single gap of 1000 ms: pooled, the p50 is 10 ms and the p99
    # lands among the 10 ms gaps; a percentile of the two requests' own p50s would be about 505 ms
    fast = serving_view([0.1 + 0.01 * i for i in range(100)])
    slow = serving_view([0.1, 1.1])
    rows = pd.DataFrame([{"method": "server", "dataset": "d", "wall_s": 1.0, "new_tokens": 100, **fast},
                         {"method": "server", "dataset": "d", "wall_s": 1.0, "new_tokens": 2, **slow}])
    path = tmp_path / "records.csv"
    rows.to_csv(path, index=False)
    back = pd.read_csv(path)  # the one-gap cell reads back as a number, the gaps as text
    table = serving_table(back)
    assert table.itl_p50_ms[0] == pytest.approx(10.0, abs=0.01)
    assert table.itl_p99_ms[0] == pytest.approx(10.0 + 0.01 * 990, abs=0.01)  # 99 of the 100 gaps are 10 ms
    assert percentile(back.itl_p50_ms, 50) > 400  # what the old per-request reading gave
    summary = serving_numbers(back)
    assert summary["itl_p50_ms"] == pytest.approx(10.0, abs=0.01)
    old = back.drop(columns="itl_gaps_ms")  # a run from before the gaps were kept: the per-request reading
    assert serving_table(old).itl_p50_ms[0] == pytest.approx(percentile(back.itl_p50_ms, 50))


def test_generation_times_each_kept_token_from_its_start():
    gen = Generation()
    gen.emit([5, 6], stop_ids=(), max_new_tokens=3)
    gen.emit([7, 8], stop_ids=(), max_new_tokens=3)  # the cap keeps one of these
    assert len(gen.token_times) == len(gen.tokens) == 3
    assert gen.token_times[0] == gen.token_times[1] <= gen.token_times[2]  # one forward's tokens share a time
    assert 0 <= gen.token_times[0] < 5


# ------------------------------------------------------------------------------------------- acceptance readers

# vLLM's /metrics page as its Prometheus client writes it (counters of vllm/v1/spec_decode/metrics.py,
# SpecDecodingProm: vllm:spec_decode_num_drafts / num_draft_tokens / num_accepted_tokens / num_accepted_tokens_per_pos
# with the position label; prometheus_client adds _total and _created samples)
VLLM_METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 100.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e9
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 300.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 180.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 80.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 60.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 40.0
vllm:generation_tokens_total{engine="0",model_name="m"} 280.0
"""


def test_vllm_counters_differenced_around_a_measurement():
    before = acc.vllm_counters(VLLM_METRICS)
    after = acc.vllm_counters(VLLM_METRICS.replace("100.0", "110.0").replace("300.0", "330.0")
                              .replace("180.0", "200.0").replace("} 80.0", "} 89.0").replace("} 60.0", "} 66.0")
                              .replace("} 40.0", "} 45.0"))
    assert (before.steps, before.drafted, before.accepted) == (100.0, 300.0, 180.0)
    d = acc.difference(before, after)
    assert (d.steps, d.drafted, d.accepted) == (10.0, 30.0, 20.0)
    s = d.summary()
    assert s["acceptance_rate"] == pytest.approx(20 / 30, abs=1e-4) and s["acceptance_length"] == pytest.approx(3.0)
    assert s["per_position"] == [0.9, 0.6, 0.5]
    assert acc.vllm_counters("vllm:generation_tokens_total 5\n") is None  # vLLM without speculation: not exposed
    assert acc.difference(None, after) is None


def test_sglang_meta_info():
    # SGLang's meta_info (tokenizer_manager.py): spec_verify_ct verifications, spec_accept_token_num the drafts they
    # accepted; the first token is the prefill's, so completion_tokens = 1 + spec_verify_ct + accepted
    old = acc.sglang_meta({"prompt_tokens": 20, "completion_tokens": 30, "spec_verify_ct": 12, "e2e_latency": 0.3})
    assert (old.steps, old.accepted, old.drafted) == (12.0, 17.0, None)  # 30 = 1 + 12 + 17
    assert old.summary()["acceptance_length"] == pytest.approx(1 + 17 / 12, abs=1e-4)  # SGLang's own 30 / 12 = 2.5
    new = acc.sglang_meta({"completion_tokens": 30, "spec_verify_ct": 12, "spec_accept_token_num": 17,
                           "spec_draft_token_num": 36})
    assert (new.steps, new.accepted) == (12.0, 17.0)  # the two readings agree on a consistent response
    assert new.summary()["acceptance_rate"] == pytest.approx(17 / 36, abs=1e-4)
    assert acc.sglang_meta({"completion_tokens": 30}) is None  # speculation off
    assert acc.sglang_meta({"completion_tokens": 30, "spec_verify_ct": 0}) is None


def test_llama_server_timings():
    # llama-server's `timings` (tools/server/server-context.cpp): predicted_n counts the prompt's token and then each
    # decode step's accepted drafts plus one; 20 = 1 + 7 steps + 12 accepted
    timings = {"prompt_n": 6, "prompt_ms": 31.5, "predicted_n": 20, "predicted_ms": 87.6, "draft_n": 16,
               "draft_n_accepted": 12}
    c = acc.llama_timings(timings)
    assert (c.drafted, c.accepted, c.steps) == (16.0, 12.0, 7.0)
    assert acc.per_request({"timings": timings}).source == "llama.cpp timings"
    assert acc.llama_timings({"predicted_n": 20, "predicted_ms": 80.0}) is None  # no drafting: not exposed
    assert acc.per_request({}) is None


def test_counters_of_recorded_server_payloads_give_the_tokens_per_step():
    # the final chunk of a live llama-server stream (build b9251, a draft model on), as published with a benchmark
    # script: 665 tokens, 604 drafted, 515 accepted -> 149 decode forwards after the prompt's, 1 + 515/149 per step
    chunk = {"choices": [], "usage": {"completion_tokens": 665, "prompt_tokens": 808, "total_tokens": 1473},
             "timings": {"cache_n": 804, "prompt_n": 4, "prompt_ms": 128.301, "predicted_n": 665,
                         "predicted_ms": 20629.211, "draft_n": 604, "draft_n_accepted": 515}}
    c = acc.per_request(chunk)
    assert c.steps == 149.0 and 1 + c.steps + c.accepted == chunk["usage"]["completion_tokens"]
    assert c.summary()["acceptance_length"] == pytest.approx(1 + 515 / 149, abs=1e-4)
    # the row's target forwards: the prompt's plus the decode steps; tau = tokens / forwards
    from specbench.backends.openai_client import Streamed
    from specbench.backends.openai_server import Outcome, Phase, row
    from specbench.run.config import RunConfig
    from specbench.run.records import LosslessOutcome

    streamed = Streamed(tokens=["x"] * 665, text="x" * 665, token_times=[0.1 + i * 0.01 for i in range(665)],
                        wall_s=7.0, unit="tokens", finish_reason="length", usage=chunk["usage"], extra=chunk)
    env = {"dtype": "server", "device": "cpu", "hardware": "h", "threads": 1, "engine": "openai", "torch": "",
           "transformers": "", "git": "", "placement": "openai:test"}
    record = row(RunConfig(), env, "m", Phase("spec", "-", 1), "d", Prompt("p", ("hi",)), Outcome(0, streamed),
                 LosslessOutcome(), 665)
    assert record.target_forwards == 150 and record.tau == pytest.approx(665 / 150, abs=1e-4)
    assert record.accepted_drafts == 515 and record.drafted == 604


# ------------------------------------------------------------------------------------------- the client, for real

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Fake(BaseHTTPRequestHandler):
    """A small OpenAI-compatible server: /v1/models, and streamed chat completions of three tokens. `fail_first`
    requests answer 500 first; `hang` never answers."""

    fail_first = 0
    hang = False
    refuse_logprobs = False  # answers 400 to a request asking for logprobs (as some servers do)
    seen = 0
    reply = ("He", "llo", "!")  # the streamed tokens
    top = None  # per position, {token: score}: returned as top_logprobs when a request asks for them

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": "tiny-model", "object": "model"}]})
        else:
            self._json(404, {"error": "not found"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen += 1
        if self.hang:
            threading.Event().wait(3)
            return
        if self.refuse_logprobs and body.get("logprobs"):
            self._json(400, {"error": {"message": "logprobs is not supported"}})
            return
        if type(self).seen <= self.fail_first or "12 + 30" in json.dumps(body["messages"]):
            self._json(500, {"error": {"message": "overloaded"}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i, tok in enumerate(self.reply):
            entry = {"token": tok, "logprob": -0.1}
            if body.get("top_logprobs") and self.top:
                entry["top_logprobs"] = [{"token": t, "logprob": v} for t, v in self.top[i].items()]
            delta = {"choices": [{"index": 0, "delta": {"content": tok}, "finish_reason": None,
                                  "logprobs": {"content": [entry]} if body.get("logprobs") else None}]}
            self.wfile.write(f"data: {json.dumps(delta)}\n\n".encode())
            self.wfile.flush()
        end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
               "timings": {"predicted_n": 3, "draft_n": 2, "draft_n_accepted": 1}}
        self.wfile.write(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode())

    def _json(self, status, data):
        raw = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


@pytest.fixture
def fake():
    def start(**settings):
        handler = type("Handler", (Fake,), {"seen": 0, **settings})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/v1", handler

    started: list = []
    yield start
    for server in started:
        server.shutdown()
        server.server_close()


def test_streaming_client_times_each_token_and_reads_timings(fake):
    url, _ = fake()
    out = Endpoint(url, timeout=5).stream_chat("tiny-model", [{"role": "user", "content": "hi"}], 3)
    assert out.tokens == ["He", "llo", "!"] and out.text == "Hello!" and out.unit == "tokens"
    assert len(out.token_times) == 3 and out.token_times == sorted(out.token_times) and out.wall_s >= out.token_times[-1]
    assert out.finish_reason == "length" and acc.per_request(out.extra).accepted == 1.0


def test_a_500_then_200_is_retried_and_a_lasting_500_is_a_failed_request(fake):
    url, handler = fake(fail_first=1)
    server = Server("spec", Endpoint(url, timeout=5), "tiny-model")
    streamed, error, tries = ask(server, [{"role": "user", "content": "hi"}], 3)
    assert streamed is not None and error == "" and tries == 2 and handler.seen == 2
    url, handler = fake(fail_first=99)
    streamed, error, tries = ask(Server("spec", Endpoint(url, timeout=5), "tiny-model"),
                                 [{"role": "user", "content": "hi"}], 3)
    assert streamed is None and tries == 3 and "HTTP 500" in error and url in error


def test_request_rate_counts_requests_not_conversations():
    # four conversations of 2, 1, 3 and 1 turns: seven requests, seven Poisson arrivals dealt in order
    turns = request_arrivals([2, 1, 3, 1], 4.0, seed=3)
    assert [len(t) for t in turns] == [2, 1, 3, 1]
    assert [t for conv in turns for t in conv] == poisson_arrivals(7, 4.0, seed=3)
    many = request_arrivals([2] * 1000, 4.0, seed=3)  # 2000 requests at 4 per second: about 500 s, not 250
    assert 450 < many[-1][-1] < 550


def test_a_later_turn_waits_for_its_own_arrival(fake):
    url, handler = fake()
    server = Server("spec", Endpoint(url, timeout=5), "tiny-model")
    prompt = Prompt("p", ("hello there", "and again"))
    start = time.perf_counter()
    out = converse(server, prompt, 3, arrivals=[1.0, 1.4])  # the call is the first arrival; the second 0.4 s on
    assert time.perf_counter() - start >= 0.4 and [o.streamed is not None for o in out] == [True, True]
    start = time.perf_counter()
    out = converse(server, prompt, 3, arrivals=[0.0, 0.0])  # arrived already: sent when the first is answered
    assert time.perf_counter() - start < 0.4 and handler.seen == 4


def test_closed_port_and_timeout_are_clear_errors_without_a_run_folder(tmp_path, fake):
    port = free_port()  # nothing listens here
    out = tmp_path / "run"
    result = cli.invoke(app, ["run", "--engine", "openai", "--base-url", f"http://127.0.0.1:{port}/v1", "--out",
                              str(out), "-d", "gsm8k", "--limit", "1"])
    assert result.exit_code != 0 and f"127.0.0.1:{port}/v1" in result.output and "Traceback" not in result.output
    assert not out.exists()
    with pytest.raises(ServerError) as caught:  # a server that takes longer than --timeout
        url, _ = fake(hang=True)
        Endpoint(url, timeout=0.5).stream_chat("tiny-model", [{"role": "user", "content": "hi"}], 3)
    assert caught.value.retry and "no answer" in str(caught.value)


def test_unknown_served_model_lists_the_servers_models(tmp_path, fake):
    url, _ = fake()
    out = tmp_path / "run"
    result = cli.invoke(app, ["run", "--engine", "openai", "--base-url", url, "--served-model", "tiny-modle",
                              "--out", str(out), "-d", "gsm8k", "--limit", "1"])
    assert result.exit_code != 0 and "tiny-model" in result.output and "did you mean" in result.output
    assert not out.exists()


def test_option_parsing():
    assert parse_concurrency("1,4,16") == (1, 4, 16) and parse_concurrency("2,2") == (2,)
    assert parse_slo("ttft=500,tpot=50") == {"ttft_ms": 500.0, "tpot_ms": 50.0} and parse_slo(None) == {}
    for bad in ("0", "a", "1,,2"):
        with pytest.raises(SpecbenchError, match="--concurrency"):
            parse_concurrency(bad)
    for bad in ("ttft", "latency=5", "tpot=-1"):
        with pytest.raises(SpecbenchError, match="--slo"):
            parse_slo(bad)


# ------------------------------------------------------------------------------------------- specbench's own runs

def test_own_runs_fill_the_serving_columns_batched_rows_included(tmp_path, prompts_file):
    out = tmp_path / "run"
    result = cli.invoke(app, ["run", "--model", "random:tiny", "--max-new-tokens", "12", "--warmup", "0", "-m", "pld",
                              "--dataset", str(prompts_file), "--limit", "2", "--batch-size", "1,2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    records = pd.read_csv(out / "records.csv")
    assert records.ttft_s.notna().all() and (records.ttft_s > 0).all()
    several = records[records.new_tokens > 1]
    assert several.tpot_ms.notna().all() and (several.itl_p99_ms >= several.itl_p50_ms).all()
    assert set(records.batch_size) == {1, 2}
    summary = pd.read_csv(out / "summary.csv")
    assert {"ttft_p50_s", "ttft_p99_s", "tpot_p50_ms", "itl_p99_ms"} <= set(summary) and summary.ttft_p50_s.notna().all()
    report = (out / "report.md").read_text()
    assert "## Serving" in report and (out / "throughput_latency.png").exists()
    table = serving_table(records)
    assert set(table.batch_size) == {1, 2} and (table.output_throughput > 0).all()
    assert len(table) == len(records.groupby(["method", "batch_size", "batching"]))


def test_open_loop_run_records_rows_and_lists_failed_requests(tmp_path, fake, prompts_file):
    url, _ = fake()  # fails every request about "12 + 30" (the third prompt), whatever the tries
    out = tmp_path / "run"
    result = cli.invoke(app, ["run", "--engine", "openai", "--base-url", url, "--concurrency", "1",
                              "--request-rate", "50", "--slo", "ttft=1000", "--dataset", str(prompts_file),
                              "--limit", "3", "--max-new-tokens", "3", "--warmup", "0", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "2 request(s) failed" in result.output  # the third prompt at each of the two levels
    records = pd.read_csv(out / "records.csv")
    assert set(records.method) == {"server"} and len(records) == 4  # 2 prompts x 2 levels; the failed ones left out
    assert sorted(set(records.batching)) == ["-", "poisson@50"]
    assert set(records.batch_size) == {0, 1}
    serving = json.loads((out / "serving.json").read_text())
    assert len(serving["failed"]) == 2 and all(f["tries"] == 3 and "HTTP 500" in f["error"] for f in serving["failed"])
    assert serving["phases"][0]["acceptance"]["source"] == "llama.cpp timings"  # the fake's timings, summed
    assert serving["phases"][0]["acceptance"]["drafted"] == 4  # 2 per request
    report = (out / "report.md").read_text()
    assert "### Failed requests: 2" in report and "goodput" in report
    table = serving_table(records, serving["slo"], serving["failed"])
    assert list(table.failed) == [1, 1] and (table.goodput > 0).all()


def test_a_server_without_logprobs_is_compared_as_text(tmp_path, fake, prompts_file):
    plain, _ = fake(refuse_logprobs=True)
    spec, _ = fake()
    out = tmp_path / "run"
    result = cli.invoke(app, ["run", "--engine", "openai", "--base-url", spec, "--baseline-url", plain,
                              "--dataset", str(prompts_file), "--limit", "2", "--max-new-tokens", "3", "--warmup", "0",
                              "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "compared as text" in result.output
    records = pd.read_csv(out / "records.csv", keep_default_na=False)
    assert set(records.method) == {"ar", "spec"}
    assert (records[records.method == "spec"].lossless == "match").all()
    assert json.loads((out / "serving.json").read_text())["lossless_unit"] == "text"
    assert pd.read_csv(out / "summary.csv").set_index("method").speedup["ar"] == 1.0


# ------------------------------------------------------------------------------- a server run in the one run loop

def server_run(out, spec, baseline, prompts_file, *extra):
    return cli.invoke(app, ["run", "--engine", "openai", "--base-url", spec, "--baseline-url", baseline,
                            "--dataset", str(prompts_file), "--limit", "2", "--max-new-tokens", "3", "--warmup", "0",
                            "--out", str(out), *extra])


def test_a_server_run_is_checked_by_the_runner_and_its_speedups_are_the_shared_comparisons(tmp_path, fake,
                                                                                           prompts_file, monkeypatch):
    from specbench.run import intervals
    from specbench.run.runner import Runner

    checked = []
    check_prompt = Runner.check_prompt

    def spy(self, dataset, prompt, results, reference):
        checked.append((prompt.id, tuple(sorted(results))))
        return check_prompt(self, dataset, prompt, results, reference)

    monkeypatch.setattr(Runner, "check_prompt", spy)
    baseline, _ = fake()
    spec, _ = fake()
    out = tmp_path / "run"
    result = server_run(out, spec, baseline, prompts_file, "--concurrency", "1,2")
    assert result.exit_code == 0, result.output
    # every prompt at each of the two levels went through the runner's lossless check, both servers together
    assert len(checked) == 4 and all(labels == ("ar", "spec") for _, labels in checked)
    records = pd.read_csv(out / "records.csv", keep_default_na=False, dtype={"prompt_id": str})
    assert (records[records.method == "spec"].lossless == "match").all()
    assert sorted(set(zip(records.batch_size, records.batching))) == [(1, "-"), (2, "closed")]
    # the summary's spec row at concurrency 1: the pooled speedup and the bootstrap interval of run/intervals.py
    one = records[records.batch_size == 1].assign(wall_s=lambda r: r.wall_s.astype(float))
    pairs = intervals.turn_pairs(one[one.method == "spec"], one[one.method == "ar"], ["dataset", "prompt_id", "turn"])
    low, high = intervals.interval(pairs)
    summary = pd.read_csv(out / "summary.csv")
    row = summary[(summary.method == "spec") & (summary.batch_size == 1)].iloc[0]
    pooled = (pairs.new_tokens.sum() / pairs.wall_s.sum()) / (pairs.new_tokens_ar.sum() / pairs.wall_s_ar.sum())
    assert row.speedup == pytest.approx(pooled, rel=2e-3)
    assert (row.speedup_lo, row.speedup_hi) == (pytest.approx(low, abs=1e-3), pytest.approx(high, abs=1e-3))
    assert len(summary[summary.method == "spec"]) == 2  # one speedup row per level


def test_a_ctrl_c_server_run_resumes_its_unfinished_levels(tmp_path, fake, prompts_file, monkeypatch):
    import yaml

    from specbench.backends import openai_server

    baseline, ar_handler = fake()
    spec, spec_handler = fake()
    out = tmp_path / "run"

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:  # Ctrl-C while the second level (2 in flight) runs
        patch.setattr(openai_server, "closed_loop", interrupted)
        result = server_run(out, spec, baseline, prompts_file, "--concurrency", "1,2")
    said = " ".join(result.output.split())  # the console wraps long lines
    assert result.exit_code == 130 and "--resume" in said and "whole load levels" in said
    records = pd.read_csv(out / "records.csv", keep_default_na=False)
    assert set(records.batching) == {"-"} and len(records) == 2 * 2  # the first level kept whole
    serving = json.loads((out / "serving.json").read_text())
    assert {p["batching"] for p in serving["phases"]} == {"-"}
    with monkeypatch.context() as patch:  # a server upgraded since: its levels would not compare with the kept ones
        patch.setattr(openai_server, "server_version", lambda server: "9.9")
        result = server_run(out, spec, baseline, prompts_file, "--concurrency", "1,2", "--resume")
    said = " ".join(result.output.split())
    assert result.exit_code != 0 and "measured on other servers" in said and "9.9" in said
    assert "Traceback" not in result.output and len(pd.read_csv(out / "records.csv")) == 4
    sent = ar_handler.seen + spec_handler.seen
    result = server_run(out, spec, baseline, prompts_file, "--concurrency", "1,2", "--resume")
    assert result.exit_code == 0, result.output
    assert "1 load level(s) kept, 1 to go" in " ".join(result.output.split())
    assert ar_handler.seen + spec_handler.seen - sent == 2 * 2  # the second level only: 2 servers x 2 prompts
    records = pd.read_csv(out / "records.csv", keep_default_na=False)
    assert sorted(set(zip(records.batch_size, records.batching))) == [(1, "-"), (2, "closed")] and len(records) == 8
    assert not records.duplicated(["method", "prompt_id", "turn", "batch_size", "batching"]).any()
    tokens = (out / "tokens.jsonl").read_text().splitlines()
    assert len(tokens) == len(records)
    serving = json.loads((out / "serving.json").read_text())
    assert sorted((p["server"], p["batching"]) for p in serving["phases"]) == [
        ("ar", "-"), ("ar", "closed"), ("spec", "-"), ("spec", "closed")]
    assert yaml.safe_load((out / "run.yaml").read_text())["complete"] is True
    result = server_run(out, spec, baseline, prompts_file, "--concurrency", "1,2", "--resume")
    assert result.exit_code == 0 and "Nothing to resume" in " ".join(result.output.split())


def test_a_servers_mismatch_is_explained_from_the_baselines_logits(tmp_path, fake, prompts_file):
    # the baseline answers "He llo !", the spec server "He y !": a mismatch at token 1, where the baseline's scores
    # (asked again with top_logprobs) are logits 0.01 apart: within the rounding's tolerance, a near-tie
    logits = [{"He": 20.0, "Hi": 3.0}, {"llo": 12.0, "y": 11.99, "i": 2.0}, {"!": 9.0}]
    baseline, ar_handler = fake(top=logits)
    spec, _ = fake(reply=("He", "y", "!"))
    out = tmp_path / "run"
    result = server_run(out, spec, baseline, prompts_file)
    assert result.exit_code == 0, result.output
    records = pd.read_csv(out / "records.csv", keep_default_na=False)
    spec_rows = records[records.method == "spec"]
    assert (spec_rows.lossless == "mismatch@1").all() and (spec_rows.mismatch_explained == "near-tie").all()
    assert spec_rows.mismatch_logit_gap.astype(float).tolist() == pytest.approx([0.01, 0.01], abs=1e-6)
    assert ar_handler.seen == 2 + 2  # two measured requests and one explaining request per mismatch
    # log-probabilities carry no logit scale: the gap, and no verdict with the reason
    logprobs = [{"He": -0.01}, {"llo": -0.7, "y": -0.71}, {"!": -0.1}]
    baseline, _ = fake(top=logprobs)
    out = tmp_path / "run2"
    assert server_run(out, spec, baseline, prompts_file).exit_code == 0
    records = pd.read_csv(out / "records.csv", keep_default_na=False)
    spec_rows = records[records.method == "spec"]
    assert spec_rows.mismatch_explained.str.startswith("no verdict: the server gives log-probabilities").all()
    assert spec_rows.mismatch_logit_gap.astype(float).tolist() == pytest.approx([0.01, 0.01], abs=1e-6)


def test_scores_verdict_reads_logits_and_refuses_log_probabilities():
    from specbench.backends.openai_lossless import are_logits, scores_verdict

    assert are_logits(np.array([12.0, 11.0])) and are_logits(np.array([-0.01, -0.02]))  # exp sums above 1
    assert not are_logits(np.array([-0.1, -3.0]))
    assert scores_verdict({"a": 12.0, "b": 11.99}, "a", "b")[1] == "near-tie"
    gap, verdict = scores_verdict({"a": 12.0, "b": 6.0}, "a", "b")
    assert verdict == "unexplained" and gap == pytest.approx(6.0)
    assert scores_verdict({"a": 12.0, "b": 6.0}, "a", "z")[1] == "unexplained"  # below every listed score
    assert scores_verdict({"a": -0.1, "b": -3.0}, "a", "b")[1].startswith("no verdict")
    assert scores_verdict({"b": 1.0}, "a", "b")[1].startswith("no verdict")
