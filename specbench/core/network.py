"""Whether the network may and can be used: the offline switches, and a quick reachability probe (so that a model
or dataset missing from the local caches fails at once instead of after the hub client's retries, ~68 s)."""

from __future__ import annotations

import os
import socket
from functools import lru_cache

OFFLINE_VARIABLES = ("SPECBENCH_OFFLINE", "HF_HUB_OFFLINE")


def offline_reason() -> str | None:
    """Why the network is not to be used (an offline switch is set), or None."""
    for var in OFFLINE_VARIABLES:
        if os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            return f"{var}={os.environ[var]}"
    return None


@lru_cache(maxsize=8)
def reachable(host: str, port: int = 443, timeout_s: float = 3.0) -> bool:
    """One TCP connection attempt (DNS included), at most `timeout_s` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def hub_unavailable() -> str | None:
    """Why the Hugging Face hub cannot be used now (offline switch, or not reachable), or None."""
    reason = offline_reason()
    if reason:
        return f"offline ({reason})"
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    host = endpoint.split("://", 1)[-1].split("/", 1)[0].split(":", 1)[0]
    return None if reachable(host) else f"{host} is not reachable from this machine"
