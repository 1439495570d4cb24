"""Batch sizes under `--compile`: `profile --compile --batch-size` measures L(B, w) on the static batched engine
(every shape compiled before the first timed forward, each KV length over a cache sized to it) and files it in the
compiled profile; a compiled run at batch size B chooses from that curve, else from the eager one with a note that
names the command, and never files a compiled tree built from an eager curve.

The compiled step is patched to the static step run eagerly here (the same engine and shapes, seconds instead of
minutes on 2 cores); tests/test_compile.py profiles a batch size through torch.compile for real."""

from __future__ import annotations

import re

import pytest
import torch
import yaml
from typer.testing import CliRunner

from specbench.cli import app
from specbench.core import lookup
from specbench.core.batch import static
from specbench.core.model import compile as cc
from specbench.core.profile_file import BatchCurve, LatencyProfile, load_profile
from specbench.methods import get_method
from specbench.methods.sd.drafter import layer_drafter
from specbench.planning.batch_choice import batch_view, is_compiled
from specbench.planning.batch_profile_compiled import compiled_profile_workload
from specbench.planning.profile import save
from specbench.planning.profile_compiled import measure_compiled
from specbench.report.runinfo import data_file_lines

from .test_auto_tree import write_acceptance
from .test_batch_choice import FLAT, HW, WIDTHS, make, plan, steep


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cc, "compile_step", lambda device, name: static.step)
    lookup.start()
    yield tmp_path
    lookup.start()


def test_compiled_profile_has_the_batch_axis_on_the_static_batched_engine(here, tiny, capsys):
    profile = measure_compiled(tiny, [1, 2, 4], [16, 200], repeats=2, warmup=1, batch_sizes=[1, 2])
    assert profile.batch_sizes == [1, 2] and profile.batches[2].widths == [1, 2]  # default: B x w <= widest
    assert sorted(profile.batches[2].curves) == [16, 200]
    assert all(ms > 0 for c in profile.batches[2].curves.values() for ms in c["median_ms"])
    meta = profile.meta
    assert meta["placement"] == "compiled" and "static batch" in meta["batch_engine"]
    capacities = meta["compile"]["capacity_per_kv"]
    assert capacities[16] < capacities[200]  # the KV axis real at B = 2 too: each length over a cache sized to it
    batched = {(s["width"], s["capacity"]) for s in meta["compile"]["shapes"] if s.get("batch") == 2}
    assert batched == {(w, cap) for w in (1, 2) for cap in capacities.values()}  # every [2, w] compiled per cache
    assert meta["compile"]["eager_steps"] == 0 and cc.state_of(tiny.model) is None
    said = " ".join(capsys.readouterr().err.split())
    assert "about 10 shape(s) to compile (3 widths at batch 1, 2 at batch size 2; x 2 cache sizes" in said  # the wait first
    # the compile lines (every shape) all come before the first timed round's progress
    assert said.rindex("[10/10]") < said.index("profiling (compiled)")
    path = save(profile)
    assert path.name == "tiny-float32@compiled.yaml"
    back = load_profile(path)
    assert back.batch_sizes == [1, 2] and is_compiled(back.at_batch(2))
    assert "compiled" in lookup.describe(lookup.PROFILE, path).flags


def test_the_compiled_workload_counts_every_cache_and_names_batch_sizes():
    one = compiled_profile_workload([1, 2, 4], [128, 512], 7, [1])
    more = compiled_profile_workload([1, 2, 4], [128, 512], 7, [1, 2, 4])
    assert one.batch == 1 and more.batch == 4
    assert more.tokens * more.batch == one.tokens * 7  # batch sizes 1 + 2 + 4 slots of every cache, held at once
    assert "1, 2, 4" in more.what


