"""--engine openai's options (engine_options of a RunConfig), checked before any request: the server URLs, the API
key from its environment variable, --concurrency levels, --request-rate, --slo and --timeout."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import SpecbenchError
from ..run.config import RunConfig


@dataclass(frozen=True)
class Options:
    """--engine openai's options, checked."""

    base_url: str
    baseline_url: str | None
    served_model: str | None
    api_key: str | None
    concurrency: tuple[int, ...]
    request_rate: float | None
    slo: dict  # {"ttft_ms": float, "tpot_ms": float}, either may be missing
    timeout: float

    @classmethod
    def of(cls, cfg: RunConfig) -> "Options":
        o = cfg.engine_options
        base = o.get("base_url")
        if not base:
            raise SpecbenchError("--engine openai needs --base-url URL (the server's OpenAI-compatible root, e.g. "
                                 "http://127.0.0.1:8000/v1)")
        key = None
        if o.get("api_key_env"):
            key = os.environ.get(o["api_key_env"])
            if not key:
                raise SpecbenchError(f"--api-key-env {o['api_key_env']}: that environment variable is not set (or "
                                     "empty); export it, or drop --api-key-env for a server without a key")
        timeout = float(o.get("timeout", 60.0))
        if not timeout > 0:
            raise SpecbenchError(f"--timeout must be positive seconds (got {timeout:g})")
        rate = o.get("request_rate")
        if rate is not None and not float(rate) > 0:
            raise SpecbenchError(f"--request-rate must be positive requests per second (got {rate})")
        return cls(base, o.get("baseline_url"), o.get("served_model"), key, parse_concurrency(
            str(o.get("concurrency", "1"))), float(rate) if rate is not None else None, parse_slo(o.get("slo")),
            timeout)


def parse_concurrency(text: str) -> tuple[int, ...]:
    """"1,4,16" -> (1, 4, 16); a bad entry is the user's error, naming the option."""
    out = []
    for part in text.split(","):
        try:
            n = int(part.strip())
        except ValueError:
            n = 0
        if n < 1:
            raise SpecbenchError(f"--concurrency {text}: each entry must be a whole number of requests in flight, at "
                                 "least 1 (e.g. --concurrency 1,4,16)")
        out.append(n)
    return tuple(dict.fromkeys(out))


def parse_slo(text: str | None) -> dict:
    """"ttft=500,tpot=50" -> {"ttft_ms": 500.0, "tpot_ms": 50.0} (milliseconds); None -> {}."""
    if not text:
        return {}
    out = {}
    for part in str(text).split(","):
        name, _, value = part.partition("=")
        name = name.strip().lower()
        try:
            ms = float(value)
        except ValueError:
            ms = -1.0
        if name not in ("ttft", "tpot") or ms <= 0:
            raise SpecbenchError(f"--slo {text}: give ttft=MS and/or tpot=MS, positive milliseconds (e.g. --slo "
                                 "ttft=500,tpot=50)")
        out[f"{name}_ms"] = ms
    return out

