"""A `--compile` run plans from compiled decoding's curve: its compiled profile taken on the spot when this hardware
has none (every KV length over a cache sized to it), its --tree auto trees built from that profile and filed apart
(@compiled), and `recommend --compile` / `run --method auto --compile` a pick of their own.

The compiled profile here runs the static step uncompiled (compile_step patched: the same engine, seconds instead
of minutes on 2 cores); tests/test_compile.py profiles through torch.compile for real."""

from __future__ import annotations

import types

import pytest
import torch
import yaml

from specbench.core import lookup
from specbench.core.batch import static
from specbench.core.model import compile as cc
from specbench.core.profile_file import load_profile
from specbench.errors import SpecbenchError
from specbench.planning import autotree, tree_choice
from specbench.run import compiled as compile_run
from specbench.run.recommend import read_choice

from .test_auto_tree import HW, write_acceptance, write_profile


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cc, "compile_step", lambda device, name: static.step)
    monkeypatch.setattr(compile_run, "PROFILE_WIDTHS", (1, 2, 4))
    monkeypatch.setattr(compile_run, "PROFILE_KV", (16, 200))
    lookup.start()
    yield tmp_path
    lookup.start()


def _cfg(**kw):
    return types.SimpleNamespace(**{"methods": ("ar", "ppd"), "options": {}, **kw})


def test_compiled_profile_taken_on_the_spot_with_a_real_kv_axis(here, tiny, monkeypatch):
    write_profile(here)  # an eager profile: it must not stand in for the compiled one
    lookup.compiled_run(True)
    compile_run.ensure_profile(_cfg(), tiny)
    path = here / "profiles" / HW / "tiny-float32@compiled.yaml"
    profile = load_profile(path)
    assert sorted(profile.curves) == [16, 200] and profile.widths == [1, 2, 4]
    capacities = profile.meta["compile"]["capacity_per_kv"]
    assert capacities[16] < capacities[200]  # each KV length over a cache sized to it, not one for all
    assert {s["capacity"] for s in profile.meta["compile"]["shapes"]} == set(capacities.values())
    assert cc.state_of(tiny.model) is None

    def never(*args, **kwargs):
        raise AssertionError("measured again")

    monkeypatch.setattr("specbench.planning.profile_compiled.measure_compiled", never)
    compile_run.ensure_profile(_cfg(), tiny)  # found now: nothing measured
    compile_run.ensure_profile(_cfg(methods=("ar", "pld")), tiny)  # no tree method: nothing needed


def test_a_batch_size_the_compiled_profile_lacks_is_measured_on_the_spot(here, tiny, monkeypatch):
    """A compiled run at --batch-size 1,2 whose compiled profile has batch 1 only measures it again with L(2, w);
    then it is found whole."""
    lookup.compiled_run(True)
    compile_run.ensure_profile(_cfg(), tiny)  # batch 1 only
    path = here / "profiles" / HW / "tiny-float32@compiled.yaml"
    assert load_profile(path).batch_sizes == [1]
    lookup.start()
    lookup.compiled_run(True)
    compile_run.ensure_profile(_cfg(batch_sizes=(1, 2)), tiny)
    assert load_profile(path).batch_sizes == [1, 2]
    lookup.start()
    lookup.compiled_run(True)
    monkeypatch.setattr("specbench.planning.profile_compiled.measure_compiled",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("measured again")))
    compile_run.ensure_profile(_cfg(batch_sizes=(1, 2)), tiny)


def test_a_compiled_run_builds_its_trees_from_the_compiled_profile(here, tiny):
    write_profile(here)
    write_acceptance(here, "ppd")
    lookup.compiled_run(True)
    compile_run.ensure_profile(_cfg(), tiny)
    found = autotree.inputs("random:tiny", "ppd", HW, "float32")
    assert found.profile.name == "tiny-float32@compiled.yaml"
    choice = tree_choice.choose("random:tiny", "ppd", HW, "float32", one_state=False, rows=3)
    assert choice.built is not None and choice.built.name.endswith("@compiled.yaml")
    assert yaml.safe_load(choice.built.read_text())["latency_profile"]["compiled"] is True
    again = tree_choice.find("random:tiny", "ppd", HW, "float32")  # the next compiled run finds it
    assert again is not None and again[1].endswith("@compiled.yaml")
    lookup.compiled_run(False)  # an eager run never takes it
    assert autotree.tree_relative("random:tiny", "ppd", HW, "float32").name == f"{HW}-float32.yaml"


def test_method_auto_under_compile_reads_the_compiled_recommendation(here):
    folder = here / "recommendations" / "tiny"
    folder.mkdir(parents=True)
    (folder / f"{HW}@compiled.yaml").write_text(yaml.safe_dump({"method": "pld", "dtype": "float32",
                                                                  "hardware": HW, "measured": 1.2}))
    choice = read_choice("random:tiny", "cpu", None, compiled=True)
    assert choice.methods == ["pld"] and choice.path.endswith("@compiled.yaml")
    with pytest.raises(SpecbenchError, match="recommend --model random:tiny`"):
        read_choice("random:tiny", "cpu", None)  # the eager pick is another file, absent here
    (folder / f"{HW}@compiled.yaml").unlink()
    with pytest.raises(SpecbenchError, match="recommend --model random:tiny --compile"):
        read_choice("random:tiny", "cpu", None, compiled=True)


def test_compiled_profile_gaps_name_the_batch_sizes_a_compiled_map_cannot_predict(here, tiny, monkeypatch):
    """`map --compile` reads the compiled profile filed here: with none, or one without L(B, w) at a grid's batch
    size, it names what it lacks and measures nothing; with --profile fresh given it measures exactly that."""
    from specbench.cli import map as map_cli

    loads = []
    monkeypatch.setattr("specbench.core.model.load.load_model", lambda *a, **k: loads.append(a) or tiny)
    said: list[str] = []
    monkeypatch.setattr(map_cli.console, "print", lambda *a, **k: a and said.append(str(a[0])))
    grid = _cfg(methods=("ar", "pld"), batch_sizes=(1, 2), model="random:tiny", dtype="float32", device="cpu")
    assert compile_run.compiled_profile_gaps(grid, tiny) == (False, [2])
    calls = []
    real = compile_run.ensure_compiled_profile
    monkeypatch.setattr(compile_run, "ensure_compiled_profile", lambda *a: calls.append(a) or real(*a))
    map_cli._compiled_profile(grid, [1, 2], measure=False)
    assert not calls and "no compiled profile here" in said[-1] and "--batch-size 1,2" in said[-1]
    assert not loads  # asking what the profile lacks loads no weights: the key comes from the run's settings
    map_cli._compiled_profile(grid, [1, 2], measure=True)
    assert len(calls) == 1 and len(loads) == 1 and compile_run.compiled_profile_gaps(grid, tiny) == (True, [])
    assert compile_run.compiled_profile_gaps(grid) == (True, [])  # the same profile found from the settings alone
    map_cli._compiled_profile(grid, [1, 2], measure=True)
    assert len(calls) == 1 and len(loads) == 1 and "reads the compiled profile" in said[-1]  # nothing lacking
    wider = _cfg(methods=("ar", "pld"), batch_sizes=(1, 2, 4), model="random:tiny", dtype="float32", device="cpu")
    assert compile_run.compiled_profile_gaps(wider, tiny) == (True, [4])
    map_cli._compiled_profile(wider, [1, 2, 4], measure=False)
    assert "no L(B, w) at B = 4" in said[-1]
    map_cli._compiled_profile(grid, [1, 2], measure=False)
    assert "reads the compiled profile filed here" in said[-1]
