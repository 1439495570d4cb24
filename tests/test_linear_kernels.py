"""The compiled forward's CPU linear kernel per width bucket (core/model/linear_kernels.py): every candidate equals
F.linear, the fastest measured one is chosen per bucket and cached, and the compiled graph runs each bucket's kernel."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from specbench.core.model import linear_kernels as lk
from specbench.core.model import panel_linear
from specbench.core.model.compile_graph import graph_model
from specbench.errors import SpecbenchError


def _snapshot(module) -> dict:
    """A module's own attributes, its dicts (parameters, buffers, children, hooks) copied one level deep."""
    return {k: dict(v) if isinstance(v, dict) else v for k, v in module.__dict__.items() if k != "config"}


def _layers(bias: bool):
    torch.manual_seed(0)
    return [torch.nn.Linear(64, 96, bias=bias), torch.nn.Linear(96, 64, bias=bias), torch.nn.Linear(64, 260)]


@pytest.mark.parametrize("bias, dtype, tolerance", [(False, torch.float32, 1e-5), (True, torch.float32, 1e-5),
                                                    (True, torch.bfloat16, 2e-2)])
def test_every_kernel_equals_f_linear_at_every_bucket(bias, dtype, tolerance):
    layers = [m.to(dtype) for m in _layers(bias)]
    kernels = lk.candidates(dtype)
    if "onednn" in kernels:
        lk._pack(layers)
    try:
        with torch.inference_mode():
            for rows in (*lk.BUCKETS, 3, 20):
                for m in layers:
                    x = torch.randn(1, rows, m.in_features).to(dtype)
                    want = F.linear(x.float(), m.weight.float(), None if m.bias is None else m.bias.float())
                    for kernel in kernels:
                        got = lk.apply(kernel, m, x)
                        assert got.shape == want.shape and got.dtype == dtype
                        torch.testing.assert_close(got.float(), want, rtol=tolerance, atol=tolerance,
                                                   msg=f"{kernel} at {rows} rows")
    finally:
        lk._unpack(layers)
        panel_linear.drop(layers)


def test_a_large_model_is_timed_on_a_slice_holding_every_shape():
    layers = [torch.nn.Linear(64, 64, bias=False) for _ in range(10)] + [torch.nn.Linear(64, 260, bias=False)]
    every = lk.timed_set(layers, budget=10**9)
    assert len(every) == 11
    small = lk.timed_set(layers, budget=4 * 64 * (64 * 3 + 260))  # room for the head and three of the ten
    assert len(small) == 4 and any(m.out_features == 260 for m in small)


def test_rows_run_at_the_smallest_bucket_holding_them():
    choice = {1: "onednn", 2: "transposed", 4: "mkl", 64: "onednn"}
    assert [lk.for_rows(choice, r) for r in (1, 2, 3, 4, 5, 64, 200)] == \
        ["onednn", "transposed", "mkl", "mkl", "onednn", "onednn", "onednn"]


