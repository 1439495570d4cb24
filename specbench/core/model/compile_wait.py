"""How long `--compile`'s compiling will take, said before it starts and as it goes.

A shape's first call compiles it (core/model/compile.py): minutes on a CPU when inductor builds its C++ kernels from
scratch, seconds when inductor's on-disk cache holds them from an earlier run (torch keeps that cache across
processes, so a second run of the same shapes reads them back; a shape is the same only at the same width, kind of
input and cache capacity). Before compiling, a run says how many shapes it expects and the wait per shape, built
and read back: the medians of the shapes this machine compiled before for the same model (the user cache's
compile_seconds.json, per device kind, model class, parameter count and dtype, and whether inductor's cache served
the shape), else a rough guess for the device kind, said as a guess. Whether a shape was read back is inductor's
own count of FX-graph cache hits during its first call.
"""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path

import torch

from ..batch.static import TAPS
from .compile_graph import QUICK_BUILD, quick_build, settings

CACHED_FILES = 50  # files in inductor's cache from which earlier builds are taken to be there (counted up to this)
READ_BACK = " (read back from inductor's cache)"
HISTORY = "compile_seconds.json"  # in the user cache: recent seconds per compiled shape, per device kind and cache
KEPT = 64  # recent shapes kept per key
LONG_WAIT_S = 600.0  # a wait this long (every shape built) says how to shorten it (quick_hint)
# seconds a shape, where this machine has compiled none of the model yet: guesses for the kind, said as guesses
DEFAULT_S = {("cpu", "built"): 120.0, ("cpu", "read"): 20.0, ("cuda", "built"): 60.0, ("cuda", "read"): 10.0}


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


def cache_hits() -> int:
    """Inductor's count of FX graphs read back from its cache in this process (a shape's first call that raises it
    was read back, not built)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return 0
    return int(counters["inductor"]["fxgraph_cache_hit"])


def model_key(model) -> str:
    """What the history is kept per: the model's class, parameter count and dtype (a tiny test model's seconds
    never promise a real model's wait), and `-quick` under $SPECBENCH_COMPILE_QUICK_BUILD=1 (a quick build's seconds
    never promise the full build's, nor the other way)."""
    params = list(model.parameters()) if model is not None else []
    dtype = str(params[0].dtype).replace("torch.", "") if params else "none"
    return f"{type(model).__name__}-{sum(p.numel() for p in params)}-{dtype}{'-quick' if quick_build() else ''}"


def _kind(device: torch.device) -> str:
    return "cuda" if device.type == "cuda" else "cpu"


def _read() -> dict:
    from ..store import read_cached_json

    return read_cached_json(HISTORY)


def per_shape(device: torch.device, model=None) -> tuple[float, float, str]:
    """(seconds a shape takes here when built, when read back from inductor's cache, where the figures come from)."""
    kind, data = _kind(device), _read()
    out, sources = [], []
    for how in ("built", "read"):
        seen = [float(s) for s in data.get(f"{kind}/{model_key(model)}/{how}", []) if isinstance(s, (int, float))]
        if seen:
            out.append(statistics.median(seen))
            sources.append(f"{how}: median of {len(seen)} shapes of this model compiled here")
        else:
            out.append(DEFAULT_S[(kind, how)])
            sources.append(f"{how}: a guess for a {kind}")
    return out[0], out[1], "; ".join(sources)


