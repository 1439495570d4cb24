"""`--compile` keeps every method lossless (issue 44 §3): greedy tokens under a compile state equal the method's
eager tokens and eager `ar`'s, for every registered method, on a tiny model in float32 on CPU.

As a run does it (run/compiled.enable_run, run/runner.warm_up, run/compiled.finish_run_warm_up): every method is
built first (eagerly: sd's and PEARL's choices time eager forwards), a compile state is attached to the target and to
the drafter, each method declares its width, one warm-up prompt per method compiles the shapes it meets, and
finish_warm_up compiles the rest and freezes. The checked prompt runs after that: nothing compiles any more, and a
forward the state does not compile runs eagerly, counted (`eager_steps`). Each case also says how many forwards of
the checked prompt ran compiled, so a method that silently bypasses the static engine is visible.

Compiling costs seconds a shape on 2 cores, so every method shares one state per model and the shapes are few:
pld drafts 1 token, lookahead verifies a 2-column window and 2 bigrams (widths 2 to 4), sd and PEARL gamma 2
(buckets 1, 2, 4), every tree method a 6-node tree."""

from __future__ import annotations

import pytest

from specbench.core.batch import static
from specbench.core.model import compile as cc
from specbench.core.model import compile_call
from specbench.core.model.load import load_model
from specbench.core.verify import Sampling
from specbench.methods import REGISTRY, get_method
from specbench.methods.sd.drafter import layer_drafter
from specbench.run import compiled as compile_run

from .conftest import artifact_options, prompt_ids

NEW_TOKENS = 24
WARM_SEED, CHECK_SEED = 0, 1

# forwards each method runs outside the compiled step on the checked prompt, per model (target, drafter), and
# whether it runs any compiled: what each method's code path really does under --compile
#  - hidden-transfer: its transfer steps (`around`) run inside the compiled step as layer edits
#    (core/model/compile_graph.py), its prefill's through the model's own layer hooks
#  - pearl*: drafter and target run through their own DynamicCaches (methods/sd/drafting.ModelState), not the batch
#    engine: neither model's forwards ever reach the compile state (nothing compiled, nothing counted)
#  - eagle3: its proposer reads the target's inner layers (`around`: the fused states), inside the compiled step as
#    layer taps (core/batch/static.layer_taps), its prefill's through the model's own layer hooks; its drafter as
#    eagle's
#  - eagle / parallelspec: their feature drafter drafts through a drafter engine with a compile state of its own
#    (run/compiled.feature_drafter, as enable_run attaches it on the proposer's drafter): its forwards compile with
#    the target's
#  - medusa*: their heads (residual blocks and the LM head on the accepted row) run as a compiled call of their own
#    (run/compiled.compiled_calls, core/model/compile_call.py): "<method> heads" below, every call compiled
UNCOMPILED = {"pearl", "pearl-no-post", "pearl-no-pre"}


def _options(name: str, target) -> dict:
    cls = get_method(name)
    options = dict(artifact_options(name, target))
    if name == "pld":
        options["pld_draft_tokens"] = 1
    if name == "lookahead":  # a 2 x 2 window and 2 bigrams: widths 2 to 4
        options.update(lookahead_window=2, lookahead_ngram=2, lookahead_guesses=2)
    if cls.kind == "tree":
        options["tree"] = "size=6"
    if "drafter" in cls.needs:
        options["gamma"] = 2
    return options


