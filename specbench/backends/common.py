"""What the production decoders' backends share beside the runner (run/backend.py): the methods a backend runs
and the options it refuses (check_methods), the environment its records carry (local_environment), and the
lossless explanation from a decoder's logits (near_tie: llama.cpp's, and a server's where it returns logits,
openai_lossless.py).

near_tie's rule: at the first divergence, gap = ar's logit of its own token minus its logit of the method's token,
"near-tie" within the arithmetic's rounding (run/lossless.py's rule), else "unexplained".
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import SpecbenchError
from ..methods import get_method
from ..run.config import RunConfig
from ..run.lossless import NEAR_TIE, UNEXPLAINED, CALIBRATION_LAYERS, DTYPE_ULPS, FLOAT32_ULPS


def check_methods(cfg: RunConfig, supported: tuple[str, ...], backend: str) -> RunConfig:
    """The config with `ar` first; refuses a method the backend does not run, listing those it does, and the
    cheap mistakes specbench's own validation refuses (--max-new-tokens, --limit, --threads, --warmup)."""
    for flag, value, least in (("--max-new-tokens", cfg.max_new_tokens, 1), ("--limit", cfg.limit, 1),
                               ("--threads", cfg.threads, 1), ("--warmup", cfg.warmup, 0), ("--repeats", cfg.repeats, 1)):
        if value is not None and value < least:
            raise SpecbenchError(f"{flag} must be at least {least} (got {value})")
    for name in cfg.methods:
        if name not in supported:
            get_method(name)  # a typo is named as such (did you mean ...) before the backend's own refusal
            raise SpecbenchError(f"-m {name}: --engine {backend} runs {', '.join(supported)} (its own decoding); "
                                 f"run {name} with --engine specbench, or drop -m {name}")
    if max(cfg.batch_sizes) > 1 or cfg.shard or cfg.tree_sizes or cfg.tp > 1:
        raise SpecbenchError(f"--engine {backend} decodes one prompt at a time on one machine: drop --batch-size, "
                             "--shard, --tree-sizes and --tp (they are options of --engine specbench)")
    refuse_own_options(cfg, backend)
    methods = ("ar",) + tuple(dict.fromkeys(m for m in cfg.methods if m != "ar"))
    return RunConfig(**{**cfg.__dict__, "methods": methods})


def refuse_own_options(cfg: RunConfig, backend: str) -> None:
    """--compile and --synthetic-acceptance change how specbench's own methods decode: refused by name under another
    backend (they would be recorded, never applied)."""
    if cfg.compile:
        raise SpecbenchError(f"--compile compiles specbench's own loop, not --engine {backend}: leave one out")
    if cfg.synthetic_acceptance is not None:
        raise SpecbenchError(f"--synthetic-acceptance decides acceptance inside specbench's own decode step; --engine "
                             f"{backend} accepts in its own code. Drop one of them (a server's own synthetic "
                             "acceptance, e.g. vLLM's, is set on the server)")


def local_environment(backend: str, threads: int, dtype: str, placement: str = "") -> dict:
    """The environment records and run.yaml carry (core.machine.hardware.environment: hardware slug and identity,
    library versions, git), with the decoder's own threads and weight type (e.g. "Q4_1") and the backend's name."""
    import torch

    from ..core.machine.hardware import environment

    env = environment(torch.device("cpu"))
    env.update(threads=int(threads), dtype=str(dtype), engine=backend, placement=placement or f"{backend}:cpu")
    return env


def near_tie(logits: np.ndarray, ar_token: int, method_token: int, layers: int = CALIBRATION_LAYERS,
             eps: float = 2.0 ** -7) -> tuple[float, str]:
    """(gap, verdict) from ar's logits at the first divergence (run/lossless.py's rule): gap = logit[ar's token] -
    logit[method's token]; "near-tie" when |gap| <= max|logit| x (8 ulps at `eps` + 128 float32 ulps) x
    sqrt(layers / 30), else "unexplained". eps 2^-7 (default): a quantised decoder's 8-bit activations round about as
    coarsely as bfloat16 (not calibrated on any decoder: a wide tolerance, said so in docs/engines.md)."""
    row = np.asarray(logits, dtype=np.float64).reshape(-1)
    gap = float(row[int(ar_token)] - row[int(method_token)])
    depth = math.sqrt(max(1.0, layers / CALIBRATION_LAYERS))
    tolerance = float(np.abs(row).max()) * (DTYPE_ULPS * eps + FLOAT32_ULPS * float(np.finfo(np.float32).eps)) * depth
    return gap, (NEAR_TIE if math.isfinite(gap) and abs(gap) <= tolerance else UNEXPLAINED)
