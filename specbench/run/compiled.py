"""A run under `--compile` (the compile state itself: core/model/compile.py): refuse what it cannot run,
size the static cache to the run's prompts, enable it on the target (and drafter) before warm-up, compile what warm-up
left after it, and write run.yaml's `compile:` block."""

from __future__ import annotations

from ..core.model.compile import Compiled, declared_width, enable
from ..data import datasets as ds
from ..errors import SpecbenchError
from ..progress import console


def check(cfg) -> None:
    """Refuse what --compile cannot run, before any model loads."""
    if cfg.engine != "specbench":
        raise SpecbenchError(f"--compile compiles specbench's own loop, not --engine {cfg.engine}: leave one out")
    if cfg.tp > 1 or cfg.device_map:
        raise SpecbenchError("--compile runs a model on one device: leave out --tp / --device-map, or --compile")
    if cfg.warmup < 1:
        raise SpecbenchError("--compile compiles every shape in warm-up: use --warmup 1 or more (got "
                             f"{cfg.warmup}), else compile time would land in timed turns")


def capacity_for(runner, loaded, max_new_tokens: int) -> int:
    """Entries the static cache holds: the longest rendered prompt of the run (every turn's question, earlier
    answers counted at --max-new-tokens each), clipped to the context as the runner clips it, plus every turn's new
    tokens and room for one tree's width. Attention reads all of them every forward, so it is sized to the run, not
    the model's context."""
    target = runner.target
    longest, turns = 0, 1
    for dataset in loaded:
        for p in dataset.prompts:
            n = len(p.turns)
            ids = target.tokenizer.render(ds.conversation(p, n - 1, [""] * (n - 1)))
            longest, turns = max(longest, len(ids) + (n - 1) * max_new_tokens), max(turns, n)
    room = max(16, target.context_length - max_new_tokens)
    return min(longest, room + (turns - 1) * max_new_tokens) + max_new_tokens + 64


def enable_run(cfg, runner, loaded, drafter) -> dict[str, Compiled]:
    """--compile: the target's (and the drafter's) static state, with the buckets the methods declare."""
    capacity = capacity_for(runner, loaded, cfg.max_new_tokens)
    states = {"target": enable(runner.target.model, capacity)}
    if drafter is not None and hasattr(drafter.model, "config"):
        states["drafter"] = enable(drafter.model, capacity)
    for method in runner.methods.values():
        for state in states.values():
            state.declare(declared_width(method))
    eager = sorted(m.name for m in runner.methods.values() if not getattr(m, "static_engine", True))
    if eager:
        console.print(f"[yellow]note[/] --compile: {', '.join(eager)} decode(s) over their own caches, not the static "
                      "engine: they run eagerly (their speedups are eager steps against a compiled ar)")
    return states


def finish_run_warm_up(states: dict[str, Compiled]) -> None:
    with console.status("Compiling the remaining shapes (not timed)"):
        for state in states.values():
            state.finish_warm_up()
    for role, state in states.items():
        r = state.report()
        console.print(f"[dim]--compile {role}: {len(r['shapes'])} shapes compiled in {r['seconds']:.1f} s "
                      f"(buckets {r['buckets']}, cache {r['capacity']} entries; not timed)[/]")


def record(meta_path, states: dict[str, Compiled]) -> None:
    """run.yaml's `compile:` block (per model: settings, cache, seconds per shape, eager steps), rewritten in place."""
    import yaml

    meta = yaml.safe_load(meta_path.read_text()) or {}
    meta["compile"] = {role: state.report() for role, state in states.items()}
    meta_path.write_text(yaml.safe_dump(meta, sort_keys=False))
