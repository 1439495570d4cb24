"""What the numbers are recorded with: the hardware identity (NVML / CUDA for GPUs, /proc/cpuinfo for CPUs) and
versions."""

from __future__ import annotations

import os
import platform
import re
import subprocess
from functools import lru_cache
from pathlib import Path

import torch

from .. import store


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_facts(index: int = 0) -> dict:
    """NVML facts of torch's GPU `index`: name, memory, driver, clocks. Empty when NVML is unavailable; a query the
    GPU does not support (clocks under MIG / vGPU) is left out, the others kept."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver, no GPU, no library: NVML simply has nothing to say
        return {}
    facts = {}
    try:
        handle = _nvml_handle(pynvml, index)
        queries = {
            "name": lambda: pynvml.nvmlDeviceGetName(handle),
            "memory_gib": lambda: round(pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30, 1),
            "driver": pynvml.nvmlSystemGetDriverVersion,
            "sm_clock_max_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "mem_clock_max_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM),
        }
        for key, query in queries.items():
            try:
                value = query()
                facts[key] = value.decode() if isinstance(value, bytes) else value
            except Exception:  # this query is unsupported here: keep the others
                continue
    except Exception:  # no handle for this GPU
        return {}
    finally:
        pynvml.nvmlShutdown()
    return facts


def _nvml_handle(pynvml, index: int):
    """NVML's handle of torch's GPU `index`, found by PCI bus id: NVML ignores CUDA_VISIBLE_DEVICES and may number
    GPUs differently from CUDA. Falls back to the index where torch does not give the bus id."""
    try:
        props = torch.cuda.get_device_properties(index)
        bus_id = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    except Exception:  # CPU-only torch, or a build without PCI properties
        return pynvml.nvmlDeviceGetHandleByIndex(index)
    return pynvml.nvmlDeviceGetHandleByPciBusId(bus_id.encode())


@lru_cache(maxsize=1)
def git_revision() -> str:
    root = store.checkout()
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


# ------------------------------------------------------------------------------------------- hardware identity
# Two CPUs that share a marketing name can have completely different latency curves (docs/models-and-hardware.md:
# an AVX2-only EPYC and a Zen 4 EPYC with AVX512-BF16 are both "AMD EPYC"; their bf16 curves differ completely,
# benchmarks/RESULTS-cpu.md). So the identity is vendor, family / model, the ISA features that change the curve,
# and core count, and profiles, trees and runs are keyed by it, never by the name alone.

# ISA features that change a CPU's latency curve, and the tier each puts the CPU in (highest wins in the slug).
CURVE_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")
ISA_TIERS = (("amx", ("amx_tile", "amx_bf16")), ("avx512bf16", ("avx512_bf16",)), ("avx512", ("avx512f",)),
             ("avx2", ("avx2",)))


def _cpuinfo_fields() -> dict[str, str]:
    """The first processor block of /proc/cpuinfo as key -> value (empty off Linux)."""
    try:
        block = Path("/proc/cpuinfo").read_text().split("\n\n", 1)[0]
    except OSError:
        return {}
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in block.splitlines()) if k.strip()}


def usable_cores() -> int:
    """CPUs this process may run on (affinity / cgroup cpusets), which is what torch's threads get."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_identity() -> dict:
    """vendor, name, family / model / stepping, the curve-changing ISA flags present, usable cores."""
    info = _cpuinfo_fields()
    vendor = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}.get(info.get("vendor_id", ""),
                                                                  info.get("vendor_id", platform.machine()).lower())
    flags = set(info.get("flags", "").split())

    def number(key):
        return int(info[key]) if info.get(key, "").isdigit() else None

    return {"kind": "cpu", "vendor": vendor, "name": cpu_model(), "family": number("cpu family"),
            "model": number("model"), "stepping": number("stepping"),
            "isa": [f for f in CURVE_FLAGS if f in flags], "cores": usable_cores()}


def gpu_identity(device: torch.device) -> dict:
    """name, memory and compute capability of one GPU."""
    facts = gpu_facts(device.index or 0)
    major, minor = torch.cuda.get_device_capability(device)
    return {"kind": "gpu", "vendor": "nvidia" if torch.version.cuda else "amd", "name": device_name(device),
            "memory_gib": facts.get("memory_gib") or round(torch.cuda.get_device_properties(device).total_memory
                                                           / 2**30, 1),
            "capability": f"{major}.{minor}"}


