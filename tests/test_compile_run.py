"""A `--compile` run says how much of it ran compiled, checks its own `ar` against eager `ar`, sizes its cache and
buckets from what its methods declare, and refuses a model the static engine would decode wrongly.

The CLI runs use a tiny Mistral-shaped model whose 16-token window is shorter than the prompts, so a static mask
without the window decodes differently (the broken-path test relies on it)."""

from __future__ import annotations

import json
import types

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from specbench.cli import app
from specbench.core.batch import static
from specbench.core.batch.ragged import Segment
from specbench.core.model import compile as cc
from specbench.methods.base import Generation
from specbench.report.verdict import compile_line
from specbench.run import compiled as compile_run

MISTRAL = dict(model_type="mistral", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, vocab_size=260, max_position_embeddings=512,
               sliding_window=16)


@pytest.fixture(scope="module")
def mistral_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("mistral") / "mistral.json"
    path.write_text(json.dumps(MISTRAL))
    return path


def _run(out, model, dataset, methods=("ar", "pld")):
    args = ["run", "--model", f"random:{model}", "--dtype", "float32", "--device", "cpu",
            "--dataset", str(dataset), "--limit", "2", "--max-new-tokens", "8", "--compile", "--out", str(out),
            "--pld-draft-tokens", "1"]
    for m in methods:
        args += ["--method", m]
    return CliRunner().invoke(app, args)


def test_compiled_run_counts_forwards_and_checks_ar_against_eager(tmp_path, mistral_file, prompts_file):
    out = tmp_path / "run"
    result = _run(out, mistral_file, prompts_file)
    assert result.exit_code == 0, result.output
    records = pd.read_csv(out / "records.csv", dtype={"lossless": str}, keep_default_na=False)
    ar = records[records.method == "ar"]
    assert (ar.prompt_tokens > 16).all()  # past the window
    assert set(ar.lossless) == {"match"}  # compiled ar against eager ar of the same prompts
    summary = pd.read_csv(out / "summary.csv")
    for method in ("ar", "pld"):
        row = summary[summary.method == method].iloc[0]
        assert row.compiled_forwards > 0 and row.eager_forwards == 0, method
    assert "Not fully compiled" not in (out / "report.md").read_text()
    assert "Lossless check FAILED" not in (out / "report.md").read_text()


def test_a_defect_every_compiled_method_shares_fails_the_run(tmp_path, mistral_file, prompts_file, monkeypatch):
    """A static mask without the window (the compiled path of every method, ar included): the methods still equal
    the run's own compiled ar, but ar's eager reference catches it."""
    def windowless(kv, positions, write_at, allowed, dtype):  # causal or the tree's visibility, no window
        if allowed is None:  # write_at [S, w] -> [S, w, capacity]
            allowed = torch.arange(kv.capacity)[None, None, :] <= write_at[:, :, None]
        return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)[:, None]

    monkeypatch.setattr(static, "attention_masks", windowless)
    out = tmp_path / "broken"
    result = _run(out, mistral_file, prompts_file)
    assert result.exit_code == 0, result.output
    records = pd.read_csv(out / "records.csv", dtype={"lossless": str}, keep_default_na=False)
    ar = records[records.method == "ar"]
    assert ar.lossless.str.startswith("mismatch").any()
    assert (ar[ar.lossless != "match"].mismatch_explained == "unexplained").all()
    report = (out / "report.md").read_text()
    assert "Lossless check FAILED" in report and "(ar" in report


def test_refused_before_loading_a_model_it_cannot_decode(tmp_path, prompts_file, monkeypatch):
    path = tmp_path / "chunked.json"
    path.write_text(json.dumps(dict(MISTRAL, model_type="llama", sliding_window=None, attention_chunk_size=8,
                                    layer_types=["full_attention", "chunked_attention"])))
    from specbench.run import own_methods

    def never(*args, **kwargs):
        raise AssertionError("weights loaded before the refusal")

    monkeypatch.setattr(own_methods, "load_model", never)
    result = _run(tmp_path / "r", path, prompts_file, methods=("ar",))
    assert result.exit_code != 0
    assert "--compile" in result.output and "chunked_attention" in result.output
    assert "Traceback" not in result.output


