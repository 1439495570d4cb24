"""`specbench run --engine openai`: any OpenAI-compatible server, measured as a user of it sees it (streaming), on
the same prompts as specbench's own runs, into the same run folder (records.csv, tokens.jsonl, run.yaml).

Rows and labels (so that the summary's speedup machinery works unchanged):
  --base-url alone                 the server's rows are method "server" (no speedup: nothing to compare with)
  --base-url + --baseline-url      the baseline server's rows are method "ar" (speculation off, the reference) and
                                   the main server's are method "spec"; each spec row's `lossless` compares its greedy
                                   output with the baseline's on the same prompt turn and load level
Load levels, a row each per request:
  --concurrency 1                  batch_size 1, batching "-": prompts one at a time, the two servers interleaved per
                                   prompt (order rotated), as specbench interleaves its methods
  --concurrency N (N > 1)          batch_size N, batching "closed": N conversations in flight; the servers' phases
                                   take turns (order rotated per level)
  --request-rate R                 batch_size 0, batching "poisson@R": seeded Poisson arrivals (--seed) of R
                                   requests (prompt turns, not conversations) per second
  At N > 1 and under Poisson a row's wall_s is its share of the phase's wall time (the phase's time x its share of
  the phase's tokens), so sums over rows give the phase's output throughput, as batched rows do; latency_s is the
  request's own end-to-end time, ttft_s / tpot_ms / itl_* its streaming view.

Failed requests are retried (RETRIES times, on no answer, a timeout, 5xx or 429), then recorded in serving.json
(with the error) and counted in the report; they never become rows with made-up numbers. Speculative-decoding
counts come from the server where it exposes them (openai_acceptance.py), per phase, in serving.json.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from ..data import datasets as ds
from ..errors import SpecbenchError, did_you_mean
from ..progress import console
from ..run.config import RunConfig
from ..run.work import LoadedDataset
from . import openai_acceptance as acc
from ..run.backend import Measures
from ..run.resume import mark_complete
from ..run.results import RecordWriter
from .common import local_environment, refuse_own_options
from .openai_client import Endpoint, ServerError, Streamed, unreachable
from .openai_load import closed_loop, open_loop, request_arrivals
from .openai_options import Options, parse_concurrency, parse_slo  # noqa: F401  (tests read them here)
from .openai_rows import (RETRIES, SERVING_FILE, Outcome, Phase, Server, request_counts, row,  # noqa: F401 (row:
                          write_rows, write_serving)  # tests read it here)

BACKOFF_S = 0.5  # wait before the second try (doubled each time)
MEASURES = Measures(retime=False, resume=False, phases=True,
                    why_not_retime="a server's requests are measured in load phases the server schedules (many in "
                                   "flight), so one turn cannot be timed again beside the same load; disturbed rows "
                                   "are flagged",
                    why_not_resume="a server run is not resumable (the server's state between two runs is not known)")


def connect(url: str, opts: Options, label: str) -> Server:
    """The server at `url`, checked before anything is written: it answers /models within --timeout, and serves
    --served-model (default: its first model)."""
    endpoint = Endpoint(url, opts.api_key, opts.timeout)
    try:
        models = endpoint.models()
    except ServerError as exc:
        raise unreachable(url, exc, opts.timeout) from None
    if not models:
        raise SpecbenchError(f"{url}/models lists no model; start the server with a model loaded")
    model = opts.served_model or models[0]
    if model not in models:
        raise SpecbenchError(f"--served-model {model}: {url} does not serve it{did_you_mean(model, models)}; it serves:"
                             f" {', '.join(models)}")
    return Server(label, endpoint, model)


def ask(server: Server, messages: list[dict], max_tokens: int) -> tuple[Streamed | None, str, int]:
    """One request with retries: (streamed, "", tries) or (None, the last error, tries). A server that refuses
    logprobs (HTTP 400 naming them) is asked again without, and from then on (its output compared as text)."""
    error, wait = "", BACKOFF_S
    for attempt in range(1, RETRIES + 1):
        try:
            return server.endpoint.stream_chat(server.model, messages, max_tokens, server.logprobs), "", attempt
        except ServerError as exc:
            error = str(exc)
            if exc.status == 400 and server.logprobs and "logprob" in exc.detail.lower():
                server.logprobs = False
                continue
            if not exc.retry:
                return None, error, attempt
            if attempt < RETRIES:
                time.sleep(wait)
                wait *= 2
    return None, error, RETRIES


def converse(server: Server, prompt: ds.Prompt, max_tokens: int, order: int = 0,
             arrivals: list[float] | None = None) -> list[Outcome]:
    """A prompt's turns in order, each with the server's own earlier answers; a failed turn ends the conversation
    (the later turns are recorded as failed too: they could not be asked). `arrivals` (an open loop's, seconds from
    the phase's start, one per turn; the call starts at the first): a later turn waits for its own arrival."""
    answers: list[str] = []
    out: list[Outcome] = []
    started = time.perf_counter()
    for turn in range(len(prompt.turns)):
        if out and out[-1].streamed is None:
            out.append(Outcome(turn, None, f"not sent: turn {turn - 1} failed", 0, order))
            continue
        if arrivals and turn < len(arrivals):
            delay = started + arrivals[turn] - arrivals[0] - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        streamed, error, tries = ask(server, ds.conversation(prompt, turn, answers), max_tokens)
        out.append(Outcome(turn, streamed, error, tries, order))
        if streamed is not None:
            answers.append(streamed.text)
    return out


def server_version(server: Server) -> str:
    """What the server says its version is (vLLM and SGLang answer GET /version), else "not reported"."""
    try:
        data = Endpoint(server.root, server.endpoint.api_key, min(server.endpoint.timeout, 5)).get_json("/version")
    except (ServerError, ValueError):
        return "not reported"
    return str(data.get("version", data)) if isinstance(data, dict) else str(data)


def read_counts(server: Server) -> acc.Counts | None:
    """The server's spec-decode counters now (vLLM's /metrics), or None where it has no such page."""
    try:
        return acc.vllm_counters(Endpoint(server.root, server.endpoint.api_key, server.endpoint.timeout)
                                 .get_text("/metrics"))
    except ServerError:
        return None


def check(cfg: RunConfig) -> RunConfig:
    """The server options checked and greedy decoding required, before any request or file; the run's methods are
    the servers' (no specbench method runs)."""
    Options.of(cfg)
    refuse_own_options(cfg, "openai")
    if cfg.temperature != 0:
        raise SpecbenchError("--engine openai measures greedy decoding (temperature 0, what the lossless check "
                             "compares); drop --temperature")
    return replace(cfg, methods=())


def prepare(cfg: RunConfig, loaded: list[LoadedDataset]) -> "Servers":
    """The server(s) connected and warmed up (a server that fails here leaves no run folder behind)."""
    opts = Options.of(cfg)
    servers = [connect(opts.base_url, opts, "spec" if opts.baseline_url else "server")]
    if opts.baseline_url:
        servers.insert(0, connect(opts.baseline_url, opts, "ar"))
    for server in servers:
        warm_up(server, loaded, cfg)
    return Servers(cfg, opts, servers, loaded)


class Servers:
    """The backend of `--engine openai` (run/backend.py): the servers of the run, measured in load phases of its
    own (measure()), since the server schedules the requests in flight; the run folder, run.yaml and records are the
    runner's."""

    measures = MEASURES

    def __init__(self, cfg: RunConfig, opts: Options, servers: list[Server], loaded: list[LoadedDataset]):
        self.cfg, self.opts, self.servers, self.loaded = cfg, opts, servers, loaded
        self.labels = tuple(s.label for s in servers)
        self.model_spec = servers[-1].model
        self.env = local_environment("openai", threads=cfg.threads or 0, dtype="server",
                                     placement=f"openai:{opts.base_url}")

    def profile(self):
        return None  # the server's hardware is not profiled here: the noise guard's floor stays 1.0

    def run_blocks(self, loaded) -> dict:
        opts, servers = self.opts, self.servers
        engine = {"name": "openai", "version": "; ".join(f"{s.label}: {server_version(s)}" for s in servers),
                  "servers": {s.label: {"url": s.endpoint.base_url, "model": s.model} for s in servers},
                  "concurrency": list(opts.concurrency), "request_rate": opts.request_rate, "slo": opts.slo,
                  "labels": "ar: the --baseline-url server, spec: the --base-url server" if opts.baseline_url
                  else "server: the --base-url server"}
        return {"model": {"spec": self.model_spec, "name": self.model_spec, "source": opts.base_url,
                          "rendering": "the server's chat template"},
                "engine": engine, "chosen": {}, "peak_memory": ""}

    def measure(self, out: Path, writer: RecordWriter) -> Path:
        """Every load level on the server(s), each level's rows written as soon as it has run; serving.json."""
        cfg, opts, servers = self.cfg, self.opts, self.servers
        phases, failed = [], []
        try:
            for level in measure(servers, self.loaded, cfg, opts):
                phases += level
                failed += write_rows(writer, cfg, self.env, servers, self.loaded, level)
        except KeyboardInterrupt:
            writer.close()
            write_serving(out, servers, phases, failed, opts)
            kept = max(sum(1 for _ in open(writer.records_path)) - 1, 0)
            stop = SpecbenchError(f"Interrupted: {kept} rows kept in {out} (the load levels that finished; "
                                  "`specbench report` reports them). A server run is not resumable: run it again "
                                  "into a new --out.")
            stop.exit_code = 130
            raise stop from None
        write_serving(out, servers, phases, failed, opts)
        unit = "tokens" if all(s.logprobs for s in servers) else "text"
        writer.close()
        mark_complete(out)
        if failed:
            console.print(f"[yellow]{len(failed)} request(s) failed after {RETRIES} tries: listed in "
                          f"{out / SERVING_FILE} and in report.md[/]")
        if opts.baseline_url:
            console.print(f"[dim]lossless check: spec against ar compared as {unit} (the servers' "
                          f"{'token strings, from logprobs' if unit == 'tokens' else 'streamed text'})[/]")
        return out


def warm_up(server: Server, loaded: list[LoadedDataset], cfg: RunConfig) -> None:
    """cfg.warmup short untimed requests (the server's first request often pays for loading and graph capture)."""
    prompt = next((p for d in loaded for p in d.prompts), None)
    for _ in range(cfg.warmup if prompt else 0):
        streamed, error, _tries = ask(server, ds.conversation(prompt, 0, []), min(8, cfg.max_new_tokens))
        if streamed is None:
            raise SpecbenchError(f"warm-up request to {server.endpoint.base_url} failed: {error}")


def measure(servers: list[Server], loaded: list[LoadedDataset], cfg: RunConfig, opts: Options):
    """Every load level on every server (their order rotated per level; at concurrency 1 the servers take turns per
    prompt instead): yields each level's phases, one per server, when the level has run."""
    items = [(d.name, p) for d in loaded for p in d.prompts]
    levels: list[tuple[str, int, float | None]] = [("-" if c == 1 else "closed", c, None) for c in opts.concurrency]
    if opts.request_rate:
        levels.append((f"poisson@{opts.request_rate:g}", 0, opts.request_rate))
    for li, (level, size, rate) in enumerate(levels):
        order = servers[li % len(servers):] + servers[:li % len(servers)]
        console.print(f"[dim]{level if level != '-' else 'concurrency 1'}"
                      f"{f' concurrency {size}' if level == 'closed' else ''}: {len(items)} prompts on "
                      f"{', '.join(s.label for s in order)}[/]")
        if size == 1:
            yield interleaved(order, items, cfg.max_new_tokens)
            continue
        phases: list[Phase] = []
        for position, server in enumerate(order):
            phase = Phase(server.label, level, size)
            before = read_counts(server)
            if rate is None:
                job = lambda item, s=server, at=position: converse(s, item[1], cfg.max_new_tokens, at)  # noqa: E731
                results, phase.wall_s = closed_loop(items, size, job)
            else:  # the rate counts requests: each turn is an arrival of its own
                turns = request_arrivals([len(p.turns) for _, p in items], rate, cfg.seed)
                job = lambda i, s=server, at=position: converse(s, items[i][1], cfg.max_new_tokens, at,  # noqa: E731
                                                                turns[i])
                results, phase.wall_s = open_loop(range(len(items)), [t[0] for t in turns], job)
            phase.outcomes = {(d, p.id): r for (d, p), r in zip(items, results)}
            phase.counts = acc.difference(before, read_counts(server)) or request_counts(phase)
            phases.append(phase)
        yield phases


def interleaved(order: list[Server], items: list, max_tokens: int) -> list[Phase]:
    """Concurrency 1: each prompt on every server in turn (the order rotated per prompt)."""
    phases = {s.label: Phase(s.label, "-", 1) for s in order}
    before = {s.label: read_counts(s) for s in order}
    start = time.perf_counter()
    for i, (dataset, prompt) in enumerate(items):
        for position, server in enumerate(order[i % len(order):] + order[:i % len(order)]):
            phases[server.label].outcomes[(dataset, prompt.id)] = converse(server, prompt, max_tokens, position)
    wall = time.perf_counter() - start
    for s in order:
        phase = phases[s.label]
        phase.wall_s = sum(o.streamed.wall_s for r in phase.outcomes.values() for o in r if o.streamed) or wall
        phase.counts = acc.difference(before[s.label], read_counts(s)) or request_counts(phase)
    return list(phases.values())
