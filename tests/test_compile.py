"""`--compile` (issue 44 part 3): the static engine (core/batch/static.py) and the compile state
(core/model/compile.py) give eager's tokens for ar, pld and ppd (every method: test_compile_methods.py); the static cache's roll-back, tree compaction and
bucket padding match the single engine's outputs; nothing compiles after warm-up; run.yaml's compile block; refusals.

torch.compile on a 2-core CPU takes seconds to tens of seconds a shape, so the compiling tests share one tiny model
and compile four shapes in all (ar's width 1, pld's width 2, ppd's tree, and the CLI run's width 1)."""

from __future__ import annotations

import types

import pytest
import torch
import yaml
from typer.testing import CliRunner

from specbench.cli import app
from specbench.core.batch import static
from specbench.core.batch.engine import engine
from specbench.core.batch.ragged import Segment
from specbench.core.batch.single import SingleSequence
from specbench.core.model import compile as cc
from specbench.core.model.load import load_model
from specbench.core.verify import Sampling
from specbench.methods import get_method

from .conftest import artifact_options, prompt_ids


@pytest.fixture(scope="module")
def own_tiny():
    """A tiny model of this module's own: a compile state attached to it must not reach other tests' models."""
    target = load_model("random:tiny", dtype="float32", device="cpu")
    yield target
    cc.disable(target.model)


def _method(name, target):
    options = {"pld_draft_tokens": 1} if name == "pld" else artifact_options(name, target)
    if name == "ppd":
        options["tree"] = "size=6"
    return get_method(name)(target, options)


def _tokens(method, target, state, seed, n=32):
    """(eager tokens, tokens under the compile state) for one prompt."""
    cc.disable(target.model)
    eager = method.generate(prompt_ids(seed), n, Sampling(), None).tokens
    cc.attach(target.model, state)
    return eager, method.generate(prompt_ids(seed), n, Sampling(), None).tokens


def test_compiled_tokens_equal_eager_ar_pld_ppd(own_tiny):
    state = cc.enable(own_tiny.model, 200)
    assert state.kv.capacity == 256  # rounded up to a multiple of 128
    methods = {name: _method(name, own_tiny) for name in ("ar", "pld", "ppd")}
    for method in methods.values():
        state.declare(cc.declared_width(method))
    assert state.chain == [1, 2]  # pld drafts one token: widths 1 and 2
    for name, method in methods.items():  # warm-up: the shapes compile as they are met
        eager, compiled = _tokens(method, own_tiny, state, 0)
        assert compiled == eager, name
    state.finish_warm_up()
    shapes = {(s["width"], s["inputs"], s["mask"], s["output"]) for s in state.report()["shapes"]}
    assert {(1, "tokens", "causal", "logits"), (2, "tokens", "causal", "logits")} <= shapes
    tree = [s for s in shapes if s[2] == "tree"]
    assert len(tree) == 1 and tree[0][1:] == ("embeddings", "tree", "hidden")  # ppd's tree, its exact width
    compiled_before = dict(state.shapes)
    for name, method in methods.items():  # frozen: other prompts reuse the shapes, nothing compiles
        eager, compiled = _tokens(method, own_tiny, state, 1)
        assert compiled == eager, name
    assert state.shapes == compiled_before and state.eager_steps == 0
    assert all(s["seconds"] > 0 for s in state.report()["shapes"])
    cc.disable(own_tiny.model)


def _uncompiled_state(model, capacity=256):
    """A compile state whose `compiled` step is the plain function: the bucket padding and masks, without compiling."""
    state = cc.Compiled(model, capacity)
    state.fn = static.step
    return state


def test_static_engine_matches_single_engine(own_tiny):
    """Prefill, a plain segment padded to its bucket, roll-back, a tree segment (padded) and its compaction: the
    static engine's outputs equal the single engine's at every step."""
    model = own_tiny.model
    state = _uncompiled_state(model)
    state.declare(4)
    ours, theirs = static.StaticSequence(model, state), SingleSequence(model)
    prompt = prompt_ids(3)[0].tolist()

    def both(joining, segs, **kw):
        a = ours.forward(joining, segs, **kw)
        b = theirs.forward(joining, segs, **kw)
        for x, y in zip(a[0] + a[1], b[0] + b[1]):
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4)

    both([Segment(0, prompt, keep=1)], [])
    both([], [Segment(0, [5, 6, 7])])  # width 3 runs at bucket 4: one padding row
    assert ours.padding_tokens[0] == 1 and ours.target_tokens[0] == len(prompt) + 4
    for engine_ in (ours, theirs):
        engine_.truncate(0, len(prompt) + 1)
    both([], [Segment(0, [9])])
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)  # root, two children
    past = ours.lengths[0]
    seg = Segment(0, [11, 12, 13], positions=[past, past + 1, past + 1], mask=tree)
    both([], [seg], hidden=True)
    for engine_ in (ours, theirs):
        engine_.keep_offsets(0, past, [0, 2])  # the accepted path: root, second child
    assert ours.lengths == theirs.lengths
    both([], [Segment(0, [14, 15])])


def test_frozen_state_runs_unmet_shapes_eagerly(own_tiny):
    """After warm-up nothing compiles: a width no bucket holds, or a kind of input warm-up never met, runs eagerly
    and is counted."""
    model = own_tiny.model
    state = _uncompiled_state(model)
    assert state.bucket(1, (False, False, False)) == 1
    assert state.bucket(6, (True, True, True)) == 6  # warm-up: a tree's width becomes a bucket
    state.frozen = True
    assert state.bucket(5, (True, True, True)) == 6
    assert state.bucket(7, (True, True, True)) is None
    assert state.bucket(2, (False, False, False)) is None  # beyond the declared chain
    assert state.bucket(1, (True, False, False)) is None  # never met
    assert state.eager_steps == 3


