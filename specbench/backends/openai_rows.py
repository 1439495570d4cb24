"""A server run's records (backends/openai_server.py measures it): the server, each request's outcome and each load
level's phase (Server, Outcome, Phase), and what is made of them: one records.csv row per request and load level
(the lossless check of a spec row against the baseline's same prompt turn and level), the phases' speculative
decoding counts where the server exposes none (request_counts), and serving.json."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..data import datasets as ds
from ..run.config import RunConfig
from ..run.records import LosslessOutcome, compare
from ..run.results import RecordWriter
from ..run.work import LoadedDataset
from . import openai_acceptance as acc
from .common import BackendTurn, backend_record
from .openai_client import Endpoint, Streamed
from .openai_options import Options

RETRIES = 3  # tries of one request before it is recorded as failed
SERVING_FILE = "serving.json"  # per phase: wall time, requests, failures, acceptance; every failed request


@dataclass
class Server:
    """One server of the run: its label in the records, its endpoint and the model name requested."""

    label: str
    endpoint: Endpoint
    model: str
    logprobs: bool = True  # ask for logprobs (token strings); dropped when the server refuses them

    @property
    def root(self) -> str:
        """The server's root (where /metrics lives): the base URL without its trailing /v1."""
        base = self.endpoint.base_url
        return base[:-3] if base.endswith("/v1") else base


@dataclass
class Outcome:
    """One request: what streamed back, or the error that ended its tries."""

    turn: int
    streamed: Streamed | None = None
    error: str = ""
    tries: int = 1
    order: int = 0  # this server's position among the servers sent this prompt (rotated per prompt / level)


@dataclass
class Phase:
    """One server at one load level: its outcomes per prompt, its wall time and its acceptance counts."""

    label: str
    level: str  # "-" (concurrency 1), "closed" or "poisson@R"
    batch_size: int
    outcomes: dict = field(default_factory=dict)  # (dataset, prompt id) -> list[Outcome]
    wall_s: float = math.nan
    counts: acc.Counts | None = None


def request_counts(phase: Phase) -> acc.Counts | None:
    """The phase's counts summed from its responses (SGLang meta_info, llama-server timings), or None when no
    response carried any."""
    total = None
    for outcomes in phase.outcomes.values():
        for o in outcomes:
            c = acc.per_request(o.streamed.extra) if o.streamed else None
            if c is not None:
                total = c if total is None else total + c
    return total


def write_rows(writer: RecordWriter, cfg: RunConfig, env: dict, servers: list[Server], loaded: list[LoadedDataset],
               phases: list[Phase]) -> list[dict]:
    """records.csv + tokens.jsonl rows of one level's finished requests (the reference's first); returns the failed
    requests."""
    failed = []
    models = {s.label: s.model for s in servers}
    text_only = not all(s.logprobs for s in servers)
    by_key = {(p.label, p.level): p for p in phases}
    for phase in phases:
        tokens_total = sum(o.streamed.completion_tokens for r in phase.outcomes.values() for o in r if o.streamed)
        reference = by_key.get(("ar", phase.level)) if phase.label == "spec" else None
        for d in loaded:
            for prompt in d.prompts:
                for o in phase.outcomes.get((d.name, prompt.id), []):
                    if o.streamed is None:
                        failed.append({"server": phase.label, "level": phase.level, "batch_size": phase.batch_size,
                                       "dataset": d.name, "prompt_id": prompt.id, "turn": o.turn, "tries": o.tries,
                                       "error": o.error})
                        continue
                    check = lossless(o, reference, (d.name, prompt.id), text_only)
                    record = row(cfg, env, models[phase.label], phase, d.name, prompt, o, check, tokens_total)
                    writer.write(record, o.streamed.tokens if not text_only else [o.streamed.text])
    return failed


def lossless(o: Outcome, reference: Phase | None, key: tuple, text_only: bool) -> LosslessOutcome:
    """spec's greedy output against ar's on the same prompt turn and level: token strings when both servers gave
    logprobs, else the text (the index is then a character's)."""
    if reference is None:
        return LosslessOutcome()
    ref = next((r for r in reference.outcomes.get(key, []) if r.turn == o.turn and r.streamed), None)
    if ref is None:
        return LosslessOutcome()
    if text_only or o.streamed.unit != "tokens" or ref.streamed.unit != "tokens":
        return LosslessOutcome(compare(list(o.streamed.text), list(ref.streamed.text)))
    return LosslessOutcome(compare(o.streamed.tokens, ref.streamed.tokens))


def row(cfg: RunConfig, env: dict, model: str, phase: Phase, dataset: str, prompt: ds.Prompt, o: Outcome,
        check: LosslessOutcome, phase_tokens: int):
    """The records.csv row of one request (common.backend_record's, with the load level's batching columns)."""
    s = o.streamed
    counts = acc.per_request(s.extra)
    n = s.completion_tokens
    tokens = s.tokens if len(s.tokens) == n else (s.tokens + [""] * n)[:n]  # usage's count wins
    times = s.token_times if len(s.token_times) == n else _stretch(s.token_times, n)
    turn = BackendTurn(tokens=tokens, wall_s=s.wall_s, prompt_tokens=int(s.usage.get("prompt_tokens") or 0),
                      token_times=times, turn=o.turn, text=s.text, stopped=s.finish_reason == "stop", order=o.order,
                      target_forwards=int(counts.steps) + 1 if counts and counts.steps is not None else None,
                      drafted=int(counts.drafted or 0) if counts else 0, accepted=int(counts.accepted) if counts else 0)
    record = backend_record(cfg, env, model, phase.label, dataset, prompt, turn, check)
    if phase.batch_size == 1:
        return replace(record, timing_tries=o.tries)
    share = phase.wall_s * n / phase_tokens if phase_tokens else s.wall_s
    return replace(record, batch_size=phase.batch_size, batching=phase.level, batch_id=f"{phase.level}-{phase.batch_size}",
                   wall_s=round(share, 6), tokens_per_s=round(n / share, 4) if share else 0.0,
                   batch_wall_s=round(phase.wall_s, 6), latency_s=round(s.wall_s, 6), timing_tries=o.tries)


def _stretch(times: list[float], n: int) -> list[float]:
    """Arrival times for n tokens when the stream showed fewer pieces than the server counted (several tokens in
    one piece): the pieces' times repeated in order, the last one held."""
    if not times:
        return []
    return [times[min(int(i * len(times) / n), len(times) - 1)] for i in range(n)]


def write_serving(out: Path, servers: list[Server], phases: list[Phase], failed: list[dict], opts: Options) -> None:
    """serving.json: per phase its wall time, requests, failures and acceptance ("not exposed by this server" where
    none was read); every failed request with its error; the SLO the report's goodput uses."""
    def acceptance(p: Phase):
        return p.counts.summary() if p.counts else "not exposed by this server"

    data = {"slo": opts.slo, "retries": RETRIES,
            "lossless_unit": "tokens" if all(s.logprobs for s in servers) else "text",
            "phases": [{"server": p.label, "url": next(s.endpoint.base_url for s in servers if s.label == p.label),
                        "batching": p.level, "batch_size": p.batch_size, "wall_s": round(p.wall_s, 6),
                        "requests": sum(len(r) for r in p.outcomes.values()),
                        "failed": sum(1 for r in p.outcomes.values() for o in r if o.streamed is None),
                        "acceptance": acceptance(p)} for p in phases],
            "failed": failed}
    (out / SERVING_FILE).write_text(json.dumps(data, indent=1, default=_plain) + "\n")


def _plain(value):
    return None if isinstance(value, float) and math.isnan(value) else str(value)
