"""Which PyTorch attention (SDPA) kernels decoding may use on a device.

On CUDA, cuDNN's attention kernel is left out. It builds an execution plan for each new input shape, and decoding
meets a new shape at every step (the KV cache grows by one token; tree methods change the query width too), so the
plan is rebuilt on every forward. On a GPU this made bfloat16 decoding much slower than float32 while the latency
profile's forwards, which repeat one shape, were equal in the two dtypes; without cuDNN attention bfloat16 decoded
as fast as float32 (benchmarks/RESULTS-gpu.md). float32 never uses cuDNN attention, so only 16-bit runs change.
SPECBENCH_CUDNN_ATTENTION=1 keeps PyTorch's own choice (benchmarks/sdpa_backends.py compares the sets).
"""

from __future__ import annotations

import os

import torch

KEEP_CUDNN = "SPECBENCH_CUDNN_ATTENTION"


def choose_attention_kernels(device: torch.device) -> bool:
    """Leave cuDNN attention out of SDPA's choices on a CUDA device (process-wide, as PyTorch's switch is); True when
    it was left out. CPU runs have no cuDNN attention and are left alone."""
    if device.type != "cuda" or os.environ.get(KEEP_CUDNN) == "1":
        return False
    torch.backends.cuda.enable_cudnn_sdp(False)
    return True


def attention_in_use(device: torch.device) -> str | None:
    """What a record says of the attention kernels on a CUDA device (None on a CPU): whether cuDNN's was left out."""
    if device.type != "cuda":
        return None
    return "sdpa, cuDNN allowed" if torch.backends.cuda.cudnn_sdp_enabled() else "sdpa, cuDNN left out"
