"""Building result records: one timed prompt turn (TurnResult) plus its lossless check (LosslessOutcome) -> one
Record row.

The check compares a method's tokens with ar's (greedy runs only); a mismatch carries ar's logit gap at the first
differing position and lossless.py's verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from ..data import datasets as ds
from ..methods.base import Generation
from .config import RunConfig
from .results import Record


@dataclass
class TurnResult:
    """One timed generation of one prompt turn, before it is checked and written."""

    label: str
    turn: int
    ids: object  # what the method was given: [1, prompt length] tensor (specbench) or a list of ids (engines)
    gen: Generation
    seconds: float  # median wall time of the repeats
    mem: float  # peak memory, MB
    noise: dict  # contention.between(): foreign_cpu, steal, load_before, load_after
    order: int  # position among the methods run on this prompt
    batch: dict = field(default_factory=dict)  # batch > 1: batch_size, batching, batch_id, batch_wall_s, forward_ms
    tries: int = 1  # timings taken of this turn (--retime: run/retime.py)
    reference: list[int] | None = None  # --compile, ar: eager ar's tokens of the same prompt (the lossless reference)
    disturbed: bool = False  # the kept timing was still disturbed
    tokens_compared: list | None = None  # what the lossless check compares instead of gen.tokens (a server's text)

    @property
    def forward_ms(self) -> float:
        """Wall time per target forward, ms (what the outlier test compares)."""
        return self.seconds * 1e3 / max(self.gen.target_forwards, 1)


@dataclass(frozen=True)
class LosslessOutcome:
    """A turn's lossless check against ar: "match", "mismatch@<index>" or "" (no greedy reference), and at a
    mismatch ar's logit gap and the verdict."""

    lossless: str = ""
    gap: float = math.nan
    verdict: str = ""


def compare(tokens: list[int], reference: list[int]) -> str:
    """"match", or "mismatch@<index>" at the first position where `tokens` leaves `reference`."""
    for i, (a, b) in enumerate(zip(tokens, reference)):
        if a != b:
            return f"mismatch@{i}"
    return "match" if len(tokens) == len(reference) else f"mismatch@{min(len(tokens), len(reference))}"


def build_record(cfg: RunConfig, env: dict, model: str, method: str, dataset: str, prompt: ds.Prompt,
                 r: TurnResult, outcome: LosslessOutcome, prompt_cut: int = 0, prompt_tokens: int | None = None) -> Record:
    """The records.csv row of one turn, whichever backend decoded it (env: the backend's environment, its dtype,
    placement and engine included; model: the model as the run names it; prompt_cut: tokens cut from the prompt's
    left to fit the context; prompt_tokens: the prompt's length where the decoder, not `r.ids`, knows it). No target
    forwards counted (a server that does not say) leaves tau and forward_ms empty, never guessed."""
    gen, seconds, n = r.gen, r.seconds, len(r.gen.tokens)
    counted = gen.target_forwards > 0
    gap = outcome.gap
    per_pos = " ".join(f"{a}/{d}" for a, d in zip(gen.accepted_per_position, gen.drafted_per_position))
    fields = dict(
        method=method, dataset=dataset, prompt_id=str(prompt.id), category=prompt.category, turn=r.turn,
        prompt_tokens=prompt_length(r.ids) if prompt_tokens is None else prompt_tokens, new_tokens=n,
        wall_s=round(seconds, 6),
        tokens_per_s=round(n / seconds, 4) if seconds else 0.0,
        target_forwards=gen.target_forwards, tau=round(n / gen.target_forwards, 4) if counted else math.nan,
        drafted=gen.drafted, draft_forwards=gen.draft_forwards, draft_s=round(gen.draft_s, 6),
        accepted_drafts=gen.accepted_drafts,
        acceptance_rate=round(gen.accepted_drafts / gen.drafted, 4) if gen.drafted else float("nan"),
        lossless=outcome.lossless, stopped=gen.stopped, peak_mem_mb=round(r.mem, 1), accepted_per_position=per_pos,
        temperature=cfg.temperature, model=model, dtype=env["dtype"], engine=env.get("engine", "specbench"),
        device=env["device"], threads=env["threads"], torch=env["torch"],
        transformers=env["transformers"], git=env["git"], hardware=env["hardware"],
        placement=env.get("placement", ""),
        mismatch_logit_gap=round(gap, 6) if not math.isnan(gap) else gap, mismatch_explained=outcome.verdict,
        forward_ms=round(r.forward_ms, 3) if counted else math.nan, order=r.order, timing_tries=r.tries,
        timing_disturbed=r.disturbed,
        prompt_cut=prompt_cut, compiled_forwards=_count(gen.compiled_forwards),
        eager_forwards=_count(gen.eager_forwards), **r.noise)
    fields.update(batch_fields(r))  # a batched row's forward_ms is its batch's time per batched step
    fields.update(host_split(r))
    fields.update(serving_view(r.gen.token_times))  # ttft_s, tpot_ms, itl percentiles (a batched sample's own)
    return Record(**fields)


