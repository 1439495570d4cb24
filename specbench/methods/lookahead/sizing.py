"""Lookahead decoding's W and G sized to the hardware: the widest forward, (W + G)(N - 1), kept where this machine's
latency curve L(w) is still flat, read from its profile as the trees read it (planning/batch_choice.py).

The paper's configuration for 7B models on an A100 (its evaluation scripts: N = 5, W = 15, G = 15) is the ceiling;
without a profile it is used as is, with a note naming the command that measures one."""

from __future__ import annotations

from collections.abc import Callable

from ...planning.batch_choice import KV_LENGTH

PAPER_WINDOW, PAPER_NGRAM, PAPER_GUESSES = 15, 5, 15
FLAT = 1.2  # "still flat": a forward of this width costs at most 20% more than a one-token forward


def flat_width(latency_ms: Callable[[int], float], most: int) -> int:
    """The widest forward (1 .. most) whose latency stays within FLAT of a one-token forward's."""
    limit = FLAT * latency_ms(1)
    widest = 1
    for width in range(2, most + 1):
        if latency_ms(width) <= limit:
            widest = width
    return widest


def fit(budget: int, ngram: int, window: int | None, guesses: int | None) -> tuple[int, int]:
    """(W, G) whose widest forward (W + G)(N - 1) fits `budget` inputs, the ones not given split evenly, each at
    least 1 and at most the paper's 15."""
    per_level = max(budget // (ngram - 1), 2)  # W + G
    if window is None and guesses is None:
        window = guesses = max(1, min(PAPER_WINDOW, per_level // 2))
    elif window is None:
        window = max(1, min(PAPER_WINDOW, per_level - guesses))
    elif guesses is None:
        guesses = max(1, min(PAPER_GUESSES, per_level - window))
    return window, guesses


def sized(profile, ngram: int, window: int | None, guesses: int | None) -> tuple[int, int, str]:
    """(W, G, where they came from) for a profile (a LatencyProfile, L(1, w) or L(B, w)) or None."""
    if window is not None and guesses is not None:
        return window, guesses, "given"
    if profile is None:
        return (window or PAPER_WINDOW, guesses or PAPER_GUESSES,
                "the paper's configuration (no latency profile of this hardware)")
    most = (PAPER_WINDOW + PAPER_GUESSES) * (ngram - 1)
    budget = flat_width(lambda w: profile.latency_ms(w, KV_LENGTH), most)
    w, g = fit(budget, ngram, window, guesses)
    batch = profile.meta.get("batch_size", 1)
    curve = f"L(B={batch}, w)" if batch > 1 else "L(w)"
    return w, g, f"{curve} within {FLAT:g}x of one token's up to width {budget} (profile {profile.hardware})"
