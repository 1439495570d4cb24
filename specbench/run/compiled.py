"""A run under `--compile` (the compile state itself: core/model/compile.py): refuse what it cannot run (the
settings, then the model's config before its weights load), size the static cache to the run's prompts and widest
declared forward, enable it on the target (and drafter) before warm-up, compile what warm-up left after it, count
each turn's compiled and eager forwards, decode ar's eager reference, and write run.yaml's `compile:` block."""

from __future__ import annotations

import weakref

from ..core.model import compile_call, compile_wait
from ..core.model.compile import (Compiled, attach, declared_tree_widths, declared_varying_width, declared_width,
                                  disable, enable, state_of)
from ..core.model.compile_support import unsupported
from ..data import datasets as ds
from ..methods.base import Generation
from ..errors import SpecbenchError
from ..progress import console, status


def check(cfg) -> None:
    """Refuse what --compile cannot run, before any model loads."""
    if cfg.engine != "specbench":
        raise SpecbenchError(f"--compile compiles specbench's own loop, not --engine {cfg.engine}: leave one out")
    if cfg.tp > 1 or cfg.device_map:
        raise SpecbenchError("--compile runs a model on one device: leave out --tp / --device-map, or --compile")
    if cfg.warmup < 1:
        raise SpecbenchError("--compile compiles every shape in warm-up: use --warmup 1 or more (got "
                             f"{cfg.warmup}), else compile time would land in timed turns")


def check_model(cfg) -> None:
    """Refuse, from the model's config and before its weights load, a model the static engine would decode
    wrongly (core/model/compile_support.unsupported says which)."""
    from ..core import lookup
    from ..core.model.load import model_config

    why = unsupported(model_config(cfg.model))
    if why:
        raise SpecbenchError(f"--compile cannot decode {cfg.model} correctly: {why}. Run it without --compile")
    lookup.compiled_run(True)  # --tree auto: compiled profiles and @compiled trees (planning/autotree.py)


PROFILE_WIDTHS, PROFILE_KV = (1, 2, 4, 8, 16, 32, 64), (128, 512)  # the on-the-spot compiled profile's grid


def ensure_profile(cfg, target) -> None:
    """Before the methods choose their trees: a run whose tree methods take `--tree auto` needs this hardware's
    compiled profile (trees are built from it), with L(B, w) at each of the run's batch sizes > 1 (a tree at B > 1
    is built only from a compiled L(B, w)): ensure_compiled_profile."""
    from ..methods import get_method
    from ..methods.tree.batch_trees import tree_spec

    trees = [m for m in cfg.methods if get_method(m).kind == "tree"]
    if trees and tree_spec(cfg.options).kind == "auto":
        ensure_compiled_profile(cfg, target, f"{', '.join(trees)}'s --tree auto")


def _batched(cfg) -> list[int]:
    """cfg's batch sizes above 1, ascending."""
    return sorted({b for b in getattr(cfg, "batch_sizes", (1,)) if b > 1})


def compiled_profile_gaps(cfg, target=None) -> tuple[bool, list[int]]:
    """(whether this hardware has a usable compiled profile of the target, cfg's batch sizes > 1 it has no L(B, w)
    at: all of them when there is none). Without `target` the profile's key comes from cfg alone (the device and
    dtype the run would load with: `--dtype auto` as a compiled run resolves it), so no weights load to ask."""
    from ..core import lookup
    from ..core.machine.hardware import hardware_slug
    from ..core.model.load import auto_dtype, dtype_name, model_slug
    from ..core.model.naming import resolve_device, resolve_dtype
    from ..core.profile_file import load_profile

    if target is not None:
        device, dtype, spec = target.device, target.dtype, target.spec
    else:
        device, spec = resolve_device(cfg.device), cfg.model
        dtype = auto_dtype(spec, device, compiled=True)[0] if cfg.dtype == "auto" else resolve_dtype(cfg.dtype, device)
    found = lookup.find_profile(hardware_slug(device), model_slug(spec), dtype_name(dtype), compiled=True)
    sizes = _batched(cfg)
    usable = found is not None and lookup.EAGER_FOR_COMPILED not in found.flags
    have = load_profile(found.path).batch_sizes if usable and sizes else [1]
    return usable, [b for b in sizes if b not in have]


