"""Readers of the speculative-decoding counts a server exposes, in the formats those projects document:

  vLLM      Prometheus counters at /metrics (vllm/v1/spec_decode/metrics.py, SpecDecodingProm):
            vllm:spec_decode_num_drafts_total, vllm:spec_decode_num_draft_tokens_total,
            vllm:spec_decode_num_accepted_tokens_total, vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}
            (server-wide, one series per engine / model_name label set: summed; differenced around a measurement)
  SGLang    per request, the response's meta_info: spec_verify_ct (verification forwards), completion_tokens, and in
            newer versions spec_accept_token_num / spec_draft_token_num (tokenizer_manager.py fills them from the
            scheduler's per-request spec_verify_ct and spec_accepted_tokens, the drafts accepted, bonus excluded).
            The first token comes from the prefill, not from a verification, so completion_tokens = 1 +
            spec_verify_ct + accepted; SGLang's own accept length, completion_tokens / spec_verify_ct, counts that
            token too (a little above the tokens one verification yields)
  llama.cpp llama-server's per-response `timings` (tools/server/server-context.cpp, get_timings): predicted_n is the
            slot's n_decoded, which counts the token sampled after the prompt (1) and then each decode step's
            accepted drafts plus its own token (ids.size()); draft_n_accepted adds ids.size() - 1 per step and
            draft_n the drafted tokens. So decode forwards = predicted_n - 1 - draft_n_accepted (a step that drafted
            nothing is a forward too)

Every reader returns Counts or None ("not exposed by this server"): a missing number is never read as zero.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

VLLM = "vllm:spec_decode_"
# name{labels} value [timestamp]   (the Prometheus text exposition format)
SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
POSITION = re.compile(r'position="(\d+)"')


@dataclass
class Counts:
    """Speculative decoding counts over some requests: verification steps (drafts: vLLM's num_drafts, SGLang's
    spec_verify_ct; None where the server does not say), draft tokens proposed (None: not said), accepted draft
    tokens, accepted per draft position, and where they came from."""

    source: str
    accepted: float
    drafted: float | None = None
    steps: float | None = None
    per_position: dict[int, float] = field(default_factory=dict)

    def __add__(self, other: "Counts") -> "Counts":
        def plus(a, b):
            return None if a is None or b is None else a + b

        pos = {k: self.per_position.get(k, 0.0) + other.per_position.get(k, 0.0)
               for k in set(self.per_position) | set(other.per_position)}
        return Counts(self.source, self.accepted + other.accepted, plus(self.drafted, other.drafted),
                      plus(self.steps, other.steps), pos)

    def summary(self, new_tokens: int | None = None) -> dict:
        """acceptance rate (accepted / drafted), mean acceptance length (1 + accepted / steps: the tokens one
        verification yields, bonus included) and per-position acceptance (accepted at i / steps), where known."""
        out = {"source": self.source, "drafted": self.drafted, "accepted": self.accepted, "steps": self.steps,
               "acceptance_rate": round(self.accepted / self.drafted, 4) if self.drafted else None,
               "acceptance_length": round(1 + self.accepted / self.steps, 4) if self.steps else None}
        if self.per_position and self.steps:
            out["per_position"] = [round(self.per_position[k] / self.steps, 4) for k in sorted(self.per_position)]
        return out


def vllm_counters(text: str) -> Counts | None:
    """vLLM's spec-decode counters in a /metrics page (summed over label sets), or None when the page has none
    (not vLLM, or vLLM without speculative decoding)."""
    totals: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    for line in text.splitlines():
        if not line.startswith(VLLM):
            continue
        m = SAMPLE.match(line)
        if not m:
            continue
        name = m["name"][len(VLLM):]
        if name.endswith("_created"):  # prometheus_client's creation timestamps, not counts
            continue
        name = name.removesuffix("_total")
        try:
            value = float(m["value"])
        except ValueError:
            continue
        if name == "num_accepted_tokens_per_pos":
            pos = POSITION.search(m["labels"] or "")
            if pos:
                per_pos[int(pos[1])] = per_pos.get(int(pos[1]), 0.0) + value
        else:
            totals[name] = totals.get(name, 0.0) + value
    if "num_accepted_tokens" not in totals:
        return None
    return Counts("vllm /metrics", totals["num_accepted_tokens"], totals.get("num_draft_tokens"),
                  totals.get("num_drafts"), per_pos)


def difference(before: Counts | None, after: Counts | None) -> Counts | None:
    """after - before (the counts of what ran in between); None unless both were read."""
    if before is None or after is None:
        return None

    def minus(a, b):
        return None if a is None or b is None else a - b

    pos = {k: after.per_position.get(k, 0.0) - before.per_position.get(k, 0.0) for k in after.per_position}
    return Counts(after.source, after.accepted - before.accepted, minus(after.drafted, before.drafted),
                  minus(after.steps, before.steps), pos)


def _number(d: dict, key: str) -> float | None:
    value = d.get(key)
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def sglang_meta(meta: dict | None) -> Counts | None:
    """One SGLang response's meta_info -> Counts (steps = spec_verify_ct; accepted = spec_accept_token_num, else
    completion_tokens - 1 - spec_verify_ct: the prefill's token, then each verification's accepted drafts plus
    one), or None without spec_verify_ct (speculation off, or not SGLang)."""
    if not isinstance(meta, dict):
        return None
    steps = _number(meta, "spec_verify_ct")
    if steps is None or steps <= 0:
        return None
    accepted = _number(meta, "spec_accept_token_num")
    if accepted is None:
        completion = _number(meta, "completion_tokens")
        if completion is None:
            return None
        accepted = max(completion - 1 - steps, 0.0)
    return Counts("sglang meta_info", accepted, _number(meta, "spec_draft_token_num"), steps)


def llama_timings(timings: dict | None) -> Counts | None:
    """One llama-server response's `timings` -> Counts (drafted draft_n, accepted draft_n_accepted; steps, the decode
    forwards = predicted_n - 1 - draft_n_accepted: the prompt's forward yields the first token, each decode forward
    its accepted drafts plus one), or None without draft_n (no draft model or n-gram drafting configured)."""
    if not isinstance(timings, dict):
        return None
    drafted, accepted = _number(timings, "draft_n"), _number(timings, "draft_n_accepted")
    if drafted is None or accepted is None:
        return None
    predicted = _number(timings, "predicted_n")
    steps = max(predicted - 1 - accepted, 0.0) if predicted is not None else None
    return Counts("llama.cpp timings", accepted, drafted, steps)


def per_request(extra: dict) -> Counts | None:
    """The counts a response carries itself (SGLang meta_info, llama-server timings), or None."""
    return sglang_meta(extra.get("meta_info")) or llama_timings(extra.get("timings"))