def test_profile_compile_refuses_a_batch_size_that_does_not_fit_with_the_largest_that_does(here, monkeypatch):
    import specbench.core.model.fit as fit
    from specbench.core.model.memory_need import need, stated_workload
    from specbench.core.model.load import model_config

    config = model_config("random:tiny")

    def bytes_at(sizes):
        with stated_workload(compiled_profile_workload([1, 2], [64], 2, sizes)):
            return need("random:tiny", config, torch.float32, torch.device("cpu")).total

    monkeypatch.setattr(fit, "free_memory_bytes", lambda device: (bytes_at([1, 4]) + bytes_at([1, 8])) // 2)
    result = CliRunner().invoke(app, ["profile", "--model", "random:tiny", "--dtype", "float32", "--compile",
                                      "--widths", "1,2", "--kv-length", "64", "--repeats", "2",
                                      "--batch-size", "1,64"])
    text = " ".join(result.output.split())
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "batch sizes 1, 64" in text
    largest = re.search(r"--batch-size (\d+) \(the KV cache", text)  # the largest that fits, said
    assert largest and 4 <= int(largest.group(1)) < 8
    assert not (here / "profiles").exists()


def _profiles(root, compiled_sizes=(4,), eager_sizes=(2, 4)):
    """An eager profile whose L(B, w) is flat (wide drafts pay) and a compiled one whose L(B, w) is steep."""
    flat = {512: {"median_ms": FLAT, "p10_ms": FLAT, "p90_ms": FLAT}}
    folder = root / "profiles" / HW
    folder.mkdir(parents=True, exist_ok=True)
    eager = LatencyProfile("tiny", "float32", HW, "measured", WIDTHS, flat, {},
                           {b: BatchCurve(WIDTHS, flat) for b in eager_sizes})
    (folder / "tiny-float32.yaml").write_text(eager.to_yaml())
    curves = {b: BatchCurve(WIDTHS, {512: {k: steep(b) for k in ("median_ms", "p10_ms", "p90_ms")}})
              for b in compiled_sizes}
    compiled = LatencyProfile("tiny", "float32", HW, "measured", WIDTHS, flat, {"placement": "compiled"}, curves)
    (folder / "tiny-float32@compiled.yaml").write_text(compiled.to_yaml())


def _used_for(path_end: str) -> list[str]:
    return [u for e in lookup.record()["used"] if e["path"].endswith(path_end) for u in e["used_for"]]


def test_a_compiled_batched_run_chooses_from_the_compiled_curve(here, tiny):
    _profiles(here)
    lookup.compiled_run(True)
    view, why = batch_view(tiny, 4)
    assert why == "" and is_compiled(view) and view.latency_ms(8, 512) == steep(4)[3]  # not the eager (flat) one
    sd = get_method("sd")(tiny, {}, layer_drafter(tiny, [0]))
    said = plan(sd, [2, 4])  # --gamma auto per batch size
    assert "batch size 4's choices (compiled L(B, w))" in _used_for("tiny-float32@compiled.yaml")
    # no compiled L(2, w): the eager one stands in, said with the exact command, and recorded as standing in
    assert "--compile: batch size 2's choices read the eager L(B=2, w)" in said
    assert "`specbench profile --model random:tiny --dtype float32 --compile --batch-size 1,2` measures it" in said
    eager = [e for e in lookup.record()["used"] if e["path"].endswith("tiny-float32.yaml")]
    assert eager and lookup.EAGER_FOR_COMPILED in eager[0]["flags"]
    assert any("batch size 2's choices" in u for u in eager[0]["used_for"])
    assert not any("batch size 4" in u for u in eager[0]["used_for"])
    lines = data_file_lines(lookup.record())  # report.md's settings: the profile each batch size's choices read
    assert any("@compiled.yaml" in line and "batch size 4's choices (compiled L(B, w))" in line for line in lines)
    assert any("tiny-float32.yaml" in line and lookup.EAGER_FOR_COMPILED in line and "batch size 2's choices" in line
               for line in lines)
    lookup.compiled_run(False)  # an eager run reads the eager L(4, w)
    view, _ = batch_view(tiny, 4)
    assert not is_compiled(view) and view.latency_ms(8, 512) == FLAT[3]


def test_without_any_L_B_w_the_compiled_run_keeps_batch_ones_choice_and_names_the_command(here, tiny):
    _profiles(here, compiled_sizes=(), eager_sizes=())
    lookup.compiled_run(True)
    view, why = batch_view(tiny, 2)
    assert view is None and "has no compiled L(B=2, w)" in why
    assert "`specbench profile --model random:tiny --dtype float32 --compile --batch-size 1,2` measures it" in why


def test_a_compiled_tree_at_a_batch_size_is_built_from_the_compiled_curve_only(here, tiny):
    _profiles(here, compiled_sizes=(4,), eager_sizes=(2, 4))
    write_acceptance(here, "ppd")
    lookup.compiled_run(True)
    method, _ = make("ppd", tiny)
    said = plan(method, [2, 4])
    trees = here / "trees" / "tiny"
    b4 = trees / f"{HW}-float32-b4@compiled.yaml"
    assert b4.is_file() and "built it now from L(B=4, w)" in said
    assert yaml.safe_load(b4.read_text())["latency_profile"]["compiled"] is True
    assert method.trees[4].tree_file.size < method.trees[1].tree_file.size  # the steep compiled L(4, w)
    # batch size 2 has only an eager L(B, w): batch 1's tree, no compiled tree filed from the eager curve
    assert method.trees[2] is method.trees[1] and not list(trees.glob("*-b2*"))
    assert "batch size 2 decodes with batch 1's tree" in said and "--compile --batch-size 1,2" in said
    assert "read the eager" not in said  # the tree did not read it: the eager curve is neither said nor recorded
    assert not any(e["path"].endswith("tiny-float32.yaml") for e in lookup.record()["used"])