def prompt_length(ids) -> int:
    """Tokens in a prompt as a backend holds it: a [1, n] tensor or a list of n ids."""
    return int(ids.shape[1]) if isinstance(ids, torch.Tensor) else len(ids)


def same_ids(a, b) -> bool:
    """Two prompts, as a backend holds them, are the same ids."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    return list(a) == list(b)


def _count(n: int | None) -> float:
    return math.nan if n is None else n


def serving_view(token_times: list[float]) -> dict:
    """A turn's serving columns from its tokens' emission times (seconds from its start: Generation.token_times):
    time to first token, time per output token after the first ((last - first) / (n - 1), ms), the request's
    inter-token gaps and their p50 / p90 / p99 (ms). A gap is between two arrivals, as vLLM's `bench serve` counts
    them (one per streamed chunk after the first): tokens that share a time (one forward's accepted drafts, one
    chunk of several tokens) are one arrival. `itl_gaps_ms` keeps every gap, space-separated, so the report pools
    them over requests (report/serving.py). NaN (and "") where there are no times or no second arrival."""
    out = {"ttft_s": math.nan, "tpot_ms": math.nan, "itl_p50_ms": math.nan, "itl_p90_ms": math.nan,
           "itl_p99_ms": math.nan, "itl_gaps_ms": ""}
    if not token_times:
        return out
    out["ttft_s"] = round(token_times[0], 6)
    if len(token_times) > 1:
        out["tpot_ms"] = round((token_times[-1] - token_times[0]) * 1e3 / (len(token_times) - 1), 4)
    gaps = arrival_gaps_ms(token_times)
    if gaps:
        for q in (50, 90, 99):
            out[f"itl_p{q}_ms"] = round(float(np.percentile(gaps, q)), 4)
        out["itl_gaps_ms"] = " ".join(f"{g:.3f}" for g in gaps)
    return out


def arrival_gaps_ms(token_times: list[float]) -> list[float]:
    """The gaps (ms) between consecutive distinct arrival times: [t0, t1, t1, t2] -> [t1 - t0, t2 - t1]."""
    arrivals = [t for i, t in enumerate(token_times) if i == 0 or t != token_times[i - 1]]
    return [float(b - a) * 1e3 for a, b in zip(arrivals, arrivals[1:])]


def host_split(r: TurnResult) -> dict:
    """forward_s (seconds inside the target's forwards: core/machine/forward_clock.py) and host_s = wall_s -
    forward_s - draft_s, of the same timed call. NaN where not measured: batched rows (a batch's forwards are shared;
    not split per sample) and turns with no forward timed; host_s also NaN where drafting ran beside the target
    (PEARL: forward_s + draft_s > wall_s, the parts overlap)."""
    gen = r.gen
    if r.batch or gen.forward_s <= 0:
        return {"forward_s": math.nan, "host_s": math.nan}
    host = r.seconds - gen.forward_s - gen.draft_s
    return {"forward_s": round(gen.forward_s, 6), "host_s": round(host, 6) if host >= 0 else math.nan}


def batch_fields(r: TurnResult) -> dict:
    """The record's batching columns: batch 1's, or a batched row's (its batch's time and padding)."""
    gen = r.gen
    fields = {"target_tokens": gen.target_tokens, "padding_tokens": gen.padding_tokens,
              "padding_ratio": round(gen.padding_tokens / gen.target_tokens, 4) if gen.target_tokens else 0.0,
              "kv_padding": gen.kv_padding, "batch_wall_s": round(r.seconds, 6), "latency_s": round(r.seconds, 6)}
    fields["kv_padding_ratio"] = round(gen.kv_padding / len(gen.tokens), 4) if gen.tokens else 0.0
    if r.batch:
        fields.update(r.batch, latency_s=round(gen.latency_s, 6), prefill_tokens=gen.prefill_tokens)
        decode_s = r.seconds - fields.get("prefill_s", math.nan)
        decoded = len(gen.tokens) - gen.prefill_tokens
        fields["decode_tokens_per_s"] = round(decoded / decode_s, 4) if decode_s > 0 else math.nan
    return fields
