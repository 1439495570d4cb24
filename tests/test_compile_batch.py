"""`--compile` at batch size > 1: the static batch engine (core/batch/static_batch.py) decodes every batchable method
to eager's greedy tokens, every target forward after warm-up through the compiled step (Hidden Transfer's with its
transfer steps inside the step, EAGLE-3's with its layer states read out of it), and samples the target's
distribution at T > 0 under torch.compile.

The token checks run the static step uncompiled (state.fn = static.step: the same masks, padding, buckets and
counting, seconds instead of minutes on 2 cores); the distribution test compiles for real, one tree width."""

from __future__ import annotations

import pytest
import torch

from specbench.core.batch import static
from specbench.core.batch.engine import engine
from specbench.core.batch.static_batch import StaticBatch
from specbench.core.model import compile as cc
from specbench.core.verify import Sampling
from specbench.methods import REGISTRY, get_method
from specbench.methods.batch_loop import generate_batch
from specbench.methods.sd.drafter import layer_drafter
from specbench.run import compiled as compile_run

from .conftest import artifact_options, prompt_ids
from .test_compile_methods import _Counted
from .test_sd import SAMPLING, exact_distribution, tv

BATCHABLE = sorted(n for n, c in REGISTRY.items() if c.batchable)
# every method's hooks inside the target's forward run inside the compiled step: Hidden Transfer's transfer steps as
# layer edits, EAGLE-3's fused layer states as layer taps (core/model/compile_graph.py)
NEW_TOKENS = 12


def _method(name, target, drafter):
    cls = get_method(name)
    options = dict(artifact_options(name, target))
    if name == "pld":
        options["pld_draft_tokens"] = 2
    if cls.kind == "tree":
        options["tree"] = "size=6"
    if "drafter" in cls.needs:
        options["gamma"] = 2
    return cls(target, options, drafter if "drafter" in cls.needs else None)


@pytest.fixture(scope="module")
def pair(tiny):
    return tiny, layer_drafter(tiny, [0])


@pytest.mark.parametrize("name", BATCHABLE)
def test_static_batch_gives_eager_tokens_and_counts_its_forwards(pair, name):
    """B = 2 with a refill (three prompts through two slots): tokens equal eager's unpadded batch and ar's; after
    warm-up every decode forward of both models is a compiled-step call (none eager)."""
    target, drafter = pair
    method = _method(name, target, drafter)
    prompts = [prompt_ids(s) for s in range(3)]
    eager = [g.tokens for g in generate_batch(method, prompts, 2, "unpadded", True, NEW_TOKENS, Sampling(),
                                              [None] * 3)[0]]
    alone = [get_method("ar")(target, {}).generate(p, NEW_TOKENS, Sampling(), None).tokens for p in prompts]
    assert eager == alone
    feature = compile_run.feature_drafter(method)  # EAGLE's / ParallelSpec's drafter module, compiled as a run does
    states = [cc.enable(target.model, 256), cc.enable(drafter.model, 256)]
    if feature is not None:
        states.append(cc.enable(feature, 256))
    try:
        counters = []
        for state in states:
            state.fn = _Counted(static.step)
            counters.append(state.fn)
            state.declare(cc.declared_width(method))
            state.declare_tree(cc.declared_tree_widths(method, 2), 2)
        compile_run.declare_layer_work([method], states[0])
        if feature is not None:  # its catch-up widths (as enable_run declares them)
            states[2].declare(compile_run.catch_up_width(method))
        if cc.declared_varying_width(method):
            states[0].declare_varying_tree(cc.declared_varying_width(method))
        assert isinstance(engine(target.model, "padded", 2, target.device), StaticBatch)
        generate_batch(method, prompts[:2], 2, "padded", False, NEW_TOKENS, Sampling(), [None] * 2)  # warm-up
        for state in states:
            state.finish_warm_up()
        shapes = [dict(s.batch_shapes) for s in states]
        edit_shapes = [dict(s.edit_shapes) for s in states]
        before = compile_run.snapshot(states)
        gens, _ = generate_batch(method, prompts, 2, "padded", True, NEW_TOKENS, Sampling(), [None] * 3)
        compile_run.batch_forwards(states, before, gens, method)
    finally:
        for state in states:
            cc.disable(state.model)
    assert [g.tokens for g in gens] == eager
    assert [dict(s.batch_shapes) for s in states] == shapes  # nothing compiled after warm-up
    assert [dict(s.edit_shapes) for s in states] == edit_shapes
    compiled, eager_forwards = gens[0].compiled_forwards, gens[0].eager_forwards
    assert all(g.compiled_forwards == g.eager_forwards == 0 for g in gens[1:])  # the batch's counts on one row
    assert compiled > 0 and eager_forwards == 0 and states[0].eager_steps == 0
    if "drafter" in get_method(name).needs:
        assert states[1].compiled_steps > 0 and states[1].eager_steps == 0
    if feature is not None:  # the feature drafter's forwards compiled too (its catch-up widths declared)
        assert states[2].compiled_steps > 0 and states[2].eager_steps == 0
    assert all(k[0] == 2 for s in states for k in s.batch_shapes)