class _Counted:
    """The compiled step, counted (calls reaching torch.compile's function: compiled forwards)."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


@pytest.fixture(scope="module")
def runs():
    """Per method: eager tokens, compiled tokens (after warm-up), eager steps and compiled forwards per model of the
    checked prompt, or the exception the compiled run raised; and eager ar's tokens."""
    target = load_model("random:tiny", dtype="float32", device="cpu")
    drafter = layer_drafter(target, [0])
    methods = {name: get_method(name)(target, _options(name, target),
                                      drafter if "drafter" in get_method(name).needs else None)
               for name in sorted(REGISTRY)}
    check = prompt_ids(CHECK_SEED)
    eager = {name: m.generate(check, NEW_TOKENS, Sampling(), None).tokens for name, m in methods.items()}
    states = {"target": cc.enable(target.model, 256), "drafter": cc.enable(drafter.model, 256)}
    for name, method in methods.items():
        feature = compile_run.feature_drafter(method)
        if feature is not None:
            states[f"{name} drafter"] = cc.enable(feature, 256)
    calls = {f"{name} {label}": compile_call.enable(module, function, f"{name} {label}", target.device)
             for name, method in methods.items()
             for label, (module, function) in compile_run.compiled_calls(method).items()}
    # Hidden Transfer's layer edits, every tree state's, and EAGLE-3's layer taps (as enable_run declares them)
    compile_run.declare_layer_work(methods.values(), states["target"])
    try:
        counters = {role: _Counted(state.fn) for role, state in states.items()}
        for role, state in states.items():
            state.fn = counters[role]
        for method in methods.values():
            for state in states.values():
                state.declare(cc.declared_width(method))
            if cc.declared_varying_width(method):  # suffix decoding's trees, drafted afresh each step
                states["target"].declare_varying_tree(cc.declared_varying_width(method))
        for role, call in calls.items():  # the compiled calls (declare nothing: their shape is their input's)
            counters[role] = call.fn = _Counted(call.fn)
            states[role] = call
        failed: dict[str, BaseException] = {}
        for name, method in methods.items():  # warm-up: one prompt each, the shapes compile as they are met
            try:
                method.generate(prompt_ids(WARM_SEED), NEW_TOKENS, Sampling(), None)
            except Exception as e:  # noqa: BLE001 -- reported by the method's own case
                failed[name] = e
        for state in states.values():
            state.finish_warm_up()
        shapes = {role: dict(state.shapes) for role, state in states.items()}
        out = {}
        for name, method in methods.items():
            if name in failed:
                out[name] = failed[name]
                continue
            before = {role: (s.eager_steps, counters[role].calls) for role, s in states.items()}
            ordered = list(states.values())  # as the runner lists them (run/compiled.states_of)
            counted = compile_run.snapshot(ordered)
            try:
                gen = method.generate(check, NEW_TOKENS, Sampling(), None)
            except Exception as e:  # noqa: BLE001
                out[name] = e
                continue
            tokens = gen.tokens
            out[name] = {"tokens": tokens, "forwards": compile_run.forwards(ordered, counted, gen, method),
                         **{f"{role}_eager": s.eager_steps - before[role][0] for role, s in states.items()},
                         **{f"{role}_compiled": counters[role].calls - before[role][1] for role in states}}
        assert {role: dict(s.shapes) for role, s in states.items()} == shapes  # nothing compiled after warm-up
        yield {"eager": eager, "compiled": out, "states": states}
    finally:
        for role, state in states.items():
            (compile_call.disable if role in calls else cc.disable)(state.model)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_compiled_tokens_equal_eager_and_ar(runs, name):
    got = runs["compiled"][name]
    if isinstance(got, BaseException):
        raise got
    assert got["tokens"] == runs["eager"][name], "compiled tokens differ from the method's eager tokens"
    assert got["tokens"] == runs["eager"]["ar"], "compiled tokens differ from eager ar's"
    needs_drafter = "drafter" in get_method(name).needs
    if name in UNCOMPILED:  # never reaches the compile state: nothing compiled, nothing counted
        assert got["target_compiled"] == got["target_eager"] == 0
        assert got["drafter_compiled"] == got["drafter_eager"] == 0
        return
    assert got["target_compiled"] > 0 and got["target_eager"] == 0
    if needs_drafter:  # sd: the drafter's forwards compile too (its prefill aside)
        assert got["drafter_compiled"] > 0 and got["drafter_eager"] == 0
    else:
        assert got["drafter_compiled"] == got["drafter_eager"] == 0
    if f"{name} drafter_compiled" in got:  # eagle / parallelspec: the feature drafter's forwards compile too
        assert got[f"{name} drafter_compiled"] > 0 and got[f"{name} drafter_eager"] == 0
    if get_method(name).family == "medusa":  # the heads: one compiled call a step, none eager
        assert got[f"{name} heads_compiled"] > 0 and got[f"{name} heads_eager"] == 0


# methods with decode forwards that never run compiled: summary.csv's eager_forwards > 0, named by report.md's verdict
NOT_FULLY_COMPILED = UNCOMPILED


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_forwards_counted_as_a_run_reports_them(runs, name):
    """run/compiled.forwards (records' compiled_forwards / eager_forwards): a method off the static engine or a hooked
    target forward counts eager forwards; every other method none (the feature drafters' compiled with the target)."""
    got = runs["compiled"][name]
    if isinstance(got, BaseException):
        raise got
    compiled, eager = got["forwards"]
    if name in UNCOMPILED:
        assert compiled == 0 and eager > 0
    elif name in NOT_FULLY_COMPILED:
        assert eager > 0
    else:
        assert compiled > 0 and eager == 0


def test_hidden_transfer_runs_its_transfer_steps_inside_the_compiled_step(runs):
    """Hidden Transfer's pseudo positions are made inside the target's compiled graph (layer edits at the transfer
    layers: core/model/compile_graph.py), not by hooks around an eager forward: its warm-up compiled shapes with
    edits, and the checked prompt's target forwards ran compiled (test_compiled_tokens_equal_eager_and_ar: none eager,
    tokens equal)."""
    got = runs["compiled"]["hidden-transfer"]
    if isinstance(got, BaseException):
        raise got
    edited = runs["states"]["target"].edit_shapes
    assert edited and all(edits for *_, edits in edited), edited
    assert got["target_compiled"] > 0 and got["target_eager"] == 0


def test_eagle3_reads_its_layer_states_from_the_compiled_step(runs):
    """EAGLE-3's fused features come out of the target's compiled graph (layer taps: the step returns the three layers'
    inputs beside its final states), not from hooks around an eager forward: its warm-up compiled a shape returning
    them, and the checked prompt's target forwards ran compiled (test_compiled_tokens_equal_eager_and_ar: none eager,
    tokens equal)."""
    got = runs["compiled"]["eagle3"]
    if isinstance(got, BaseException):
        raise got
    state = runs["states"]["target"]
    assert state.tap_layers is not None
    assert any(h == static.TAPS for (*_, h) in state.shapes), state.shapes
    assert got["target_compiled"] > 0 and got["target_eager"] == 0