def test_tree_widths_declared_are_buckets_once_one_is_met(tiny):
    """Every state of a declared tree is compiled when warm-up meets any one of them (PPD's states have their own
    widths; a warm-up prompt may reach one state only), and the plain chain is compiled even if warm-up met none."""
    state = cc.Compiled(tiny.model, 128)
    state.fn = static.step
    state.declare(2)
    state.declare_tree({6, 11})
    assert state.widest() == 11
    kind = (True, True, True)
    assert state.bucket(6, kind) == 6
    assert state.buckets[kind] == [6, 11]
    static.StaticSequence(tiny.model, state).forward([Segment(0, [1, 2, 3], keep=1)], [])  # the cache's layers
    state.finish_warm_up()
    shapes = set(state.shapes)
    assert {(6, True, True, True), (11, True, True, True), (1, False, False, False), (2, False, False, False)} <= shapes
    assert state.bucket(11, kind) == 11 and state.eager_steps == 0


def test_growth_after_warm_up_recompiles_and_stays_compiled(tiny):
    state = cc.Compiled(tiny.model, 128)
    state.fn = static.step
    engine = static.StaticSequence(tiny.model, state)
    engine.forward([Segment(0, list(range(100)), keep=1)], [])
    state.finish_warm_up()
    engine.forward([Segment(0, list(range(120)), keep=1)], [])
    for token in range(10):  # past 128 entries: the cache grows
        engine.forward([], [Segment(0, [token])])
    assert state.grown == [256] and state.eager_steps == 0 and state.compiled_steps == 10


def test_forwards_counts_what_never_reaches_a_compile_state(tiny):
    state = cc.Compiled(tiny.model, 128)
    gen = Generation(target_forwards=5, draft_forwards=7)
    off = types.SimpleNamespace(static_engine=False)  # PEARL: its own caches
    assert compile_run.forwards([state], compile_run.snapshot([state]), gen, off) == (0, 12)
    on = types.SimpleNamespace()
    before = compile_run.snapshot([state])
    state.compiled_steps += 4
    assert compile_run.forwards([state], before, gen, on) == (4, 7)  # a drafter with no compile state: eager


def test_verdict_names_methods_not_fully_compiled():
    summary = pd.DataFrame([
        {"method": "ar", "dataset": "d", "batch_size": 1, "batching": "-", "compiled_forwards": 40.0,
         "eager_forwards": 0.0},
        {"method": "pearl", "dataset": "d", "batch_size": 1, "batching": "-", "compiled_forwards": 0.0,
         "eager_forwards": 30.0},
        {"method": "hidden-transfer", "dataset": "d", "batch_size": 1, "batching": "-", "compiled_forwards": 10.0,
         "eager_forwards": 5.0}])
    line = compile_line(summary)
    assert "pearl (d: 30 of 30" in line and "hidden-transfer (d: 5 of 15" in line and " ar (d" not in line
    two = pd.concat([summary, summary.assign(dataset="e", eager_forwards=summary.eager_forwards * 2)])
    assert "pearl (d: 30 of 30, e: 60 of 60 decode forwards eager)" in compile_line(two)  # one entry per method
    assert compile_line(summary.assign(eager_forwards=0.0)) is None
    assert compile_line(summary.assign(eager_forwards=float("nan"))) is None  # a run without --compile


def test_a_methods_own_drafter_compiles_with_the_target(tiny):
    """sd's trained drafter artefact, loaded by the method itself when the run names no --drafter, gets a compile
    state of its own (its drafts then run compiled and are counted there); PEARL's drafter, which decodes over its
    own caches, gets none."""
    from specbench.methods import get_method
    from specbench.methods.sd.drafter import layer_drafter

    own = layer_drafter(tiny, [0])
    sd = get_method("sd")(tiny, {"gamma": 2}, own)
    pearl = get_method("pearl")(tiny, {"gamma": 2}, layer_drafter(tiny, [1]))
    runner = types.SimpleNamespace(target=tiny, methods={"sd": sd, "pearl": pearl})
    try:
        states = compile_run.enable_run(types.SimpleNamespace(max_new_tokens=8), runner, [], None)
        assert set(states) == {"target", "sd drafter"} and cc.state_of(own.model) is states["sd drafter"]
        assert states["sd drafter"].chain == [1, 2, 3]  # sd's gamma + 1 = 3: its own bucket, not padded to 4
    finally:
        cc.disable(tiny.model)
        cc.disable(own.model)


