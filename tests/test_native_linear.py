"""The packed linear's C++ operator (core/model/native_linear.py): built and loaded here, equal to F.linear through
oneDNN at every bucket's row count, called by a compiled graph without the Python op, its table aligned with
linear_kernels._PACKED, and the Python op where it is switched off or cannot be built."""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

from specbench.core.model import fused_linears as fl
from specbench.core.model import linear_kernels as lk
from specbench.core.model import native_linear as nl

pytestmark = pytest.mark.skipif("onednn" not in lk.candidates(torch.float32), reason="no oneDNN packed linear here")


@pytest.fixture
def built(monkeypatch):
    monkeypatch.delenv(nl.ENV, raising=False)
    if not lk.native_ready():
        pytest.fail(f"the C++ op did not build here: {nl.status()}")  # a C++ compiler is on every machine inductor runs


def test_native_op_equals_f_linear_and_keeps_the_tables_aligned(built):
    torch.manual_seed(0)
    layers = [torch.nn.Linear(64, 96, bias=True), torch.nn.Linear(96, 40, bias=False)]
    lk._pack(layers)
    try:
        with torch.inference_mode():
            for rows in (1, 3, 16):
                for m in layers:
                    x = torch.randn(1, rows, m.in_features)
                    got = nl.linear(x, m.bias, lk.pack_index(m), m.out_features)
                    torch.testing.assert_close(got, F.linear(x, m.weight, m.bias), rtol=1e-5, atol=1e-5)
        index = lk.pack_index(layers[1])
    finally:
        lk._unpack(layers)
    again = torch.nn.Linear(96, 40, bias=False)
    lk._pack([again])  # a fresh pack after a freed one: its own index, its own weights
    try:
        assert lk.pack_index(again) != index
        x = torch.randn(1, 2, 96)
        torch.testing.assert_close(nl.linear(x, None, lk.pack_index(again), 40), F.linear(x, again.weight))
    finally:
        lk._unpack([again])


def test_compiled_graph_calls_the_native_op_once_per_group(built):
    from .test_fused_linears import _Block, profiled_op_counts

    block = _Block()
    lk._pack(lk.linears(block))
    try:
        counts = profiled_op_counts(block, {1: "onednn"}, "native_test")
        assert counts.get("specbench_native::linear") == 3  # q/k/v, gate/up, down
        assert not any(k.startswith("specbench::") for k in counts), counts
    finally:
        lk._unpack(lk.linears(block))
        fl.unpack(block)


def test_switched_off_or_unbuildable_runs_the_python_op(monkeypatch):
    monkeypatch.setenv(nl.ENV, "0")
    assert not nl.ready() and nl.status() == f"python (${nl.ENV}=0)"
    monkeypatch.delenv(nl.ENV)
    monkeypatch.setattr(nl, "_STATE", {"loaded": None, "why": ""})
    monkeypatch.setattr(nl, "library_path", lambda: nl.Path("/nonexistent/specbench_native.so"))
    monkeypatch.setattr(nl, "_compiler", lambda: None)
    assert not nl.ready() and "no C++ compiler" in nl.status()


def test_copies_packed_before_the_library_loads_are_kept_in_its_table(built, monkeypatch):
    """choose packs the layers before the C++ op loads: the first native_ready() that finds it loaded puts every
    live copy at its own index (whoever loaded it: test_linear_kernels checks that in a fresh process)."""
    layer = torch.nn.Linear(32, 16, bias=False)
    lk._pack([layer])
    put = []
    monkeypatch.setattr(lk, "_SYNCED", [])  # as if no call had found it loaded yet
    monkeypatch.setattr(nl, "put", lambda index, packed: put.append(index))
    try:
        assert lk.native_ready()
        assert lk.pack_index(layer) in put and all(lk._PACKED[i] is not None for i in put)
    finally:
        lk._unpack([layer])