def remember(device: torch.device, shapes: list, model=None) -> None:
    """Add a run's compiled shapes to the history: (seconds, read back from inductor's cache) pairs, or seconds
    alone for shapes built (best effort: an unwritable cache is skipped)."""
    if not shapes:
        return
    data = _read()
    for seconds, read in (s if isinstance(s, tuple) else (s, False) for s in shapes):
        key = f"{_kind(device)}/{model_key(model)}/{'read' if read else 'built'}"
        data[key] = [*data.get(key, []), round(float(seconds), 2)][-KEPT:]
    from ..store import write_cached_json

    write_cached_json(HISTORY, data)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def say_expected(name: str, device: torch.device, shapes: int, detail: str = "",
                 before: str = "the first timed token", model=None) -> None:
    """Before compiling: the shapes a model will compile and the expected wait (before `before`): between every
    shape read back from inductor's cache and every shape built afresh."""
    from ...progress import console

    if shapes <= 0:
        return
    built, read, source = per_shape(device, model)
    console.print(f"[dim]--compile {name}: about {shapes} shape(s) to compile{detail}, ~{built:.0f} s a shape built, "
                  f"~{read:.0f} s read back from inductor's cache (the same shapes run here before) ({source}): "
                  f"expect {_minutes(read * shapes)} to {_minutes(built * shapes)} before {before} (not timed)"
                  f"{quick_hint(device, built * shapes)}[/]")


def quick_hint(device: torch.device, seconds: float) -> str:
    """Where building every shape would take 10 minutes or more with the C++ wrapper built in full on a CPU: how to
    halve it (compile_graph.QUICK_BUILD); '' elsewhere."""
    if device.type == "cuda" or seconds < LONG_WAIT_S or settings(device).get("wrapper_build") != "together":
        return ""
    return f"; ${QUICK_BUILD}=1 builds a new shape in about half the time, for a forward's fixed cost 2-4% higher"


def say_ahead(name: str, shapes: int, done: int, device: torch.device | None = None, model=None) -> None:
    """After warm-up: the exact count of shapes still to compile (every bucket at every kind of input warm-up met;
    the count said before warm-up could not know the kinds) and their wait."""
    from ...progress import console

    built, read, _ = per_shape(device or torch.device("cpu"), model)
    console.print(f"[dim]--compile {name}: {shapes} more shape(s) to compile after the {done} warm-up compiled (each "
                  f"bucket at each kind of input it met): {_minutes(read * shapes)} to {_minutes(built * shapes)} "
                  f"(not timed)[/]")


def say_start(name: str, device: torch.device) -> None:
    """Before the first shape compiles: the wait to expect, from whether inductor's cache holds earlier builds."""
    from ...progress import console

    folder, files = inductor_cache()
    if folder is None:
        return
    wait = ("seconds for a shape compiled here before at the same cache size (read back from inductor's cache), "
            "minutes for a new one" if files >= CACHED_FILES else
            "minutes per shape on a CPU (C++ kernels built from scratch; later runs read them back)"
            if device.type == "cpu" else "a minute or so per shape (Triton kernels built from scratch)")
    held = f"{files}+" if files >= CACHED_FILES else str(files)
    console.print(f"[dim]--compile {name}: compiling its first shape: expect {wait} ({folder}: {held} files)[/]")


def output_name(hidden: bool | int) -> str:
    """What a compiled shape returns, by its `hidden` (core/batch/static.step): logits, hidden states, or hidden
    states and the inputs of the layers it taps (TAPS)."""
    return "hidden and layer taps" if hidden == TAPS else "hidden" if hidden else "logits"


def said(name: str, key: tuple, seconds: float, done: int, expected: int, read_back: bool = False,
         edits: tuple = ()) -> None:
    """One line per compiled shape as it compiles (minutes on a 2-core CPU: the user sees progress); `edits`: the
    shape's layer edits as (layer, rows) pairs (Hidden Transfer's tree states: one graph per state at one width)."""
    from ...progress import console

    slots, width, embeds, masked, hidden = key
    batch = f"batch {slots}, " if slots > 1 else ""
    of = f" [{done}/{expected}]" if expected >= done else f" [{done}]"
    edited = ", layer edits " + " ".join(f"{layer}:{rows}" for layer, rows in edits) if edits else ""
    console.print(f"[dim]--compile {name}{of}: {batch}width {width} ({'embeddings' if embeds else 'tokens'}, "
                  f"{'tree' if masked else 'causal'} mask, {output_name(hidden)}{edited}) compiled in "
                  f"{seconds:.1f} s{READ_BACK if read_back else ''} (not timed)[/]")