def hardware_identity(device: torch.device) -> dict:
    return gpu_identity(device) if device.type == "cuda" else cpu_identity()


def isa_tier(isa: list[str]) -> str:
    for tier, needs in ISA_TIERS:
        if all(f in isa for f in needs):
            return tier
    return "base"


def _name_slug(name: str) -> str:
    name = re.sub(r"\(r\)|\(tm\)|@.*|\b\d+-core\b|\bprocessor\b|\bcpu\b", " ", name.lower())
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-")


def slug_of(identity: dict) -> str:
    """File-name-safe key of an identity: 'cpu-amd-epyc-avx2-2c', 'cpu-intel-xeon-amx-2c', 'nvidia-h100-80gb-hbm3'."""
    if identity.get("kind") == "gpu":
        return _name_slug(identity["name"])
    return f"cpu-{_name_slug(identity['name'])}-{isa_tier(identity.get('isa') or [])}-{identity.get('cores')}c"


def hardware_slug(device: torch.device) -> str:
    """This device's key for profiles/ and trees/ (slug_of its identity)."""
    return slug_of(hardware_identity(device))


IDENTITY_FIELDS = ("vendor", "name", "family", "model", "isa", "cores", "memory_gib", "capability")


def identity_differences(recorded: dict | None, local: dict) -> tuple[list[str], list[str]]:
    """(fields that differ, fields the recorded identity does not state) between a file's identity and this one."""
    if not recorded:
        return [], ["identity"]
    differ, unknown = [], []
    for key in IDENTITY_FIELDS:
        if key not in local:
            continue
        if recorded.get(key) is None:
            unknown.append(key)
        elif recorded[key] != local[key]:
            differ.append(f"{key} {brief(recorded[key])} vs {brief(local[key])} here")
    return differ, unknown


def brief(value) -> str:
    """An identity value on one line: ISA lists joined with '+'."""
    return "+".join(map(str, value)) if isinstance(value, list) else str(value)


def provenance(recorded_slug: str, recorded: dict | None, local: dict) -> str:
    """How a profile or tree relates to this hardware: 'measured here', 'same hardware class (... not recorded)',
    or 'borrowed from <slug>: <differences>' (its predictions are then not this machine's)."""
    differ, unknown = identity_differences(recorded, local)
    if recorded_slug != slug_of(local) or differ:
        return f"borrowed from {recorded_slug}" + (f": {'; '.join(differ)}" if differ else "")
    if unknown:
        return f"same hardware class ({', '.join(unknown)} not recorded)"
    return "measured here"


def bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return True  # CPU kernels exist; fast only with AVX512-BF16 / AMX (see `flags` in env)


def environment(device: torch.device, dtype: torch.dtype | None = None) -> dict:
    """The environment every record carries (docs/measurement.md)."""
    import transformers

    env = {
        "device": device_name(device),
        "device_type": device.type,
        "hardware": hardware_slug(device),
        "identity": hardware_identity(device),
        "threads": torch.get_num_threads(),
        "torch": str(torch.__version__),
        "transformers": str(transformers.__version__),
        "git": git_revision(),
    }
    if dtype is not None:
        env["dtype"] = str(dtype).removeprefix("torch.")
    if device.type == "cpu":
        from ..model.cpu_kernels import backend

        env["cpu_linear"] = backend()  # float32 linear kernels (cpu_kernels.py)
    elif device.type == "cuda":
        from ..model.attention_kernels import attention_in_use

        env["attention"] = attention_in_use(device)  # cuDNN attention left out or not (attention_kernels.py)
    return env


def describe(device: torch.device) -> dict:
    """Everything `specbench env` prints."""
    from ... import __version__

    info = {"specbench": __version__, **environment(device)}
    info["identity"] = ", ".join(f"{k} {brief(v)}" for k, v in info["identity"].items() if k != "kind")
    info["python"] = platform.python_version()
    info["os"] = platform.platform()
    cpu = cpu_identity()
    info["cpu"] = f"{cpu['name']} ({cpu['vendor']}, family {cpu['family']} model {cpu['model']})"
    info["cpu_cores"] = f"{cpu['cores']} usable of {os.cpu_count()}"
    info["cpu_flags"] = ", ".join(cpu["isa"]) or f"none of {', '.join(CURVE_FLAGS)}"
    info["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            for k, v in gpu_facts(i).items():
                info[f"gpu{i}_{k}"] = v
        info["cuda"] = torch.version.cuda
    info["bf16_supported"] = bf16_supported(device)
    return info
