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

`Servers` is a backend of the one run loop (run/backend.py): the runner drives the levels (run/load_levels.py),
checks spec against ar at each level (a mismatch explained by openai_lossless.py where the server allows it) and
writes the records; --resume keeps the levels serving.json lists whole and runs the others.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import yaml

from ..core.store import RunFolder
from ..data import datasets as ds
from ..errors import SpecbenchError, did_you_mean
from ..progress import console
from ..run.backend import Measures
from ..run.config import RunConfig
from ..run.load_levels import Level, LevelRun
from ..run.resume import differences, plain
from ..run.work import LoadedDataset
from . import openai_acceptance as acc
from .common import local_environment, refuse_own_options
from .openai_client import Endpoint, ServerError, Streamed, unreachable
from .openai_load import closed_loop, open_loop, request_arrivals
from .openai_lossless import explain_mismatch
from .openai_options import Options, parse_concurrency, parse_slo  # noqa: F401  (tests read them here)
from .openai_rows import (RETRIES, SERVING_FILE, Outcome, Phase, Server, compared_as_text,  # noqa: F401
                          level_rows, phase_entry, read_serving, request_counts, row,  # (row: tests read it)
                          write_serving)

BACKOFF_S = 0.5  # wait before the second try (doubled each time)
MEASURES = Measures(
    retime=False, resume=True, phases=True, noise=False,
    why_not_retime="a server's requests are measured in load levels the server schedules (many in flight), so one "
                   "turn cannot be timed again beside the same load",
    why_not_noise="this machine's /proc readings count a server on this machine as another process's CPU time, so "
                  "they cannot tell a disturbance from the server's own work; the summary's outlier test and "
                  "interval still apply",
    why_not_explain="a mismatch is explained only where the baseline server returns logits in its top_logprobs "
                    "(vLLM's --logprobs-mode raw_logits) and repeats its own greedy tokens; log-probabilities carry "
                    "no logit scale for the near-tie tolerance, so the row then says `no verdict` and why")


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
        messages = ds.conversation(prompt, turn, answers)
        streamed, error, tries = ask(server, messages, max_tokens)
        out.append(Outcome(turn, streamed, error, tries, order, messages))
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
    """The server(s) connected and warmed up (a server that fails here leaves no run folder behind); --resume
    refuses servers other than the interrupted run's."""
    opts = Options.of(cfg)
    servers = [connect(opts.base_url, opts, "spec" if opts.baseline_url else "server")]
    if opts.baseline_url:
        servers.insert(0, connect(opts.baseline_url, opts, "ar"))
    backend = Servers(cfg, opts, servers, loaded)
    if cfg.resume:
        refuse_other_servers(Path(cfg.out), backend.run_blocks(loaded)["engine"])
    for server in servers:
        warm_up(server, loaded, cfg)
    return backend


def refuse_other_servers(out: Path, engine: dict) -> None:
    """--resume: the servers (URL, model) and their versions must be the interrupted run's, named where not."""
    old = (yaml.safe_load(RunFolder(out).meta.read_text()) or {}).get("engine") or {}
    changed = differences({k: old.get(k) for k in ("servers", "version")},
                          plain({k: engine.get(k) for k in ("servers", "version")}))
    if changed:
        raise SpecbenchError(f"--resume: the run in {out} was measured on other servers: {'; '.join(changed)}. "
                             "Its finished levels would be compared with another server's; resume against the same "
                             "servers, or choose another --out.")


