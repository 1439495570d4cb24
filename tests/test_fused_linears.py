"""The fused linear groups of a compiled CPU forward (core/model/fused_linears.py): one oneDNN call per decoder layer
for q / k / v and one for gate / up, the members' identical calls merged by the graph pass, the outputs equal to the
model's own, and nothing fused where no bucket runs oneDNN."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from specbench.core.model import fused_linears as fl
from specbench.core.model import linear_kernels as lk
from specbench.core.model import native_linear
from specbench.core.model.compile_graph import graph_model
from specbench.core.model.load import load_model
from specbench.core.verify import Sampling
from specbench.methods import get_method

from .conftest import prompt_ids

pytestmark = pytest.mark.skipif("onednn" not in lk.candidates(torch.float32), reason="no oneDNN packed linear here")


class _Block(torch.nn.Module):
    """A module with both groups, k / v optionally fed another input (a cross-attention's)."""

    def __init__(self, cross: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(64, n, bias=True) for n in (64, 32, 32))
        self.gate_proj, self.up_proj = (torch.nn.Linear(64, 96, bias=False) for _ in range(2))
        self.down_proj = torch.nn.Linear(96, 64, bias=False)
        self.cross = cross

    def forward(self, x):
        other = x.flip(1) if self.cross else x
        q, k, v = self.q_proj(x), self.k_proj(other), self.v_proj(other)
        h = torch.cat([q, k, v], -1)[..., :64]
        return self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


def profiled_op_counts(block: torch.nn.Module, choice: dict[int, str], name: str) -> dict[str, int]:
    """The ops one compiled call of `block`'s graph twin under `choice` makes at one row (profiler counts, after an
    untimed first call that compiles), its output checked against the block's own."""
    from specbench.core.model.compile_graph import compile_function

    graph = graph_model(block, choice)
    fn = compile_function(torch.device("cpu"), lambda g, x: g(x), name)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        x = torch.randn(1, 1, 64)
        fn(graph, x)
        with torch.profiler.profile() as prof:
            got = fn(graph, x)
        torch.testing.assert_close(got, block(x), rtol=1e-5, atol=1e-5)
    return {e.key: e.count for e in prof.key_averages()}


def _counting(monkeypatch):
    """Every packed call of the Python op reads its weight from lk._PACKED: the indices read, per call (the C++ op,
    native_linear.py, is switched off here; test_native_linear.py counts its calls with the profiler)."""
    monkeypatch.setenv(native_linear.ENV, "0")
    calls = []

    class Counting(list):
        def __getitem__(self, index):
            calls.append(index)
            return super().__getitem__(index)

    monkeypatch.setattr(lk, "_PACKED", Counting(lk._PACKED))
    return calls


def _compiled(graph, device=torch.device("cpu")):
    from specbench.core.model.compile_graph import compile_function

    return compile_function(device, lambda g, x: g(x), "fused_test")


@pytest.mark.parametrize("cross", [False, True])
def test_one_call_per_group_and_outputs_equal_the_models(cross, monkeypatch):
    block = _Block(cross)
    choice = {1: "onednn", 2: "mkl"}
    lk._pack(lk.linears(block))
    graph = graph_model(block, choice)
    assert isinstance(graph.q_proj, fl.GroupedLinear) and isinstance(graph.up_proj, fl.GroupedLinear)
    assert type(graph.down_proj) is lk.ChosenLinear and graph.q_proj.linear is block.q_proj
    calls = _counting(monkeypatch)  # (before tracing: the op is chosen at trace time)
    fn = _compiled(graph)
    try:
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)
            for rows in (1, 2):
                x = torch.randn(1, rows, 64)
                fn(graph, x)  # compiles
                calls.clear()
                got = fn(graph, x)
                torch.testing.assert_close(got, block(x), rtol=1e-5, atol=1e-5)
                # oneDNN at 1 row: q/k/v one call (two: q's and k/v's where k and v read another input), gate/up one,
                # down its own; MKL at 2 rows: no packed call at all
                want = (4 if cross else 3) if rows == 1 else 0
                assert len(calls) == want, f"{rows} rows: {calls}"
    finally:
        lk._unpack(lk.linears(block))
        fl.unpack(block)


def test_nothing_fused_without_a_onednn_bucket():
    block = _Block()
    graph = graph_model(block, {1: "mkl", 2: "transposed"})
    assert type(graph.q_proj) is lk.ChosenLinear and type(graph.gate_proj) is lk.ChosenLinear
    assert not fl.worth_fusing(block, None)


def test_compiled_tokens_equal_eager_with_fused_groups(monkeypatch):
    """A 2-layer random Llama under --compile with oneDNN forced: ar's and ppd's tokens equal eager ones, and each
    compiled decode forward makes one packed call per group (2 per layer), plus o / down / the head."""
    from specbench.core.model import compile as cc

    from .conftest import artifact_options

    monkeypatch.setenv(lk.ENV, "onednn")
    monkeypatch.setenv(native_linear.ENV, "0")  # the Python op: its calls are counted
    target = load_model("random:tiny", dtype="float32", device="cpu")
    layers = len(target.model.model.layers)
    methods = {"ar": get_method("ar")(target, {}),
               "ppd": get_method("ppd")(target, {**artifact_options("ppd", target), "tree": "size=4"})}
    eager = {n: m.generate(prompt_ids(0), 12, Sampling(), None).tokens for n, m in methods.items()}
    state = cc.enable(target.model, 128)
    try:
        assert sum(isinstance(m, fl.GroupedLinear) for m in state.graph.modules()) == 5 * layers
        for name, method in methods.items():
            assert method.generate(prompt_ids(0), 12, Sampling(), None).tokens == eager[name], name
        state.finish_warm_up()
        calls = _counting(monkeypatch)
        compiled = methods["ar"].generate(prompt_ids(1), 4, Sampling(), None).tokens
        assert state.eager_steps == 0 and calls
        cc.disable(target.model)
        assert compiled == methods["ar"].generate(prompt_ids(1), 4, Sampling(), None).tokens
        per_forward = 4 * layers + 1  # q/k/v, o, gate/up, down per layer; the LM head
        assert len(calls) % per_forward == 0, calls
    finally:
        cc.disable(target.model)
        fl.unpack(target.model)
