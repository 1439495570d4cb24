"""How long `--compile`'s compiling will take, said before it starts and as it goes.

A shape's first call compiles it (core/model/compile.py): minutes on a CPU when inductor builds its C++ kernels from
scratch, seconds when inductor's on-disk cache holds them from an earlier run (torch keeps that cache across
processes, so a second run of the same shapes reads them back). Before compiling, a run says how many shapes it
expects and the wait per shape: the median of the shapes this machine compiled before (the user cache's
compile_seconds.json, per device kind and cold / warm inductor cache), else a rough default for the device kind.
"""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path

import torch

CACHED_FILES = 50  # files in inductor's cache from which earlier builds are taken to be there (counted up to this)
HISTORY = "compile_seconds.json"  # in the user cache: recent seconds per compiled shape, per device kind and cache
KEPT = 64  # recent shapes kept per key
# seconds a shape, where this machine has compiled none yet: guesses for the kind, said as guesses
DEFAULT_S = {("cpu", "cold"): 120.0, ("cpu", "warm"): 10.0, ("cuda", "cold"): 60.0, ("cuda", "warm"): 10.0}


def inductor_cache() -> tuple[Path | None, int]:
    """(inductor's on-disk cache folder, files in it): compiled kernels a later compile of the same shapes reads
    back instead of building them again. (None, 0) where torch does not say where it is."""
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        folder = Path(cache_dir())
    except (ImportError, AttributeError, OSError):
        return None, 0
    if not folder.is_dir():
        return folder, 0
    return folder, sum(1 for _ in itertools.islice((p for p in folder.rglob("*") if p.is_file()), CACHED_FILES))


def _key(device: torch.device) -> tuple[str, str]:
    _, files = inductor_cache()
    return ("cuda" if device.type == "cuda" else "cpu", "warm" if files >= CACHED_FILES else "cold")


def _history_path() -> Path:
    from ..store import user_cache

    return user_cache() / HISTORY


def _read() -> dict:
    try:
        data = json.loads(_history_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def per_shape(device: torch.device) -> tuple[float, str]:
    """(seconds a shape is expected to take here, where that figure comes from)."""
    key = _key(device)
    seen = [float(s) for s in _read().get("/".join(key), []) if isinstance(s, (int, float))]
    if seen:
        return statistics.median(seen), f"median of {len(seen)} shapes compiled here before, inductor cache {key[1]}"
    return DEFAULT_S[key], f"a guess for a {key[0]} with a {key[1]} inductor cache (none compiled here yet)"


def remember(device: torch.device, seconds: list[float]) -> None:
    """Add a run's seconds per compiled shape to the history (best effort: an unwritable cache is skipped)."""
    if not seconds:
        return
    key = "/".join(_key(device))
    data = _read()
    data[key] = ([*data.get(key, []), *[round(s, 2) for s in seconds]])[-KEPT:]
    try:
        path = _history_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data))
    except OSError:
        pass


def say_expected(name: str, device: torch.device, shapes: int, detail: str = "",
                 before: str = "the first timed token") -> None:
    """Before compiling: the shapes a model will compile and the expected wait (before `before`)."""
    from ...progress import console

    if shapes <= 0:
        return
    each, source = per_shape(device)
    total = each * shapes
    wait = f"{total / 60:.1f} min" if total >= 90 else f"{total:.0f} s"
    console.print(f"[dim]--compile {name}: about {shapes} shape(s) to compile{detail}, ~{each:.0f} s each ({source}): "
                  f"expect ~{wait} before {before} (not timed)[/]")


def say_start(name: str, device: torch.device) -> None:
    """Before the first shape compiles: the wait to expect, from whether inductor's cache holds earlier builds."""
    from ...progress import console

    folder, files = inductor_cache()
    if folder is None:
        return
    wait = ("seconds per shape: inductor's cache holds earlier builds" if files >= CACHED_FILES else
            "minutes per shape on a CPU (C++ kernels built from scratch; later runs read them back)"
            if device.type == "cpu" else "a minute or so per shape (Triton kernels built from scratch)")
    held = f"{files}+" if files >= CACHED_FILES else str(files)
    console.print(f"[dim]--compile {name}: compiling its first shape: expect {wait} ({folder}: {held} files)[/]")


def said(name: str, key: tuple, seconds: float, done: int, expected: int) -> None:
    """One line per compiled shape as it compiles (minutes on a 2-core CPU: the user sees progress)."""
    from ...progress import console

    slots, width, embeds, masked, hidden = key
    batch = f"batch {slots}, " if slots > 1 else ""
    of = f" [{done}/{expected}]" if expected >= done else f" [{done}]"
    console.print(f"[dim]--compile {name}{of}: {batch}width {width} ({'embeddings' if embeds else 'tokens'}, "
                  f"{'tree' if masked else 'causal'} mask, {'hidden' if hidden else 'logits'}) compiled in "
                  f"{seconds:.1f} s (not timed)[/]")