class Servers:
    """The backend of `--engine openai` (run/backend.py): the servers of the run, measured a load level at a time
    (run/load_levels.py), since the server schedules the requests in flight; the run folder, run.yaml, the lossless
    check and the records are the runner's, serving.json is this backend's."""

    measures = MEASURES

    def __init__(self, cfg: RunConfig, opts: Options, servers: list[Server], loaded: list[LoadedDataset]):
        self.cfg, self.opts, self.servers, self.loaded = cfg, opts, servers, loaded
        self.labels = tuple(s.label for s in servers)
        self.model_spec = servers[-1].model
        self.env = local_environment("openai", threads=cfg.threads or 0, dtype="server",
                                     placement=f"openai:{opts.base_url}")
        self.phases: list[dict] = []  # serving.json's filed phases (a resumed run's kept ones first)
        self.failed: list[dict] = []  # serving.json's failed requests
        self.as_text = False  # the level being checked compares text (a server gave no token strings)

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

    def decode(self, tokens: list) -> str:
        return "".join(str(t) for t in tokens)  # token strings or text pieces: the text they spell

    def explain(self, messages, ar_tokens: list, tokens: list, index: int) -> tuple[float, str]:
        """The baseline server's margin at the first divergence (openai_lossless.py), or no verdict and why."""
        baseline = next((s for s in self.servers if s.label == "ar"), None)
        return explain_mismatch(None if self.as_text else baseline, messages, ar_tokens, tokens, index)

    # --------------------------------------------------------------------------------- load levels (load_levels.py)

    def levels(self) -> list[Level]:
        """--concurrency's levels (1: one request at a time), then --request-rate's open loop."""
        levels = [Level("-" if c == 1 else "closed", c) for c in self.opts.concurrency]
        rate = self.opts.request_rate
        return levels + ([Level(f"poisson@{rate:g}", 0, rate)] if rate else [])

    def measure_level(self, level: Level, items) -> LevelRun:
        """Every conversation at `level` on every server (their order rotated per level; at concurrency 1 the
        servers take turns per prompt instead)."""
        phases = measure_level(self.servers, list(items), self.cfg, level, self.levels().index(level))
        rows, failed = level_rows(phases, self.servers, self.loaded)
        self.as_text = compared_as_text(phases, self.servers)  # the level's check (explain reads it)
        return LevelRun(level, rows, own=(phases, failed))  # own: what file_level puts in serving.json

    def finished_levels(self, out: Path) -> set[tuple[int, str]]:
        """The levels serving.json lists a phase of for every server; their phases and failed requests are kept."""
        serving = read_serving(out)
        phases = [p for p in serving.get("phases") or [] if isinstance(p, dict)]
        servers: dict[tuple[int, str], set] = {}
        for p in phases:
            servers.setdefault((int(p.get("batch_size", -1)), str(p.get("batching"))), set()).add(p.get("server"))
        done = {key for key, labels in servers.items() if labels >= set(self.labels)}
        self.phases = [p for p in phases if (int(p["batch_size"]), str(p["batching"])) in done]
        self.failed = [f for f in serving.get("failed") or []
                       if (int(f.get("batch_size", -1)), str(f.get("level"))) in done]
        return done

    def file_level(self, out: Path, run: LevelRun) -> None:
        """serving.json with this level's phases and failed requests added (the level is then finished)."""
        phases, failed = run.own
        self.phases += [phase_entry(p, self.servers) for p in phases]
        self.failed += failed
        write_serving(out, self.servers, self.phases, self.failed, self.opts)

    def close(self, out: Path) -> None:
        """serving.json once more (a resumed run with nothing left still writes it) and what the run should know:
        failed requests, and how the lossless check compared."""
        write_serving(out, self.servers, self.phases, self.failed, self.opts)
        unit = "tokens" if all(s.logprobs for s in self.servers) else "text"
        if self.failed:
            console.print(f"[yellow]{len(self.failed)} request(s) failed after {RETRIES} tries: listed in "
                          f"{out / SERVING_FILE} and in report.md[/]")
        if self.opts.baseline_url:
            console.print(f"[dim]lossless check: spec against ar compared as {unit} (the servers' "
                          f"{'token strings, from logprobs' if unit == 'tokens' else 'streamed text'})[/]")


def warm_up(server: Server, loaded: list[LoadedDataset], cfg: RunConfig) -> None:
    """cfg.warmup short untimed requests (the server's first request often pays for loading and graph capture)."""
    prompt = next((p for d in loaded for p in d.prompts), None)
    for _ in range(cfg.warmup if prompt else 0):
        streamed, error, _tries = ask(server, ds.conversation(prompt, 0, []), min(8, cfg.max_new_tokens))
        if streamed is None:
            raise SpecbenchError(f"warm-up request to {server.endpoint.base_url} failed: {error}")


def measure_level(servers: list[Server], items: list, cfg: RunConfig, level: Level, position: int) -> list[Phase]:
    """One load level on every server, the servers' order rotated by the level's position: a phase per server."""
    order = servers[position % len(servers):] + servers[:position % len(servers)]
    console.print(f"[dim]{level.describe()}: {len(items)} prompts on {', '.join(s.label for s in order)}[/]")
    if level.batch_size == 1:
        return interleaved(order, items, cfg.max_new_tokens)
    phases: list[Phase] = []
    for at, server in enumerate(order):
        phase = Phase(server.label, level.batching, level.batch_size)
        before = read_counts(server)
        if level.rate is None:
            job = lambda item, s=server, at=at: converse(s, item[1], cfg.max_new_tokens, at)  # noqa: E731
            results, phase.wall_s = closed_loop(items, level.batch_size, job)
        else:  # the rate counts requests: each turn is an arrival of its own
            turns = request_arrivals([len(p.turns) for _, p in items], level.rate, cfg.seed)
            job = lambda i, s=server, at=at: converse(s, items[i][1], cfg.max_new_tokens, at, turns[i])  # noqa: E731
            results, phase.wall_s = open_loop(range(len(items)), [t[0] for t in turns], job)
        phase.outcomes = {(d, p.id): r for (d, p), r in zip(items, results)}
        phase.counts = acc.difference(before, read_counts(server)) or request_counts(phase)
        phases.append(phase)
    return phases


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
