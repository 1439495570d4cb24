"""The panels kernel (core/model/panel_linear.py, native_linear's C++ `panels`): equal to F.linear at every row count
and at shapes that are not multiples of its 16 columns, in float32 and bfloat16, a row's output the same whatever
rows run beside it, one call per fused group inside a compiled graph, a candidate of the measured choice only where
it can run, and a cached choice measured without it measured again."""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

from specbench.core.model import fused_linears as fl
from specbench.core.model import linear_kernels as lk
from specbench.core.model import native_linear as nl
from specbench.core.model import panel_linear as pl


@pytest.fixture
def built(monkeypatch):
    monkeypatch.delenv(nl.ENV, raising=False)
    if not pl.available(torch.float32):
        pytest.fail(f"the native library did not build here: {nl.status()}")  # inductor's C++ compiler is here


# 2090 columns: 131 panels, enough for tiles of 4 with two threads, the last tile partial; the others tiles of 3
@pytest.mark.parametrize("out_features,in_features,bias", [(96, 64, True), (40, 37, False), (16, 16, True),
                                                           (2090, 24, False)])
def test_panels_equal_f_linear_at_every_row_count(built, out_features, in_features, bias):
    torch.manual_seed(0)
    m = torch.nn.Linear(in_features, out_features, bias=bias)
    packed = pl.pack(m.weight)
    assert packed.shape == (-(-out_features // 16), in_features, 16)
    with torch.inference_mode():
        for rows in (1, 2, 3, 4, 5, 7, 8, 9, 11, 16, 21, 600):  # 600: more than one pass of 64 row blocks
            x = torch.randn(2, rows, in_features)
            got = pl.linear(x, packed, out_features, m.bias)
            assert got.shape == (2, rows, out_features)
            torch.testing.assert_close(got, F.linear(x, m.weight, m.bias), rtol=1e-5, atol=1e-5)


def test_a_rows_output_does_not_depend_on_the_rows_beside_it(built):
    """The sums of a row run in k's order at every width: a verify forward's row equals the one-row forward's."""
    torch.manual_seed(1)
    for n in (200, 2100):  # tiles of 3 panels, of 4
        w = torch.randn(n, 300)
        packed = pl.pack(w)
        x = torch.randn(13, 300)
        wide = pl.linear(x, packed, n, None)
        for r in range(13):
            assert torch.equal(pl.linear(x[r:r + 1], packed, n, None), wide[r:r + 1])
            assert torch.equal(pl.linear(x[:r + 1], packed, n, None), wide[:r + 1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_prefetches_change_no_sum(built, dtype):
    """`ahead` (the first row block's pass prefetching its own weights, the next tile prefetched during a tile's
    later row blocks) gives the bits of the plain kernel at every row count, on tiles of 3 and 4 panels, the last one
    partial; in bfloat16 on AMX tiles too where the CPU has them (K = 64, 320)."""
    torch.manual_seed(2)
    for n, k in ((200, 300), (2090, 24), (2100, 320), (130, 64)):
        w = torch.randn(n, k).to(dtype)
        packed = pl.pack(w)
        for rows in (1, 3, 5, 8, 11, 16, 17):
            x = torch.randn(rows, k).to(dtype)
            plain = pl.linear(x, packed, n, None)
            assert torch.equal(pl.linear(x, packed, n, None, True), plain), (n, k, rows)


@pytest.mark.parametrize("bias", [True, False])
def test_bfloat16_panels_round_float32_sums_once(built, bias):
    """bfloat16 weights stay bfloat16 in their panels (half the bytes), widened exactly: each output is the float32
    sum of the exact products (+ the bias), rounded to bfloat16 once, at every row count, with and without the
    prefetch, on tiles of 3 and 4 panels, an odd K too (its panels' pairs of k padded); a row's output is the same
    whatever rows run beside it. K a multiple of 32 goes through AMX tiles where the CPU has them (row blocks of 16:
    17 rows are two), else through the vector kernel, with the same guarantees."""
    torch.manual_seed(3)
    for n, k in ((96, 64), (2090, 24), (200, 300), (40, 37), (70, 96)):
        m = torch.nn.Linear(k, n, bias=bias).to(torch.bfloat16)
        packed = pl.pack(m.weight)
        assert packed.dtype == torch.bfloat16 and packed.shape == (-(-n // 16), k + k % 2, 16)
        assert torch.equal(packed.view(-1, (k + k % 2) // 2, 16, 2)[0, 0, 1], m.weight[1, :2])  # column 1's k = 0, 1
        for rows in (1, 3, 5, 8, 11, 16, 17):
            x = torch.randn(rows, k).to(torch.bfloat16)
            got = pl.linear(x, packed, n, m.bias)
            exact = F.linear(x.double(), m.weight.double(), None if m.bias is None else m.bias.double())
            assert got.dtype == torch.bfloat16
            # float32 sums of exact products: one bfloat16 rounding (2^-8 relative) and the sums' own (tiny) error
            torch.testing.assert_close(got.double(), exact, rtol=2**-8, atol=1e-3 * exact.abs().max().item())
            assert torch.equal(pl.linear(x, packed, n, m.bias, True), got), (n, k, rows)
            assert torch.equal(pl.linear(x[:1], packed, n, m.bias), got[:1]), (n, k, rows)


def test_bfloat16_dot_pairs_sum_close_to_exact_and_keep_each_row_apart(built):
    """`dot` (panel-dot: AVX512-BF16's vdpbf16ps on each pair of k's, where the build has it; else the same path as
    without it): outputs within one bfloat16 rounding of the exact sums, an odd K's padding never added, a row's
    output the same whatever rows run beside it; a candidate of the measured choice only in bfloat16 and only where
    the path exists."""
    torch.manual_seed(5)
    for n, k in ((96, 64), (2090, 24), (40, 37), (3072, 576)):
        m = torch.nn.Linear(k, n, bias=True).to(torch.bfloat16)
        packed = pl.pack(m.weight)
        for rows in (1, 3, 8, 16, 17):
            x = torch.randn(rows, k).to(torch.bfloat16)
            got = pl.linear(x, packed, n, m.bias, True, True)
            exact = F.linear(x.double(), m.weight.double(), m.bias.double())
            torch.testing.assert_close(got.double(), exact, rtol=2**-8, atol=1e-3 * exact.abs().max().item())
            assert torch.equal(pl.linear(x[:1], packed, n, m.bias, True, True), got[:1]), (n, k, rows)
            assert torch.equal(pl.linear(x[-1:], packed, n, m.bias, False, True), got[-1:]), (n, k, rows)
    assert ("panel-dot" in lk.candidates(torch.bfloat16)) == pl.dot_pairs()
    assert "panel-dot" not in lk.candidates(torch.float32)


def test_wrong_inputs_are_refused_by_the_operator(built):
    packed = pl.pack(torch.randn(32, 8))
    with pytest.raises(RuntimeError, match="x and packed alike"):
        pl.linear(torch.randn(1, 8, dtype=torch.bfloat16), packed, 32, None)
    with pytest.raises(RuntimeError, match="x and packed alike"):
        pl.linear(torch.randn(1, 8, dtype=torch.float16), pl.pack(torch.randn(32, 8)).half(), 32, None)
    with pytest.raises(RuntimeError, match="packed is not"):
        pl.linear(torch.randn(1, 9), packed, 32, None)


def test_compiled_graph_runs_one_panels_call_per_group(built):
    from .test_fused_linears import _Block, profiled_op_counts

    block = _Block()
    try:
        counts = profiled_op_counts(block, {1: "panel", 16: "onednn"}, "panel_test")
        assert counts.get("specbench_native::panels") == 3, counts  # q/k/v, gate/up, down
        assert not counts.get("specbench_native::linear"), counts  # the 1-row bucket runs the panels only
    finally:
        lk._unpack(lk.linears(block))
        fl.unpack(block)
        pl.drop(lk.linears(block))


def test_panels_are_a_candidate_only_where_they_run(built, monkeypatch):
    assert {"panel", "panel-ahead"} <= set(lk.candidates(torch.float32))
    assert {"panel", "panel-ahead"} <= set(lk.candidates(torch.bfloat16))
    assert not {"panel", "panel-ahead"} & set(lk.candidates(torch.float16))
    monkeypatch.setenv(nl.ENV, "0")
    assert not {"panel", "panel-ahead"} & set(lk.candidates(torch.float32))


def test_a_choice_cached_among_other_candidates_is_measured_again(built, tmp_path, monkeypatch):
    """A cache written before the panels existed (no `kernels` list, or another one) is not read: the kernel set
    changed, so the choice is measured again with every candidate. So is one measured with another build of the
    native kernels (their C++ changed: the library's name, which holds its source's hash, differs)."""
    path = tmp_path / "choice.yaml"
    path.write_text("choice: {1: onednn, 2: onednn}\n")
    kernels = lk.candidates(torch.float32)
    native = nl.library_path().name
    assert lk._read(path, kernels, native) is None
    path.write_text(f"choice: {{1: onednn}}\nkernels: {list(kernels)}\nnative: {native}\n")
    assert lk._read(path, kernels, native)["choice"] == {1: "onednn"}
    assert lk._read(path, kernels, "specbench_native-000000000000.so") is None
