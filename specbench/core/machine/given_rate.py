"""A machine rate given in an environment variable instead of measured (a machine measured elsewhere, or a test
suite, which would otherwise measure in every fresh user cache): the bandwidth and the GEMM peak read it alike."""

from __future__ import annotations

import math

from ...errors import SpecbenchError


def positive_rate(env: str, text: str, what: str, unit: str, example: str) -> float:
    """$env's value as a positive finite number of `unit`, or a one-line error saying how to set it."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise SpecbenchError(f"${env}={text!r} is not {what}: set it to {unit} as a positive number (e.g. {example}), "
                             "or unset it to have this machine's measured")
    return value
