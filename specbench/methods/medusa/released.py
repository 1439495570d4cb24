"""The authors' released Medusa heads (Cai et al. 2024, "Medusa"; the FasterDecoding/Medusa repository's
checkpoints, e.g. FasterDecoding/medusa-vicuna-7b-v1.3 for lmsys/vicuna-7b-v1.3) read into specbench's heads
(artifact.py).

Published layout (a Hugging Face folder):
  medusa_lm_head.pt or medusa_lm_head.safetensors   the state dict of the heads' ModuleList, per head k:
      k.j.linear.weight [H, H], k.j.linear.bias [H]   residual block j < L: s + SiLU(W s + b)
      k.L.weight [V, H]                                the head's own vocabulary projection (no bias); heads from
                                                       the repository's legacy trainer have none and read through
                                                       the base model's LM head
  config.json   medusa_num_heads, medusa_num_layers (L), base_model_name_or_path

The authors' heads (medusa/model/medusa_model.py) read the base model's last hidden state after its final norm,
as specbench's heads at the last layer do. Their loader builds five heads whatever the uploaded config says (the
vicuna-7b config names two), so the head count is the file's; the block count is the config's and must be the
file's. The heads belong to the target named in base_model_name_or_path: their hidden size and vocabulary are
checked against the target's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...core import artifact_files as af
from ...core.model.load import LoadedModel
from ...core.structured import read_structured
from ...errors import SpecbenchError

CONFIG = "config.json"
WEIGHTS = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
EXPECTED = "Medusa's released heads (medusa_lm_head.pt or medusa_lm_head.safetensors, with its config.json)"
KEY = re.compile(r"^(?:medusa_head\.)?(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)$")


def holds(path: Path) -> bool:
    """The folder has the published heads file (its content is checked by `read`)."""
    return any((path / name).is_file() for name in WEIGHTS)


@dataclass
class Release:
    """The heads' tensors by specbench's names (weight, bias, deeper_weight, deeper_bias, head_weight)."""

    tensors: dict[str, torch.Tensor]
    heads: int
    hidden: int
    blocks: int
    own_vocab: int  # the heads' own projections' vocabulary; 0: they read through the target's LM head
    source: str
    meta: dict = field(default_factory=dict)


def read(path: Path, target: LoadedModel) -> Release:
    """The heads in `path`, refused with the reason when they cannot be `target`'s."""
    config = _config(path)
    file = next(path / name for name in WEIGHTS if (path / name).is_file())
    by_head: dict[int, dict] = {}
    for name, tensor in af.read_checkpoint(file).items():
        match = KEY.match(name)
        if not match:
            raise SpecbenchError(f"{file}: tensor `{name}` is not a Medusa head's (expected <head>.<block>.linear."
                                 "weight / .bias and <head>.<blocks>.weight)")
        k, j, part = int(match[1]), int(match[2]), match[3]
        by_head.setdefault(k, {})[(j, part)] = tensor
    if not by_head or sorted(by_head) != list(range(len(by_head))):
        raise SpecbenchError(f"{file}: heads {sorted(by_head)}; expected heads numbered 0, 1, 2, ...")
    blocks = sum(1 for j, part in by_head[0] if part == "linear.weight")
    if blocks < 1:
        raise SpecbenchError(f"{file}: head 0 has no residual block (<head>.0.linear.weight)")
    said = config.get("medusa_num_layers", blocks)
    if said != blocks:
        raise SpecbenchError(f"{path / CONFIG} says medusa_num_layers {said}, {file.name} holds {blocks} residual "
                             "blocks per head: the authors' loader would leave blocks untrained; fix the config")
    own = (blocks, "weight") in by_head[0]
    wanted = {(j, p) for j in range(blocks) for p in ("linear.weight", "linear.bias")} | ({(blocks, "weight")}
                                                                                          if own else set())
    for k, parts in by_head.items():
        if set(parts) != wanted:
            raise SpecbenchError(f"{file}: head {k} holds {_names(k, parts)}, expected {_names(k, wanted)} (every "
                                 f"head {blocks} residual block(s){' and its own projection' if own else ''})")
    first = by_head[0][(0, "linear.weight")]
    hidden, vocab = first.shape[-1], by_head[0][(blocks, "weight")].shape[0] if own else None
    _check_shapes(path, by_head, blocks, own, hidden, vocab, target, config)

    def stack(j: int, part: str) -> torch.Tensor:  # one tensor of every head, stacked [K, ...]
        return torch.stack([by_head[k][(j, part)] for k in range(len(by_head))])

    tensors = {"weight": stack(0, "linear.weight"), "bias": stack(0, "linear.bias")}  # [K, H, H], [K, H]
    if blocks > 1:  # [L-1, K, H, H], [L-1, K, H]
        tensors["deeper_weight"] = torch.stack([stack(j, "linear.weight") for j in range(1, blocks)])
        tensors["deeper_bias"] = torch.stack([stack(j, "linear.bias") for j in range(1, blocks)])
    if own:
        tensors["head_weight"] = stack(blocks, "weight")  # [K, V, H]
    base = config.get("base_model_name_or_path")
    source = f"{path} (Medusa release{f' for {base}' if base else ''})"
    meta = {"method": "medusa", "released": "FasterDecoding/Medusa", "checkpoint": str(path), "base_model": base,
            "model": target.spec, "hidden_size": hidden, "vocab_size": vocab or target.vocab_size,
            "heads": len(by_head), "blocks": blocks, "own_heads": own, "layer": target.model.config.num_hidden_layers}
    return Release(tensors, len(by_head), hidden, blocks, vocab or 0, source, meta)


