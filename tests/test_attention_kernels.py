"""core/model/attention_kernels.py: cuDNN attention is left out of SDPA's choices on CUDA (its per-shape plans cost every
decoding step there), kept with SPECBENCH_CUDNN_ATTENTION=1, and a CPU run is left alone. The CUDA branch only sets
PyTorch's process-wide switch, so it is checked here on CPU with a CUDA device object."""

import pytest
import torch

from specbench.core.model.attention_kernels import KEEP_CUDNN, choose_attention_kernels


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


def test_records_say_which_attention_kernels_ran(cudnn_switch, tmp_path):
    """A CUDA run's environment says whether cuDNN attention was left out, and `--resume` refuses a run folder
    measured with the other choice (its numbers would mix two kernels)."""
    import yaml

    from specbench.core.model.attention_kernels import attention_in_use
    from specbench.errors import SpecbenchError
    from specbench.run.resume import refuse_other_environment

    assert attention_in_use(torch.device("cpu")) is None
    assert attention_in_use(torch.device("cuda")) == "sdpa, cuDNN allowed"
    choose_attention_kernels(torch.device("cuda"))
    assert attention_in_use(torch.device("cuda")) == "sdpa, cuDNN left out"
    env = {"device": "NVIDIA H200", "device_type": "cuda", "hardware": "nvidia-h200", "dtype": "bfloat16",
           "attention": "sdpa, cuDNN allowed", "torch": "2.11.0", "transformers": "5.17.0", "threads": 16, "git": "x"}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({"environment": env}))
    refuse_other_environment(tmp_path, env)  # the same: accepted
    with pytest.raises(SpecbenchError, match="another environment: attention"):
        refuse_other_environment(tmp_path, {**env, "attention": "sdpa, cuDNN left out"})
