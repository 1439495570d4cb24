"""core/attention_kernels.py: cuDNN attention is left out of SDPA's choices on CUDA (its per-shape plans cost every
decoding step there), kept with SPECBENCH_CUDNN_ATTENTION=1, and a CPU run is left alone. The CUDA branch only sets
PyTorch's process-wide switch, so it is checked here on CPU with a CUDA device object."""

import pytest
import torch

from specbench.core.attention_kernels import KEEP_CUDNN, choose_attention_kernels


@pytest.fixture
def cudnn_switch():
    before = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(True)
    yield
    torch.backends.cuda.enable_cudnn_sdp(before)


def test_cuda_leaves_cudnn_attention_out(cudnn_switch, monkeypatch):
    monkeypatch.delenv(KEEP_CUDNN, raising=False)
    assert choose_attention_kernels(torch.device("cuda", 0)) is True
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()


def test_env_keeps_pytorchs_choice(cudnn_switch, monkeypatch):
    monkeypatch.setenv(KEEP_CUDNN, "1")
    assert choose_attention_kernels(torch.device("cuda")) is False
    assert torch.backends.cuda.cudnn_sdp_enabled()


def test_cpu_is_left_alone(cudnn_switch, monkeypatch):
    monkeypatch.delenv(KEEP_CUDNN, raising=False)
    assert choose_attention_kernels(torch.device("cpu")) is False
    assert torch.backends.cuda.cudnn_sdp_enabled()
