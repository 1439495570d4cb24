"""The option checks of `specbench run`, before any model loads: refuse what cannot run (naming the option),
note what does nothing."""

from __future__ import annotations

import math

from ..methods.tree.batch_trees import tree_spec
from ..data.trainsets import refuse_as_benchmark
from ..errors import SpecbenchError
from ..methods import REGISTRY, all_options, get_method
from ..progress import console
from .batch_schedule import modes_for
from .config import RunConfig


def validate(cfg: RunConfig) -> RunConfig:
    """Cheap checks before any model loads; returns the config with `ar` first in the method list."""
    if cfg.max_new_tokens < 1:
        raise SpecbenchError(f"--max-new-tokens must be at least 1 (got {cfg.max_new_tokens})")
    if cfg.limit is not None and cfg.limit < 1:
        raise SpecbenchError(f"--limit must be at least 1 (got {cfg.limit})")
    if cfg.repeats < 1:
        raise SpecbenchError(f"--repeats must be at least 1 (got {cfg.repeats})")
    if cfg.retime < 0:
        raise SpecbenchError(f"--retime must be 0 or more (got {cfg.retime}): how many times a disturbed prompt turn "
                             "is re-timed; 0 only flags it")
    if cfg.warmup < 0:
        raise SpecbenchError(f"--warmup must be 0 or more (got {cfg.warmup})")
    timed = [m for m in cfg.methods if m.startswith("pearl")]
    if cfg.tp > 1 and timed:
        raise SpecbenchError(f"--tp: {', '.join(timed)} cannot run tensor-parallel: PEARL's draft/verify schedule "
                             "follows each process's own clock, so the ranks' collective forwards diverge (gloo: "
                             "'Is there a distributed collective mismatch'); run it with a device map instead")
    for flag, value, ok, need in (("--temperature", cfg.temperature, cfg.temperature >= 0, "a number >= 0"),
                                  ("--top-p", cfg.top_p, 0 < cfg.top_p <= 1, "a number in (0, 1]"),
                                  ("--top-k", cfg.top_k, cfg.top_k >= 0, "0 (off) or more")):
        if not (ok and math.isfinite(value)):  # nan fails every comparison; inf passes >= 0
            raise SpecbenchError(f"{flag} must be {need} (got {value})")
    if cfg.threads is not None and cfg.threads < 1:
        raise SpecbenchError(f"--threads must be at least 1 (got {cfg.threads}); leave it out for torch's choice")
    for name in cfg.methods:
        get_method(name)
    if cfg.synthetic_acceptance is not None:  # malformed rates or profile file: refused before any model loads
        from .synthetic import check_methods, profile_of

        check_methods(profile_of(cfg), cfg.methods)  # a folder: a file for each method
    for name in cfg.datasets:
        refuse_as_benchmark(name)
    tree_spec(cfg.options)  # a malformed --tree is refused before any model loads
    if any(n < 0 for n in cfg.tree_sizes):  # 0: `auto` (the method's own --tree auto choice, labelled @auto)
        raise SpecbenchError("--tree-sizes: sizes must be positive integers or auto")
    validate_batching(cfg)
    if cfg.shard and max(cfg.batch_sizes) > 1:
        raise SpecbenchError(f"--shard {cfg.shard}: sharded runs decode one prompt at a time (a batch's prompts "
                             "must share a device); run --batch-size > 1 unsharded")
    methods = ("ar",) + tuple(dict.fromkeys(m for m in cfg.methods if m != "ar"))
    cfg = RunConfig(**{**cfg.__dict__, "methods": methods, "batching": compiled_batching(cfg)})
    declared = all_options(REGISTRY)
    unknown = sorted(set(cfg.options) - set(declared))
    if unknown:
        raise SpecbenchError(f"unknown method option(s) {', '.join(unknown)}; see `specbench list methods`")
    cfg.method_options()  # each method checks its own values (ranges, choices) before any model loads
    for name, value in cfg.options.items():
        spec, takers = declared[name]
        if value is None or value == spec.default:
            continue
        if not set(takers) & set(methods):
            console.print(f"[yellow]note[/] {spec.flag} is an option of {', '.join(takers)}, and none of them "
                          "runs: it is ignored")
        elif spec.name == "gamma" and (others := [m for m in methods
                                                  if m not in takers and get_method(m).kind == "tree"]):
            # a draft length given beside tree methods: say that their trees, not --gamma, set how far they draft
            console.print(f"[yellow]note[/] --gamma applies to {', '.join(m for m in methods if m in takers)}; "
                          f"it is ignored by {', '.join(others)} (a tree method's tree sets how far it drafts)")
    return cfg


def compiled_batching(cfg: RunConfig) -> str:
    """--batching under --compile: batches run the static batch engine (core/batch/static_batch.py: every sample
    padded to one bucket a step, one compiled graph), a padded batch; EMS-SD's unpadded engine runs eagerly only."""
    if not cfg.compile or max(cfg.batch_sizes) <= 1 or cfg.batching == "padded":
        return cfg.batching
    if cfg.batching == "unpadded":
        raise SpecbenchError("--batching unpadded runs eagerly only: under --compile batches pad every sample to one "
                             "static shape a step (--batching padded); leave out --compile to measure EMS-SD's "
                             "unpadded engine")
    console.print("[yellow]note[/] --compile: batches run padded to one static shape a step (--batching padded); "
                  "the unpadded / padded comparison is an eager run's")
    return "padded"


def validate_batching(cfg: RunConfig) -> None:
    """--batch-size, --batching, --refill: refuse what cannot run, note what does nothing."""
    if not cfg.batch_sizes or any(b < 1 for b in cfg.batch_sizes):
        raise SpecbenchError(f"--batch-size: sizes must be at least 1 (got {', '.join(map(str, cfg.batch_sizes))})")
    modes_for(cfg.batching)
    if max(cfg.batch_sizes) > 1:
        unable = [m for m in cfg.methods if not get_method(m).batchable]
        if unable:
            able = ", ".join(n for n, c in REGISTRY.items() if c.batchable)
            why = "; ".join(f"{m}: {get_method(m).unbatchable}" for m in unable)
            raise SpecbenchError(f"{', '.join(unable)} cannot decode batches (--batch-size {max(cfg.batch_sizes)}; "
                                 f"{why}): methods that can: {able}. Run {', '.join(unable)} at --batch-size 1 in a "
                                 "separate run.")
    elif cfg.refill:
        console.print("[yellow]note[/] --refill does nothing at --batch-size 1 (one prompt at a time)")