def ensure_compiled_profile(cfg, target, purpose: str) -> None:
    """This hardware's compiled profile of the target with L(B, w) at each of cfg's batch sizes > 1; when there is
    none, or it lacks a batch size, it is measured now (profile --compile's protocol, planning/profile_compiled.py:
    every shape compiled first, the wait said) and filed where `specbench profile --compile` files it, so the next
    run finds it. `purpose`: what needs it, for the line that says why it is measured."""
    from ..planning.profile import save
    from ..planning.profile_compiled import measure_compiled

    usable, missing = compiled_profile_gaps(cfg, target)
    if usable and not missing:
        return
    sizes = _batched(cfg)
    widths = [w for w in PROFILE_WIDTHS if w <= max(1, target.context_length // 4)]
    kv = [k for k in PROFILE_KV if k + widths[-1] < target.context_length] or [min(PROFILE_KV)]
    why = f"no compiled profile of {target.name} here" if not usable else \
        f"the compiled profile of {target.name} has no L(B, w) at batch size {', '.join(map(str, missing))}"
    at = f", batch sizes 1, {', '.join(map(str, sizes))}" if sizes else ""
    console.print(f"--compile: {why} for {purpose}: measuring it now (widths {widths}, KV "
                  f"{kv}{at}; filed for later runs)")
    path = save(measure_compiled(target, widths, kv, repeats=5, warmup=1, batch_sizes=(1, *sizes)))
    console.print(f"[dim]--compile: compiled profile filed: {path}[/]")


def capacity_for(runner, loaded, max_new_tokens: int, widest: int = 64) -> int:
    """Entries the static cache holds: the longest rendered prompt of the run (every turn's question, earlier
    answers counted at --max-new-tokens each), clipped to the context as the runner clips it, plus every turn's new
    tokens and room for the widest forward the run declares (`widest`: a tree state's or a chain's width; a verify
    forward writes its whole width before the rejected rows are dropped). Attention reads all of them every forward,
    so it is sized to the run, not the model's context."""
    target = runner.target
    longest, turns = 0, 1
    for dataset in loaded:
        for p in dataset.prompts:
            n = len(p.turns)
            ids = target.tokenizer.render(ds.conversation(p, n - 1, [""] * (n - 1)))
            longest, turns = max(longest, len(ids) + (n - 1) * max_new_tokens), max(turns, n)
    room = max(16, target.context_length - max_new_tokens)
    return min(longest, room + (turns - 1) * max_new_tokens) + max_new_tokens + widest


def enable_run(cfg, runner, loaded, drafter) -> dict[str, Compiled]:
    """--compile: the target's (and the drafter's) static state, with the buckets the methods declare at every
    batch size of the run, the cache sized from the widest of them, and the expected wait said."""
    sizes = sorted(set(getattr(cfg, "batch_sizes", None) or (1,)) | {1})
    batched = [b for b in sizes if b > 1]
    methods = list(runner.methods.values())
    chains = {m.name: declared_width(m) for m in methods}
    trees = {b: {m.name: declared_tree_widths(m, b) for m in methods if b == 1 or getattr(m, "batchable", True)}
             for b in sizes}
    # a chain runs at its bucket (Compiled.declare: its full width at most), a tree drafted afresh at its power-of-two
    # bucket, a tree state at its own width; the drafter's forwards (sd's drafts and catch-up) are chains too
    varying = {m.name: declared_varying_width(m) for m in methods}  # trees drafted afresh each step (suffix)
    widest = max([*chains.values(), *(1 << (v - 1).bit_length() for v in varying.values() if v)]
                 + [w for per in trees.values() for t in per.values() for w in t])
    capacity = capacity_for(runner, loaded, cfg.max_new_tokens, widest)
    states = {"target": enable(runner.target.model, capacity)}
    if drafter is not None and hasattr(drafter.model, "config"):
        states["drafter"] = enable(drafter.model, capacity)
    for m in methods:  # a method's own drafter drafts through its engine too: EAGLE's and ParallelSpec's feature
        # drafter module, sd's trained drafter artefact when the run gives no --drafter (PEARL's never reaches an engine)
        own = getattr(m, "drafter", None)
        module = feature_drafter(m) or (own.model if own is not None and getattr(m, "static_engine", True) and
                                        hasattr(own.model, "config") else None)
        if module is not None and module is not runner.target.model and state_of(module) is None:
            states[f"{m.name} drafter"] = enable(module, capacity)
            _FEATURE_STATES.append(weakref.ref(states[f"{m.name} drafter"]))
            if module is feature_drafter(m):  # its catch-up on a step's verified pairs: up to the tree's depth + 1
                states[f"{m.name} drafter"].declare(catch_up_width(m))
    for chain in chains.values():
        for state in states.values():
            state.declare(chain)
    for width in varying.values():
        if width:
            states["target"].declare_varying_tree(width)
    # trees verify on the target; a tree verified with layer edits (Hidden Transfer's) compiles the states warm-up
    # meets, with its edits, and no plain graph of the others (its capacity still counts them: `widest` above)
    edits = declare_layer_work(methods, states["target"])
    for b, per in trees.items():
        for name, tree in per.items():
            if name not in edits:
                states["target"].declare_tree(tree, b)
    for role, state in states.items():  # what warm-up and finish_warm_up will compile, about
        tree_widths = {b: sorted(set().union(*per.values())) if role == "target" and per else []
                       for b, per in trees.items()}
        state.expected = sum(len(state.chain) + len(tree_widths[b]) + len(state.tree_chain) for b in sizes)
        said = f" (buckets {state.chain}" + (f", tree widths {tree_widths[1]}" if tree_widths[1] else "") + \
            (f"; at batch sizes {batched} too" if batched else "") + ")"
        compile_wait.say_expected(role, state.device, state.expected, said, model=state.model)
    for m in methods:  # a method's small forwards of its own (Medusa's heads), each its own static-shape graph
        for name, (module, function) in compiled_calls(m).items():
            if compile_call.call_of(module) is None:
                role = f"{m.name} {name}"
                states[role] = compile_call.enable(module, function, role, states["target"].device)
                _FEATURE_STATES.append(weakref.ref(states[role]))
                compile_wait.say_expected(role, states[role].device, 1, " (one row)", model=module)
    eager = sorted(m.name for m in methods if not getattr(m, "static_engine", True))
    if eager:
        console.print(f"[yellow]note[/] --compile: {', '.join(eager)} decode(s) over their own caches, not the static "
                      "engine: they run eagerly (their speedups are eager steps against a compiled ar)")
    return states


def declare_layer_work(methods, target: Compiled) -> set[str]:
    """What the methods do inside the target's layers, declared to its compile state before anything compiles (its
    layers then take edits and taps, so that no graph compiled earlier is checked again): every tree state's layer
    edits at batch 1 of a method that edits them (Hidden Transfer's; compiled in warm-up, a state its warm-up prompt
    never reaches too), the layers a method reads the inputs of (EAGLE-3's). Returns the editing methods' names."""
    edits = set()
    for m in methods:
        proposer = getattr(m, "proposer", None)
        if getattr(proposer, "edits_layers", False):
            edits.add(m.name)
            for width, layer_edits in proposer.declared_edits(m.trees[1]):
                target.declare_edits(width, (True, True, True), layer_edits)
        if getattr(proposer, "taps_layers", False):
            target.taps_for(proposer.layers_read())
    return edits


def feature_drafter(method):
    """The drafter module a tree method drafts with through a drafter engine (EAGLE's and ParallelSpec's feature
    drafter: its decode-time proposer's), or None."""
    proposer = getattr(method, "proposer", None)
    if not getattr(proposer, "drafter_model", False):
        return None
    module = getattr(proposer, "drafter", None)
    return module if hasattr(module, "config") else None


def catch_up_width(method) -> int:
    """The most verified pairs a feature drafter feeds in one forward (a step's emitted tokens: the accepted path
    and the bonus token), the depth of the deepest tree the method verifies, at any batch size, plus one; declared
    as a chain to its compile state, so that a step accepting more than its warm-up ever did still runs compiled."""
    depth = 0
    for batch_tree in (getattr(method, "trees", None) or {}).values():
        if batch_tree.dynamic is not None:  # EAGLE-2's tree: (candidates, depth, top-k)
            depth = max(depth, batch_tree.dynamic[1])
        tf = batch_tree.tree_file
        depth = max([depth, *(tf.tree(state).depth for state in tf.states)])
    return depth + 1


def compiled_calls(method) -> dict:
    """name -> (module, function): the small forwards a method's proposer compiles beside the target's step (Medusa's
    heads: core/model/compile_call.py); {} for every other method."""
    proposer = getattr(method, "proposer", None)
    return proposer.compiled_calls() if hasattr(proposer, "compiled_calls") else {}


# the feature drafters' compile states and the methods' compiled calls of the runs in this process (states_of lists
# the live ones)
_FEATURE_STATES: list = []


def _live(state) -> bool:
    model = state.model
    return model is not None and (state_of(model) is state or compile_call.call_of(model) is state)


def finish_run_warm_up(states: dict[str, Compiled]) -> None:
    with status("Compiling the remaining shapes (not timed)"):
        for state in states.values():
            state.finish_warm_up()
    for role, state in states.items():
        r = state.report()
        said = f"buckets {r['buckets']}, cache {r['capacity']} entries; " if "buckets" in r else ""
        console.print(f"[dim]--compile {role}: {len(r['shapes'])} shapes compiled in {r['seconds']:.1f} s "
                      f"({said}not timed)[/]")


def record(meta_path, states: dict[str, Compiled]) -> None:
    """run.yaml's `compile:` block (per model: settings, cache, seconds per shape, eager steps), rewritten in place."""
    import yaml

    meta = yaml.safe_load(meta_path.read_text()) or {}
    meta["compile"] = {role: state.report() for role, state in states.items()}
    meta_path.write_text(yaml.safe_dump(meta, sort_keys=False))


def states_of(*models) -> list[Compiled]:
    """The compile states attached to these loaded models (target first, then the drafter), then the feature
    drafters' and the methods' compiled calls (enable_run); [] without --compile."""
    found = [state_of(m.model) for m in models if m is not None]
    found = [s for s in found if s is not None]
    if not found:
        return []
    features = [ref() for ref in _FEATURE_STATES]
    return found + [s for s in features if s is not None and _live(s)]


def snapshot(states: list[Compiled]) -> list[tuple[int, int]]:
    return [(s.compiled_steps, s.eager_steps) for s in states]


def forwards(states: list[Compiled], before: list[tuple[int, int]], gen, method) -> tuple[int, int]:
    """(compiled, eager) decode forwards of one generation (the prompt's prefill, eager by design, aside): the
    states' counts since `before`, plus what never reaches a compile state, as eager: every target and drafter
    forward of a method off the static engine (PEARL's own caches), and the drafts of a drafter that has no compile
    state (EAGLE's and ParallelSpec's feature drafters)."""
    if not getattr(method, "static_engine", True):
        return 0, gen.target_forwards + gen.draft_forwards
    deltas = [(s.compiled_steps - c, s.eager_steps - e) for s, (c, e) in zip(states, before)]
    compiled, eager = sum(d[0] for d in deltas), sum(d[1] for d in deltas)
    drafter_counted = any(sum(d) > 0 for d in deltas[1:])  # sd's drafter or a feature drafter
    if gen.draft_forwards and not drafter_counted:
        eager += gen.draft_forwards
    return compiled, eager


def batch_forwards(states: list[Compiled], before: list[tuple[int, int]], gens, method) -> None:
    """A batch's (compiled, eager) decode forwards (one forward serves every sample): the batch's counts on its
    first row, 0 on the others, so that summary.csv's sums over rows count each forward once."""
    total = Generation(target_forwards=max((g.target_forwards for g in gens), default=0),  # each sample's share
                       draft_forwards=max((g.draft_forwards for g in gens), default=0))  # of the batch's forwards
    compiled, eager = forwards(states, before, total, method)
    for i, gen in enumerate(gens):
        gen.compiled_forwards, gen.eager_forwards = (compiled, eager) if i == 0 else (0, 0)


def eager_tokens(method, ids, max_new_tokens: int, sampling, models) -> list[int]:
    """The method's tokens for `ids` with every compile state taken off (the single engine, transformers' own
    attention), untimed: the lossless reference of a compiled run, so a defect every compiled method shares cannot
    pass as lossless."""
    held = [(m.model, state_of(m.model)) for m in models if m is not None and state_of(m.model) is not None]
    for model, _ in held:
        disable(model)
    try:
        return method.generate(ids, max_new_tokens, sampling, None).tokens
    finally:
        for model, state in held:
            attach(model, state)
