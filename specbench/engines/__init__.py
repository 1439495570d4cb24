"""Production engines side by side with specbench's own loop, so one report compares them: `--engine llama.cpp` (llama-cpp-python in
process) and `--engine openai` (any OpenAI-compatible server). Each writes the same run folder as run/benchmark.py
(run.yaml, records.csv, tokens.jsonl), so the same report, noise guard, merge and CI gates read it."""

from __future__ import annotations

from pathlib import Path

from ..errors import SpecbenchError, did_you_mean

ENGINES = ("specbench", "llama.cpp", "openai")


def run_engine(cfg) -> Path:
    """Run `cfg` (a RunConfig with engine != "specbench") on its engine; returns the run folder."""
    if cfg.engine == "llama.cpp":
        from .llama_cpp import run as run_llama_cpp

        return run_llama_cpp(cfg)
    if cfg.engine == "openai":
        from .openai_server import run as run_openai

        return run_openai(cfg)
    raise SpecbenchError(f"--engine {cfg.engine}: unknown engine{did_you_mean(cfg.engine, ENGINES)}; available: "
                         f"{', '.join(ENGINES)}")