def test_enable_run_sizes_the_cache_from_the_widest_declared_forward(tiny):
    """A tree method's every state width is declared on the target, and the cache holds the widest beside the
    longest context (no prompts here: the new tokens and the widest forward)."""
    from specbench.methods import get_method

    from .conftest import artifact_options

    ppd = get_method("ppd")(tiny, dict(artifact_options("ppd", tiny), tree="size=6"))
    widths = cc.declared_tree_widths(ppd)
    assert widths == {int(layout.visible.shape[0]) for layout in ppd.trees[1].layouts.values()} and widths
    pld = get_method("pld")(tiny, {"pld_draft_tokens": 2})  # verifies up to 3 tokens: buckets 1, 2, 3
    runner = types.SimpleNamespace(target=tiny, methods={"ppd": ppd, "pld": pld})
    try:
        states = compile_run.enable_run(types.SimpleNamespace(max_new_tokens=8), runner, [], None)
        target = states["target"]
        assert target.trees == [widths] and target.chain == [1, 2, 3]
        assert target.widest() == max(3, *widths)
        assert compile_run.capacity_for(runner, [], 8, target.widest()) == 8 + target.widest()
    finally:
        cc.disable(tiny.model)


def test_compiled_batches_run_padded_and_fully_compiled(tmp_path, mistral_file, prompts_file):
    """--batch-size 2 under --compile: the static batch engine (padded, said), every decode forward compiled, the
    batch's count on one row of its rows; --batching unpadded is refused with the reason."""
    args = ["run", "--model", f"random:{mistral_file}", "--dtype", "float32", "--device", "cpu", "--dataset",
            str(prompts_file), "--limit", "2", "--max-new-tokens", "8", "--compile", "--pld-draft-tokens", "1",
            "-m", "ar", "-m", "pld", "-b", "2"]
    refused = CliRunner().invoke(app, [*args, "--batching", "unpadded", "--out", str(tmp_path / "no")])
    assert refused.exit_code != 0 and "--batching padded" in refused.output and "Traceback" not in refused.output
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "batches run padded" in " ".join(result.output.split())
    summary = pd.read_csv(out / "summary.csv")
    batched = summary[summary.batch_size == 2]
    assert set(batched.method) == {"ar", "pld"} and set(batched.batching) == {"padded"}
    assert (batched.compiled_forwards > 0).all() and (batched.eager_forwards == 0).all()
    assert "Not fully compiled" not in (out / "report.md").read_text()


@pytest.mark.parametrize("name", ["medusa", "hidden-transfer"])
def test_medusa_and_hidden_transfer_runs_are_fully_compiled(tmp_path, mistral_file, prompts_file, name):
    """A compiled run of Medusa (its heads one compiled call of their own) and of Hidden Transfer (its transfers as
    layer edits inside the target's compiled step): summary.csv counts every decode forward compiled, none eager,
    run.yaml's compile block names the heads' graph and the edited shapes, and the tokens pass the lossless check."""
    import yaml

    from specbench.core.model.load import load_model

    from .conftest import heads_artifact, projections_artifact

    target = load_model(f"random:{mistral_file}", dtype="float32", device="cpu")
    artifact = (heads_artifact if name == "medusa" else projections_artifact)(target, tmp_path / "artifact")
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "--model", f"random:{mistral_file}", "--dtype", "float32", "--device",
                                      "cpu", "--dataset", str(prompts_file), "--limit", "2", "--max-new-tokens", "8",
                                      "--compile", "--out", str(out), "--method", name, "--artifact", str(artifact),
                                      "--tree", "size=4"])
    assert result.exit_code == 0, result.output
    summary = pd.read_csv(out / "summary.csv")
    row = summary[summary.method == name].iloc[0]
    assert row.compiled_forwards > 0 and row.eager_forwards == 0
    report = (out / "report.md").read_text()
    assert "Not fully compiled" not in report and "Lossless check FAILED" not in report
    compiled = yaml.safe_load((out / "run.yaml").read_text())["compile"]
    if name == "medusa":
        assert compiled[f"{name} heads"]["compiled_steps"] > 0 and compiled[f"{name} heads"]["eager_steps"] == 0
    else:
        assert any("layer_edits" in shape for shape in compiled["target"]["shapes"])
