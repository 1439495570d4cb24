"""A server's lossless mismatch explained, where the server allows it: the spec server's greedy output left the
baseline's (`ar`) at token `index`; was that a near-tie the arithmetic can flip (common.near_tie, the rule every
backend shares), or not?

The baseline server is asked once more, untimed, for the same conversation up to the divergence (max_tokens =
index + 1) with its top_logprobs. The near-tie tolerance scales with the largest |logit| at that position, so the
scores must be logits: vLLM returns them with `--logprobs-mode raw_logits`. Log-probabilities (every other server,
and vLLM's default) are logits shifted by an unknown constant: their difference is still ar's logit margin (the
gap, recorded), but they carry no scale for the tolerance, so the row says `no verdict` and why. Scores are read as
logits when they cannot be log-probabilities (one above 0, or their exponentials summing above 1). The largest
|logit| is taken over the top entries only, which can make the tolerance smaller than the rule's (never larger).
"""

from __future__ import annotations

import math

import numpy as np

from ..run.lossless import UNEXPLAINED
from .common import near_tie
from .openai_client import ServerError
from .openai_rows import Server

TOP_LOGPROBS = 20  # the OpenAI API's largest top_logprobs
NO_VERDICT = "no verdict"  # run/lossless.lossless_verdicts counts a verdict starting so as unchecked, not a defect


def explain_mismatch(baseline: Server | None, messages: list, ar_tokens: list, tokens: list,
                     index: int) -> tuple[float, str]:
    """(gap, verdict) at the first mismatch `index` of `tokens` against `ar_tokens` (token strings), from the
    baseline server's scores there: "near-tie" / "unexplained" from logits, else NaN or the log-probability gap and
    "no verdict: <why>"."""
    if baseline is None or not baseline.logprobs:
        return math.nan, f"{NO_VERDICT}: compared as text (a server gave no logprobs), no scores to read"
    if index >= len(ar_tokens) or index >= len(tokens):
        return math.nan, UNEXPLAINED  # one answer is longer: a length difference, which rounding cannot cause
    try:
        again = baseline.endpoint.stream_chat(baseline.model, list(messages), index + 1, True,
                                              {"top_logprobs": TOP_LOGPROBS})
    except ServerError as exc:
        return math.nan, f"{NO_VERDICT}: the baseline server did not answer the explaining request ({exc})"
    if list(again.tokens[:index]) != list(ar_tokens[:index]):
        return math.nan, (f"{NO_VERDICT}: the baseline server did not repeat its own greedy tokens before the "
                          "divergence (its output depends on the load it ran under)")
    if len(again.top) <= index or not again.top[index]:
        return math.nan, f"{NO_VERDICT}: the baseline server returned no top_logprobs at the divergence"
    return scores_verdict(again.top[index], str(ar_tokens[index]), str(tokens[index]))


def scores_verdict(scores: dict, ar_token: str, token: str) -> tuple[float, str]:
    """(gap, verdict) from one position's top scores ({token string: score}) of the baseline server."""
    values = {t: float(v) for t, v in scores.items() if isinstance(v, (int, float)) and math.isfinite(float(v))}
    if ar_token not in values:
        return math.nan, f"{NO_VERDICT}: the baseline's own token is not among its top_logprobs there"
    names = list(values)
    row = np.array([values[t] for t in names])
    if not are_logits(row):
        gap = values[ar_token] - values[token] if token in values else math.nan
        return gap, (f"{NO_VERDICT}: the server gives log-probabilities, not logits, and the near-tie tolerance "
                     "scales with the largest |logit| (vLLM returns logits with --logprobs-mode raw_logits)")
    if token not in values:  # below every listed score: the margin is at least ar's score minus the lowest
        least = float(values[ar_token] - row.min())
        _, verdict = near_tie(row, names.index(ar_token), int(row.argmin()))
        if verdict == UNEXPLAINED:
            return math.nan, UNEXPLAINED
        return math.nan, (f"{NO_VERDICT}: the spec server's token is not among the baseline's top "
                          f"{len(values)} (margin at least {least:.4g}, within the tolerance)")
    return near_tie(row, names.index(ar_token), names.index(token))


def are_logits(scores: np.ndarray) -> bool:
    """Scores that cannot be log-probabilities (one above 0, or exponentials summing above 1): logits."""
    if (scores > 1e-6).any():
        return True
    return float(np.exp(scores).sum()) > 1 + 1e-3
