"""A server run's rows (backends/openai_server.py measures them): the server, each request's outcome and each load
level's phase (Server, Outcome, Phase), and what is made of them: each answered request as a timed turn the run
loop checks and records (run/load_levels.py), the phases' speculative decoding counts where the server exposes
none (request_counts), and serving.json."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..data import datasets as ds
from ..methods.base import Generation
from ..run.config import RunConfig
from ..run.load_levels import LevelRow
from ..run.records import LosslessOutcome, TurnResult, build_record
from ..run.results import Record
from ..run.work import LoadedDataset
from . import openai_acceptance as acc
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
    messages: list = field(default_factory=list)  # the conversation sent


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


def level_rows(phases: list[Phase], servers: list[Server],
               loaded: list[LoadedDataset]) -> tuple[list[LevelRow], list[dict]]:
    """One level's answered requests as the runner checks and records them (compared as text where a server gave
    no token strings), and its failed requests (serving.json's)."""
    rows, failed = [], []
    models = {s.label: s.model for s in servers}
    text_only = compared_as_text(phases, servers)
    for phase in phases:
        tokens_total = sum(o.streamed.completion_tokens for r in phase.outcomes.values() for o in r if o.streamed)
        for d in loaded:
            for prompt in d.prompts:
                for o in phase.outcomes.get((d.name, prompt.id), []):
                    if o.streamed is None:
                        failed.append({"server": phase.label, "level": phase.level, "batch_size": phase.batch_size,
                                       "dataset": d.name, "prompt_id": prompt.id, "turn": o.turn, "tries": o.tries,
                                       "error": o.error})
                        continue
                    r = turn_result(phase, o, tokens_total)
                    if text_only:
                        r.tokens_compared = list(o.streamed.text)  # the index of a mismatch is then a character's
                    rows.append(LevelRow(d.name, prompt, r, models[phase.label], prompt_tokens(o.streamed),
                                         saved=o.streamed.tokens if not text_only else [o.streamed.text]))
    return rows, failed


def compared_as_text(phases: list[Phase], servers: list[Server]) -> bool:
    """A level's outputs are compared as text when a server gave no token strings (it refused or ignored logprobs)
    on any of its requests; else token by token."""
    return not all(s.logprobs for s in servers) or any(
        o.streamed.unit != "tokens" for p in phases for r in p.outcomes.values() for o in r if o.streamed)


def prompt_tokens(s: Streamed) -> int:
    """The server's count of the prompt's tokens (its usage block), 0 where it sent none."""
    return int(s.usage.get("prompt_tokens") or 0)


def turn_result(phase: Phase, o: Outcome, phase_tokens: int) -> TurnResult:
    """One request as a timed turn: its streamed tokens and their arrival times, the counts the server exposed,
    and at N > 1 or under Poisson arrivals the level's batching columns. There a row's seconds are its share of the
    phase's wall time (the phase's time x its share of the phase's tokens), so sums over rows give the phase's
    output throughput; latency_s is the request's own end-to-end time."""
    s = o.streamed
    counts = acc.per_request(s.extra)
    n = s.completion_tokens
    tokens = s.tokens if len(s.tokens) == n else (s.tokens + [""] * n)[:n]  # usage's count wins
    times = s.token_times if len(s.token_times) == n else _stretch(s.token_times, n)
    gen = Generation(tokens=list(tokens), token_times=list(times), stopped=s.finish_reason == "stop",
                     target_forwards=int(counts.steps) + 1 if counts and counts.steps is not None else 0,
                     drafted=int(counts.drafted or 0) if counts else 0,
                     accepted_drafts=int(counts.accepted) if counts else 0)
    # ids: the conversation sent (what a mismatch's explanation asks again); peak memory is the server's, unknown
    r = TurnResult(phase.label, o.turn, list(o.messages), gen, s.wall_s, math.nan, {}, o.order, tries=o.tries)
    if phase.batch_size != 1:
        r.seconds = phase.wall_s * n / phase_tokens if phase_tokens else s.wall_s
        gen.latency_s = s.wall_s
        r.batch = {"batch_size": phase.batch_size, "batching": phase.level,
                   "batch_id": f"{phase.level}-{phase.batch_size}", "batch_wall_s": round(phase.wall_s, 6)}
    return r


def row(cfg: RunConfig, env: dict, model: str, phase: Phase, dataset: str, prompt: ds.Prompt, o: Outcome,
        outcome: LosslessOutcome, phase_tokens: int) -> Record:
    """The records.csv row of one request (run/records.build_record's, as the run loop writes it)."""
    return build_record(cfg, env, model, phase.label, dataset, prompt, turn_result(phase, o, phase_tokens), outcome,
                        prompt_tokens=prompt_tokens(o.streamed))


def _stretch(times: list[float], n: int) -> list[float]:
    """Arrival times for n tokens when the stream showed fewer pieces than the server counted (several tokens in
    one piece): the pieces' times repeated in order, the last one held."""
    if not times:
        return []
    return [times[min(int(i * len(times) / n), len(times) - 1)] for i in range(n)]


def phase_entry(p: Phase, servers: list[Server]) -> dict:
    """serving.json's entry of one phase: its wall time, requests, failures and acceptance ("not exposed by this
    server" where none was read)."""
    return {"server": p.label, "url": next(s.endpoint.base_url for s in servers if s.label == p.label),
            "batching": p.level, "batch_size": p.batch_size, "wall_s": round(p.wall_s, 6),
            "requests": sum(len(r) for r in p.outcomes.values()),
            "failed": sum(1 for r in p.outcomes.values() for o in r if o.streamed is None),
            "acceptance": p.counts.summary() if p.counts else "not exposed by this server"}


def write_serving(out: Path, servers: list[Server], phases: list[dict], failed: list[dict], opts: Options) -> None:
    """serving.json: every filed phase (phase_entry), every failed request with its error, the SLO the report's
    goodput uses. Written whole after each level (a level it lists is finished: run/load_levels.py)."""
    data = {"slo": opts.slo, "retries": RETRIES,
            "lossless_unit": "tokens" if all(s.logprobs for s in servers) else "text",
            "phases": phases, "failed": failed}
    path = out / SERVING_FILE
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(data, indent=1, default=_plain) + "\n")
    partial.replace(path)  # a Ctrl-C mid-write leaves the earlier file whole


def read_serving(out: Path) -> dict:
    """serving.json as an interrupted run left it ({} where there is none or it cannot be read)."""
    try:
        data = json.loads((out / SERVING_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _plain(value):
    return None if isinstance(value, float) and math.isnan(value) else str(value)