def test_engine_factory_picks_static_engine_under_compile(own_tiny):
    model = own_tiny.model
    assert isinstance(engine(model, "single", 1, torch.device("cpu")), SingleSequence)
    cc.attach(model, _uncompiled_state(model))
    try:
        assert isinstance(engine(model, "single", 1, torch.device("cpu")), static.StaticSequence)
    finally:
        cc.disable(model)


def test_run_compile_writes_compile_block(tmp_path, prompts_file):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "--model", "random:tiny", "--dtype", "float32", "--device", "cpu",
                                      "--method", "ar", "--dataset", str(prompts_file),
                                      "--limit", "2", "--max-new-tokens", "8", "--compile", "--out", str(out)])
    assert result.exit_code == 0, result.output
    meta = yaml.safe_load((out / "run.yaml").read_text())
    block = meta["compile"]["target"]
    assert meta["settings"]["compile"] is True
    assert block["eager_steps"] == 0 and block["buckets"] == [1]
    assert [s["width"] for s in block["shapes"]] == [1] and block["seconds"] > 0


@pytest.mark.parametrize("extra, needle", [(["--warmup", "0"], "--warmup"), (["--device-map", "auto"], "--device-map"),
                                           (["--engine", "openai", "--base-url", "http://127.0.0.1:9"], "--engine")])
def test_compile_refusals(tmp_path, extra, needle):
    result = CliRunner().invoke(app, ["run", "--model", "random:tiny", "--method", "ar", "--compile",
                                      "--out", str(tmp_path / "r"), *extra])
    assert result.exit_code != 0
    assert "--compile" in result.output and needle in result.output
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_embedded_model_compiled_tokens_equal_eager():
    """The issue's bar: --compile gives eager's tokens on the embedded model for ar, pld and ppd (float32)."""
    target = load_model("smollm2-135m", dtype="float32", device="cpu")
    try:
        state = cc.enable(target.model, 512)
        methods = {name: _method(name, target) for name in ("ar", "pld", "ppd")}
        for method in methods.values():
            state.declare(cc.declared_width(method))
        for name, method in methods.items():  # one prompt each: every shape compiles on 30 layers (minutes)
            eager, compiled = _tokens(method, target, state, 0, n=32)
            assert compiled == eager, name
    finally:
        cc.disable(target.model)


def test_profile_compiled_files_its_own_curve(own_tiny):
    """profile --compile: every width a compiled shape, filed apart from the eager curve (placement `compiled`),
    the compile seconds in its meta, a batch size's L(B, w) compiled too; the model is left without a compile
    state."""
    from specbench.core import store
    from specbench.planning.profile_compiled import measure_compiled

    profile = measure_compiled(own_tiny, [1], [16], repeats=2, warmup=1, batch_sizes=[1, 2], batch_widths=[1])
    assert list(profile.curves) == [16] and profile.curves[16]["median_ms"][0] > 0
    assert profile.meta["placement"] == "compiled"
    assert [(s.get("batch", 1), s["width"]) for s in profile.meta["compile"]["shapes"]] == [(1, 1), (2, 1)]
    # batch size 2 on the static batched engine, compiled for real (no forward fell back to eager)
    assert profile.batch_sizes == [1, 2] and profile.batches[2].curves[16]["median_ms"][0] > 0
    assert profile.meta["compile"]["eager_steps"] == 0
    from specbench.core.machine.ideal import stated

    assert stated(profile.meta)[16]["measured_over_ideal"][0] > 0  # the hardware's ideal beside the compiled curve
    assert store.profile_name(profile.model, profile.dtype, profile.meta["placement"]).endswith("@compiled.yaml")
    assert cc.state_of(own_tiny.model) is None


def test_the_first_compile_says_the_wait_from_inductors_cache(tmp_path, monkeypatch, capsys):
    """Before the first shape compiles: minutes from scratch on a CPU; with builds in inductor's cache, seconds for a
    shape compiled here before and minutes for a new one."""
    from torch._inductor.runtime import cache_dir_utils

    monkeypatch.setattr(cache_dir_utils, "cache_dir", lambda: str(tmp_path / "inductor"))
    assert cc.inductor_cache() == (tmp_path / "inductor", 0)
    cc._say_start("target", torch.device("cpu"))
    assert "minutes per shape on a CPU" in " ".join(capsys.readouterr().err.split())
    (tmp_path / "inductor").mkdir()
    for i in range(cc.CACHED_FILES):
        (tmp_path / "inductor" / f"k{i}.so").write_text("")
    cc._say_start("target", torch.device("cpu"))
    said = " ".join(capsys.readouterr().err.split())
    assert "seconds for a shape compiled here before" in said and "minutes for a new one" in said
    assert f"{cc.CACHED_FILES}+ files" in said


def test_a_chains_full_width_is_its_own_bucket():
    """A chain of width w declares the powers of two below w and w itself: pld's 11-token verify runs at 11 rows,
    not padded to 16; a power-of-two width adds nothing new; several chains' buckets join."""
    state = types.SimpleNamespace(chain=[], buckets={}, batch_buckets={})
    declare = cc.Compiled.declare
    declare(state, 11)
    assert state.chain == [1, 2, 4, 8, 11]
    declare(state, 4)
    assert state.chain == [1, 2, 4, 8, 11]
    declare(state, 3)
    assert state.chain == [1, 2, 3, 4, 8, 11]
    declare(state, 1)
    assert state.chain == [1, 2, 3, 4, 8, 11]