def test_fastest_median_is_chosen_per_bucket_and_cached(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    monkeypatch.delenv(lk.ENV, raising=False)
    calls = []

    def measure(layers, kernels, buckets=lk.BUCKETS, rounds=lk.ROUNDS):
        calls.append(kernels)
        slow = {"mkl": 3.0, "transposed": 2.0, "onednn": 1.0, "panel": 4.0, "panel-ahead": 4.0}
        # onednn fastest at 1 row, transposed from 2, mkl from 16; the panels never
        return {b: {k: slow[k] * (1 if b == 1 else {"onednn": 5, "transposed": 1, "mkl": 1 if b < 16 else 0.1,
                                                   "panel": 5, "panel-ahead": 5}[k])
                    for k in kernels} for b in buckets}

    monkeypatch.setattr(lk, "measure", measure)
    monkeypatch.setattr(lk.contention, "disturbed", lambda load: False)  # (the suite's other workers are no neighbour)
    try:
        found = lk.choose(tiny.model, torch.device("cpu"))
        assert found["source"] == "measured now"
        want = {1: "onednn", 2: "transposed", 4: "transposed", 8: "transposed", 16: "mkl", 32: "mkl", 64: "mkl"}
        if "onednn" not in lk.candidates(torch.float32):
            want[1] = "transposed"
        assert found["choice"] == want
        again = lk.choose(tiny.model, torch.device("cpu"))
        assert again["source"].startswith("cached ") and again["choice"] == want and len(calls) == 1
        assert len(list((tmp_path / "linear_kernels").glob("*.yaml"))) == 1
        for file in (tmp_path / "linear_kernels").glob("*.yaml"):
            file.unlink()
        monkeypatch.setattr(lk.contention, "disturbed", lambda load: True)
        busy = lk.choose(tiny.model, torch.device("cpu"))
        assert busy["choice"] == want and "not cached" in busy["source"]
        assert not list((tmp_path / "linear_kernels").glob("*.yaml")) and len(calls) == 2
    finally:
        lk._unpack(lk.linears(tiny.model))


def test_a_forced_kernel_and_a_bad_one(tiny, monkeypatch):
    monkeypatch.setenv(lk.ENV, "transposed")
    found = lk.choose(tiny.model, torch.device("cpu"))
    assert found["source"] == f"${lk.ENV}" and set(found["choice"].values()) == {"transposed"}
    monkeypatch.setenv(lk.ENV, "fast")
    with pytest.raises(SpecbenchError, match=lk.ENV):
        lk.choose(tiny.model, torch.device("cpu"))
    assert lk.choose(tiny.model, torch.device("meta")) == {}  # not a CPU: nothing chosen


def test_compiled_graph_runs_each_buckets_kernel_and_equals_f_linear(monkeypatch):
    """A compiled function over a model's graph twin (compile_graph.graph_model), each bucket its own kernel: the
    outputs equal F.linear's, the oneDNN bucket really calls the packed op, and the model's own layers are untouched."""
    model = torch.nn.Sequential(*_layers(True)[:2])
    own = [_snapshot(m) for m in model]
    choice = {1: "onednn", 2: "transposed", 4: "mkl"}
    monkeypatch.setattr(lk, "choose", lambda m, d: (lk._pack(lk.linears(m)), {"source": "test", "choice": choice})[1])
    chosen = lk.use(model, torch.device("cpu"))
    graph = graph_model(model, chosen["choice"])
    assert chosen["choice"] == choice and graph is not model
    assert [type(m) for m in graph] == [lk.ChosenLinear] * 2 and all(g.linear is m for g, m in zip(graph, model))
    packed_calls = []

    class Counting(list):  # the packed op reads its weight from lk._PACKED at every call
        def __getitem__(self, index):
            packed_calls.append(index)
            return super().__getitem__(index)

    monkeypatch.setattr(lk, "_PACKED", Counting(lk._PACKED))
    monkeypatch.setenv("SPECBENCH_COMPILE_NATIVE", "0")  # the Python op, whose reads are counted (C++: test_native_linear)
    fn = torch.compile(lambda x: graph(x), dynamic=False, fullgraph=True)
    try:
        with torch.inference_mode():
            for rows in (1, 2, 3):
                x = torch.randn(1, rows, 64)
                want = F.linear(F.linear(x, model[0].weight, model[0].bias), model[1].weight, model[1].bias)
                with warnings.catch_warnings():  # torch's compiler stack warns of its own deprecated internals
                    warnings.simplefilter("ignore", DeprecationWarning)
                    warnings.simplefilter("ignore", FutureWarning)
                    got = fn(x)
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
                assert len(packed_calls) == (2 if rows == 1 else 0), f"{rows} rows: packed op calls {packed_calls}"
                packed_calls.clear()
                torch.testing.assert_close(model(x), want, rtol=1e-5, atol=1e-5)  # the model's own forward
    finally:
        lk._unpack(lk.linears(model))
    assert [_snapshot(m) for m in model] == own  # no attribute, no forward of the layers set


def test_enabling_compile_leaves_the_models_modules_as_they_were(monkeypatch):
    """A compile state's setup (core/model/compile.enable: the linear kernel choice, grouped attention) adds no
    attribute and replaces no forward on any module of the model: its state lives in tables and the graph's twin."""
    from specbench.core.model import compile as cc
    from specbench.core.model.load import load_model

    monkeypatch.setenv(lk.ENV, "onednn" if "onednn" in lk.candidates(torch.float32) else "transposed")
    target = load_model("random:tiny", dtype="float32", device="cpu")
    before = {name: (type(m), _snapshot(m)) for name, m in target.model.named_modules()}
    state = cc.enable(target.model, 128)
    try:
        assert state.graph is not target.model and state.settings["linear"]["choice"]
        for name, m in target.model.named_modules():
            assert (type(m), _snapshot(m)) == before[name], name
            assert not [a for a in dir(m) if a.startswith("_specbench")], name
        twin = [m for m in state.graph.modules() if isinstance(m, lk.ChosenLinear)]
        assert len(twin) == len(lk.linears(target.model)) and {id(m.linear) for m in twin} == \
            {id(m) for m in lk.linears(target.model)}
    finally:
        cc.disable(target.model)


FRESH_PROCESS = """
import torch, torch.nn.functional as F
from specbench.core.model import linear_kernels as lk, native_linear
layer = torch.nn.Linear(64, 96).to(torch.bfloat16)
lk._pack([layer])                 # packed while the library is not loaded yet
assert native_linear.ready()      # then loaded by someone else (choose()'s cache key, at bfloat16)
x = torch.randn(1, 3, 64).to(torch.bfloat16)
got = lk.apply("onednn", layer, x)
torch.testing.assert_close(got.float(), F.linear(x.float(), layer.weight.float(), layer.bias.float()),
                           rtol=2e-2, atol=2e-2)
print("ok")
"""


def test_a_copy_packed_before_the_library_loads_is_in_its_table():
    """`profile --compile --dtype bfloat16` packed its weights, then loaded the native library (no panels check
    loads it at bfloat16), and the op found an empty table (IndexError from C++). In a fresh process: pack, load,
    call."""
    import subprocess
    import sys

    from specbench.core.model import native_linear

    if not native_linear.ready():
        pytest.skip(f"no native library here: {native_linear.status()}")
    done = subprocess.run([sys.executable, "-c", FRESH_PROCESS], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