STATIC = sorted(n for n, c in REGISTRY.items() if getattr(c, "static_engine", True))  # PEARL: its own caches


@pytest.mark.parametrize("name", STATIC)
def test_static_sequence_compiles_every_drafter_at_batch_1(pair, name):
    """B = 1: the target's, sd's drafter's and the feature drafters' decode forwards after warm-up are all
    compiled-step calls, tokens equal to eager's."""
    target, drafter = pair
    method = _method(name, target, drafter)
    check = prompt_ids(1)
    eager = method.generate(check, NEW_TOKENS, Sampling(), None).tokens
    feature = compile_run.feature_drafter(method)
    states = [cc.enable(target.model, 256), cc.enable(drafter.model, 256)]
    if feature is not None:
        states.append(cc.enable(feature, 256))
    try:
        for state in states:
            state.fn = static.step
            state.declare(cc.declared_width(method))
        states[0].declare_tree(cc.declared_tree_widths(method))
        compile_run.declare_layer_work([method], states[0])
        if cc.declared_varying_width(method):
            states[0].declare_varying_tree(cc.declared_varying_width(method))
        method.generate(prompt_ids(0), NEW_TOKENS, Sampling(), None)  # warm-up
        for state in states:
            state.finish_warm_up()
        before = compile_run.snapshot(states)
        gen = method.generate(check, NEW_TOKENS, Sampling(), None)
        compiled, eager_forwards = compile_run.forwards(states, before, gen, method)
    finally:
        for state in states:
            cc.disable(state.model)
    assert gen.tokens == eager
    assert compiled > 0 and eager_forwards == 0, (compiled, eager_forwards)
    if feature is not None:
        assert states[2].compiled_steps > 0 and states[2].eager_steps == 0


def test_batch_tree_widths_declared_per_batch_size(tiny):
    """A batch size's tree states are its own buckets: meeting one compiles them all at that size, none at B = 1."""
    state = cc.Compiled(tiny.model, 128)
    state.fn = static.step
    state.declare_tree({6, 11}, slots=4)
    kind = (True, True, True)
    assert state.bucket(6, kind, slots=4) == 6
    assert state.batch_buckets[4][kind] == [6, 11] and kind not in state.buckets
    assert state.widest() == 11


def test_compiled_batch_samples_the_targets_distribution(tiny):
    """T > 0 under torch.compile at B = 4: a tree method's (ppd's) two-token samples, four side by side on their
    own random streams, follow the target's exact distribution (total variation distance), every decode forward
    after warm-up compiled."""
    ppd = get_method("ppd")(tiny, {**artifact_options("ppd", tiny), "tree": "size=2"})
    ids = prompt_ids(0)[:, :20]
    state = cc.enable(tiny.model, 128)
    try:
        state.declare(1)
        for b in (1, 4):
            state.declare_tree(cc.declared_tree_widths(ppd, b), b)
        generate_batch(ppd, [ids] * 4, 4, "padded", False, 2, SAMPLING,
                       [torch.Generator().manual_seed(10_000 + i) for i in range(4)])  # warm-up: compiles
        state.finish_warm_up()
        counts: dict[tuple, int] = {}
        for b in range(150):
            gens, _ = generate_batch(ppd, [ids] * 4, 4, "padded", False, 2, SAMPLING,
                                     [torch.Generator().manual_seed(b * 4 + i) for i in range(4)])
            for g in gens:
                counts[tuple(g.tokens)] = counts.get(tuple(g.tokens), 0) + 1
        assert state.eager_steps == 0 and state.compiled_steps > 0
        assert state.batch_shapes and all(k[0] == 4 for k in state.batch_shapes)
    finally:
        cc.disable(tiny.model)
    distance = tv({k: v / 600 for k, v in counts.items()}, exact_distribution(tiny.model, ids, SAMPLING, 2))
    assert distance < 0.1, f"TV {distance:.3f} between compiled batched ppd samples and the target distribution"


