"""What the numbers are recorded with: device facts (NVML for GPUs, /proc/cpuinfo for CPUs) and versions."""

from __future__ import annotations

import os
import platform
import re
import subprocess
from functools import lru_cache
from pathlib import Path

import torch

from .. import REPO_ROOT


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_facts(index: int = 0) -> dict:
    """NVML facts of one GPU: name, memory, driver, clocks. Empty when NVML is unavailable."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(handle)
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
        facts = {
            "name": name.decode() if isinstance(name, bytes) else name,
            "memory_gib": round(mem.total / 2**30, 1),
            "driver": pynvml.nvmlSystemGetDriverVersion(),
            "sm_clock_max_mhz": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "mem_clock_max_mhz": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM),
        }
        facts = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in facts.items()}
        pynvml.nvmlShutdown()
        return facts
    except Exception:  # no driver, no GPU, no library: NVML simply has nothing to say
        return {}


@lru_cache(maxsize=1)
def git_revision() -> str:
    root = REPO_ROOT
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5)
        if rev.returncode != 0:
            return "unknown"
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return gpu_facts(device.index or 0).get("name") or torch.cuda.get_device_name(device)
    return cpu_model()


def hardware_slug(device: torch.device) -> str:
    """Short file-name-safe id of the hardware, e.g. 'nvidia-h100-80gb-hbm3' or 'cpu-intel-xeon-platinum-8481c'."""
    name = device_name(device)
    name = re.sub(r"\(r\)|\(tm\)|cpu @.*|@.*", "", name.lower())
    slug = re.sub(r"[^a-z0-9]+", "-", name).strip("-")
    return slug if device.type == "cuda" else f"cpu-{slug}"


def bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return True  # CPU kernels exist; fast only with AVX512-BF16 / AMX (see `flags` in env)


def environment(device: torch.device, dtype: torch.dtype | None = None) -> dict:
    """The environment every record carries (DESIGN.md §3)."""
    import transformers

    env = {
        "device": device_name(device),
        "device_type": device.type,
        "threads": torch.get_num_threads(),
        "torch": str(torch.__version__),
        "transformers": str(transformers.__version__),
        "git": git_revision(),
    }
    if dtype is not None:
        env["dtype"] = str(dtype).removeprefix("torch.")
    if device.type == "cpu":
        from .cpu_kernels import backend

        env["cpu_linear"] = backend()  # float32 linear kernels (cpu_kernels.py)
    return env


def cpu_flags() -> list[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = re.search(r"^flags\s*:(.*)$", text, re.M)
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
    return [f for f in wanted if flags and f in flags.group(1).split()]


def describe(device: torch.device) -> dict:
    """Everything `specbench env` prints."""
    from .. import __version__

    info = {"specbench": __version__, **environment(device)}
    info["python"] = platform.python_version()
    info["os"] = platform.platform()
    info["cpu"] = cpu_model()
    info["cpu_cores"] = os.cpu_count()
    info["cpu_flags"] = ", ".join(cpu_flags()) or "none of avx2/avx512/amx"
    info["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            for k, v in gpu_facts(i).items():
                info[f"gpu{i}_{k}"] = v
        info["cuda"] = torch.version.cuda
    info["bf16_supported"] = bf16_supported(device)
    return info
