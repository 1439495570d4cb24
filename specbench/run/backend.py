"""Who decodes a run's turns: the Backend protocol the one runner (runner.py, benchmark.py) drives, and the registry
of backends by `--engine` name.

A backend is small, as vLLM's v1 workers and gpt-fast's generate are: it is prepared from the run's config (loads
its models), renders a conversation into the ids it decodes, generates one timed turn of one method, explains a
mismatch with `ar` where it can read logits, names what it ran in run.yaml, and says what it can measure. Everything
else is the runner's, written once for every backend: the run folder and --resume, the work list and its order,
warm-up order, re-timing and the noise guard, the lossless check, records and tokens, Ctrl-C.

Backends are named here by module (an import string, loaded when a run asks for it), as the family declarations
name their methods modules: `backends/` sits above `run/` and implements backends without `run/` importing it. Each
backend module has `check(cfg) -> cfg` (its refusals, before anything is written) and `prepare(cfg, loaded) ->
Backend` (its models loaded; called once the run folder is ready).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch

from ..core.machine import memory
from ..core.machine.timing import wall
from ..data import datasets as ds
from ..errors import SpecbenchError, did_you_mean
from ..methods.base import Generation
from .config import RunConfig

# --engine NAME -> the module implementing its backend
BACKENDS = {"specbench": "specbench.run.own_methods", "llama.cpp": "specbench.backends.llama_cpp",
            "openai": "specbench.backends.openai_server"}
ENGINES = tuple(BACKENDS)

T = TypeVar("T")


@dataclass(frozen=True)
class Measures:
    """What a backend can measure, which decides what the runner applies to it."""

    retime: bool = True  # a turn can be timed again with the same ids and seed, giving the same tokens (--retime)
    resume: bool = True  # a run folder can be continued (--resume): a turn's result does not depend on the session
    why_not_resume: str = ""  # the reason, when resume is False
    batches: bool = False  # decodes batch > 1 jobs (--batch-size)
    phases: bool = False  # measures load levels whole (load_levels.py: a server's concurrency) instead of turns
    why_not_retime: str = ""  # the reason, when retime is False
    noise: bool = True  # this machine's /proc readings can tell a disturbed turn (records' foreign_cpu, steal)
    why_not_noise: str = ""  # the reason, when noise is False
    explain: bool = True  # a mismatch with ar is explained from logits (near-tie or not)
    why_not_explain: str = ""  # where it cannot always be: when and why (the row's verdict names its case)


class Backend(Protocol):
    """What the runner needs from whoever decodes (see the module docstring)."""

    cfg: RunConfig
    env: dict  # core/machine/hardware.environment plus engine, threads, dtype, placement: records and --resume
    labels: tuple[str, ...]  # the run's method labels, in records' order (`ar` first where it runs)
    measures: Measures
    model_spec: str  # records' `model` column

    def prompt_ids(self, messages: list[dict], prompt: ds.Prompt) -> tuple[Any, int] | None:
        """A conversation rendered as this backend's model reads it and fitted into its context (work.fit_prompt):
        (the ids generate() takes, tokens cut from the left), or None: the turn is skipped (said why)."""

    def decode(self, tokens: list) -> str:
        """A turn's new tokens as text (the next turn's conversation carries it)."""

    def generate(self, label: str, ids: Any, seed: int) -> tuple[Generation, float, float]:
        """One turn of one method: (its generation, median wall seconds over --repeats, peak memory MB)."""

    def reference(self, label: str, ids: Any) -> list[int] | None:
        """An untimed reference for this turn's tokens beyond batch-1 `ar` (a compiled `ar`'s eager twin), or None."""

    def explain(self, ids: Any, ar_tokens: list, tokens: list, index: int) -> tuple[float, str]:
        """(logit gap, verdict) at the first index where `tokens` leaves `ar_tokens`, both decoded from `ids`."""

    def warm_up(self, prompts: list[ds.Prompt], batch_labels: list, batch_sizes: list[int], out) -> None:
        """--warmup untimed generations of every method on the first prompt (and of every batched label at each
        batch size the run will decode), before any timed turn."""

    def run_blocks(self, loaded: list) -> dict:
        """run.yaml's blocks about what decoded: model, engine, chosen settings, trees, roofline, peak memory."""

    def profile(self):
        """This hardware's latency profile of the model (the noise guard's floor), or None."""

    def close(self, out) -> None:
        """After the last turn: anything the backend records in the run folder."""


def backend_module(engine: str):
    """The module implementing `--engine engine` (one line naming the choices for an unknown name)."""
    if engine not in BACKENDS:
        raise SpecbenchError(f"--engine {engine}: unknown engine{did_you_mean(engine, ENGINES)}; available: "
                             f"{', '.join(ENGINES)}")
    return importlib.import_module(BACKENDS[engine])


def turn_seed(cfg: RunConfig, index: int, turn: int) -> int:
    """The sampling seed of prompt `index`'s turn: the same for every method, batch size and backend."""
    return cfg.seed * 1_000_003 + index * 16 + turn


def timed(run: Callable[[], T], repeats: int, device: torch.device) -> tuple[T, float, float]:
    """Call `run` `repeats` times (each call seeds its own generators: the same tokens each time); returns the
    result of the call with the median wall time (which keeps one-off stalls of a shared machine out of the
    numbers), that time, and the peak memory over the calls (allocated on GPU, RSS on CPU)."""
    memory.reset_peak(device)
    runs = []
    for _ in range(repeats):
        took: dict = {}
        with wall(device, took):
            result = run()
        runs.append((took["s"], result))
    seconds, result = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
    return result, seconds, memory.peak_mb(device)