def test_compile_history_keeps_real_compiles_only(tiny, tmp_path, monkeypatch):
    """The expected wait's history (core/model/compile_wait.py) records torch.compile's seconds, never a step run
    uncompiled (tests, tools): its ~0 s would promise a wait of nothing."""
    from specbench.core.model import compile_wait

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    state = cc.Compiled(tiny.model, 128)
    state.fn = static.step
    static.StaticSequence(tiny.model, state).forward([static.Segment(0, [1, 2, 3], keep=1)], [])
    state.finish_warm_up()
    assert state.shapes and not (tmp_path / compile_wait.HISTORY).exists()
    compile_wait.remember(torch.device("cpu"), [30.0, 50.0], tiny.model)
    built, read, source = compile_wait.per_shape(torch.device("cpu"), tiny.model)
    assert built == 40.0 and "built: median of 2 shapes" in source and "read: a guess" in source
    compile_wait.remember(torch.device("cpu"), [(2.0, True), (60.0, False)], tiny.model)
    built, read, _ = compile_wait.per_shape(torch.device("cpu"), tiny.model)
    assert (built, read) == (50.0, 2.0)
    # another model's history promises nothing for this one: a tiny model's seconds never stand in for a real one's
    other, _, source = compile_wait.per_shape(torch.device("cpu"), torch.nn.Linear(4, 4))
    assert other == compile_wait.DEFAULT_S[("cpu", "built")] and "guess" in source
    # a quick build's seconds (the C++ wrapper apart from its kernels) are kept apart from the full build's
    monkeypatch.setenv(cc.QUICK_BUILD, "1")
    quick, _, source = compile_wait.per_shape(torch.device("cpu"), tiny.model)
    assert quick == compile_wait.DEFAULT_S[("cpu", "built")] and "guess" in source
    compile_wait.remember(torch.device("cpu"), [20.0], tiny.model)
    assert compile_wait.per_shape(torch.device("cpu"), tiny.model)[0] == 20.0
    monkeypatch.delenv(cc.QUICK_BUILD)
    assert compile_wait.per_shape(torch.device("cpu"), tiny.model)[0] == 50.0


def test_a_shape_with_layer_edits_says_them(capsys):
    """Hidden Transfer compiles one graph per tree state at the same width: each line names its edits, so two lines
    never read alike (stop 62's log had "width 6 (embeddings, tree mask, hidden)" twice)."""
    from specbench.core.model import compile_wait

    compile_wait.said("target", (1, 6, True, True, True), 90.0, 3, 16, edits=((12, 3), (17, 2)))
    compile_wait.said("target", (1, 6, True, True, True), 90.0, 4, 16)
    lines = [line for line in capsys.readouterr().err.splitlines() if "width 6" in line]
    assert "hidden, layer edits 12:3 17:2) compiled in 90.0 s" in lines[0], lines
    assert "(embeddings, tree mask, hidden) compiled in" in lines[1], lines


def test_after_warm_up_the_shapes_left_are_counted_exactly(tiny, capsys):
    """The count said before warm-up is a guess (it cannot know the kinds of input the methods meet: stop 62's
    run said 16 and compiled 22, its lines running on as "[17]", "[18]"). finish_warm_up says how many it compiles,
    and the progress lines' total is done + that from then on."""
    state = cc.Compiled(tiny.model, 128)
    state.fn = static.step
    state.declare(4)  # the chain's buckets: 1, 2, 4
    state.expected = 1  # the guess
    static.StaticSequence(tiny.model, state).forward([static.Segment(0, [1, 2, 3], keep=1)], [])  # warm-up
    done, todo = state.done, state.ahead()
    assert todo and all(t[4] == 1 and t[5] is None for t in todo)  # batch 1, no layer edits
    state.finish_warm_up()
    assert state.done == state.expected == done + len(todo)
    assert state.ahead() == []  # nothing left: a second look lists nothing
    assert f"{len(todo)} more shape(s) to compile after the {done} warm-up compiled" in capsys.readouterr().err


def test_a_long_expected_wait_says_how_to_shorten_it(monkeypatch):
    """Ten minutes or more of shapes built in full on a CPU: the line names the quick build; not on CUDA, not when the
    wait is short, not when the quick build is on already."""
    from specbench.core.model import compile_wait

    cpu = torch.device("cpu")
    assert cc.QUICK_BUILD in compile_wait.quick_hint(cpu, 44 * 50.0)
    assert compile_wait.quick_hint(cpu, 3 * 50.0) == ""
    assert compile_wait.quick_hint(torch.device("cuda"), 44 * 50.0) == ""
    monkeypatch.setenv(cc.QUICK_BUILD, "1")
    assert compile_wait.quick_hint(cpu, 44 * 50.0) == ""
