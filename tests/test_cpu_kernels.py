"""The eager CPU linear layers on packed oneDNN weights (core/model/cpu_kernels.py): float32, and bfloat16 where the
CPU runs it natively; each equals F.linear, training calls fall back to it, and SPECBENCH_CPU_LINEAR=mkl packs
nothing."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specbench.core.model import cpu_kernels


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_packed_layers_equal_f_linear(dtype, tolerance, monkeypatch):
    monkeypatch.delenv(cpu_kernels.ENV, raising=False)
    if not cpu_kernels.available() or not cpu_kernels.packable(dtype):
        pytest.skip(f"oneDNN does not run {dtype} natively here")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 40, bias=False)).to(dtype)
    assert cpu_kernels.prepack(model) == 2 and cpu_kernels.packed_copy(model[0]) is not None
    with torch.inference_mode():
        for rows in (1, 2, 7):
            x = torch.randn(1, rows, 64).to(dtype)
            want = F.linear(F.linear(x.float(), model[0].weight.float(), model[0].bias.float()),
                            model[1].weight.float())
            got = model(x)
            assert got.dtype == dtype
            torch.testing.assert_close(got.float(), want, rtol=tolerance, atol=tolerance)
    model[0].weight.requires_grad_(True)  # a training call: F.linear, with a gradient
    model(torch.randn(2, 64).to(dtype)).sum().backward()
    assert model[0].weight.grad is not None


def test_mkl_packs_nothing_and_float16_is_never_packed(monkeypatch):
    monkeypatch.setenv(cpu_kernels.ENV, "mkl")
    assert cpu_kernels.prepack(torch.nn.Linear(8, 8)) == 0
    assert not cpu_kernels.packable(torch.float16)