def _config(path: Path) -> dict:
    if not (path / CONFIG).is_file():
        raise SpecbenchError(f"{path}: Medusa heads without their {CONFIG} (medusa_num_heads, medusa_num_layers, "
                             "base_model_name_or_path); download the whole folder")
    config = read_structured(path / CONFIG, str(path / CONFIG), "JSON")
    if not isinstance(config, dict):
        raise SpecbenchError(f"{path / CONFIG}: expected a JSON object of config fields")
    layers = config.get("medusa_num_layers")
    if layers is not None and (not isinstance(layers, int) or isinstance(layers, bool) or layers < 1):
        raise SpecbenchError(f"{path / CONFIG}: field `medusa_num_layers` must be a positive integer "
                             f"(found {layers!r})")
    return config


def _names(k: int, parts) -> str:
    return ", ".join(f"{k}.{j}.{part}" for j, part in sorted(parts))


def _check_shapes(path: Path, by_head: dict, blocks: int, own: bool, hidden: int, vocab: int | None,
                  target: LoadedModel, config: dict) -> None:
    """Every block [H, H] + [H] and projection [V, H] of one H and V, which must be the target's."""
    expected = {(j, p): (hidden, hidden) if p == "linear.weight" else (hidden,)
                for j in range(blocks) for p in ("linear.weight", "linear.bias")}
    if own:
        expected[(blocks, "weight")] = (vocab, hidden)
    for k, parts in by_head.items():
        for key, shape in expected.items():
            if tuple(parts[key].shape) != shape:
                raise SpecbenchError(f"{path}: tensor {k}.{key[0]}.{key[1]} is {list(parts[key].shape)}, head 0's "
                                     f"give {list(shape)}")
    ours_hidden, ours_vocab = target.model.config.hidden_size, target.vocab_size
    if hidden != ours_hidden or (own and vocab != ours_vocab):
        base = config.get("base_model_name_or_path")
        theirs = f"hidden size {hidden}" + (f", vocabulary {vocab}" if own else "")
        raise SpecbenchError(f"{path}: Medusa heads for a model with {theirs}"
                             f"{f' (trained for {base})' if base else ''}, not for {target.spec} (hidden size "
                             f"{ours_hidden}, vocabulary {ours_vocab}): released heads belong to the one target "
                             "they were trained on; run them with that --model")
