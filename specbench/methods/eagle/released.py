"""The authors' released EAGLE-1 / EAGLE-2 drafters (Li et al. 2024, "EAGLE"; the SafeAILab/EAGLE repository's
checkpoints, e.g. yuhuili/EAGLE-Vicuna-7B-v1.3 for lmsys/vicuna-7b-v1.3, yuhuili/EAGLE-LLaMA3-Instruct-8B for
meta-llama/Meta-Llama-3-8B-Instruct) read into specbench's feature drafter (artifact.py). EAGLE-2 decodes with
EAGLE-1's drafters (its dynamic tree is `--tree dynamic`), so one layout serves both.

Published layout (a Hugging Face model folder):
  config.json   a Llama config of the drafter: hidden_size, vocab_size, intermediate_size, num_attention_heads,
                num_key_value_heads, num_hidden_layers (1), rms_norm_eps, hidden_act, rope_theta (absent: 10000),
                rope_scaling, bias (fc's bias; absent: on, as the authors' loader takes it)
  pytorch_model.bin or model.safetensors
                fc.weight [H, 2H] (+ fc.bias [H]), layers.0.self_attn.{q,k,v,o}_proj.weight,
                layers.0.mlp.{gate,up,down}_proj.weight, layers.0.post_attention_layernorm.weight, and
                embed_tokens.weight [V, H], a copy of the target's (stored, never trained)

The authors' drafter (eagle/model/cnets1.py): x = fc([e(x_{i+1}) ; f_i]) over the token's embedding and the
target's last (normed) hidden state, then Llama decoder layers of which the first has no input norm, and no final
norm: the target's LM head reads the layer's output. specbench's drafter fuses [f_i ; e(x_{i+1})], so fc's two
halves swap on loading, and runs a copy of the target's layer with the same weights, its input norm off and the
final norm off: the same function, provided the target's layer settings (norm epsilon, RoPE, activation) are the
drafter's (refused otherwise). A release belongs to the one target it was trained on: shapes are checked against
its config, and the stored embedding against the target's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...core import artifact_files as af
from ...core.model.load import LoadedModel
from ...core.structured import read_structured
from ...errors import SpecbenchError

CONFIG = "config.json"
WEIGHTS = ("model.safetensors", "pytorch_model.bin")
EXPECTED = "an EAGLE-1/2 release (config.json with pytorch_model.bin or model.safetensors)"
EMBEDDING = "embed_tokens.weight"
EMBEDDING_ROWS = 64  # rows of the stored embedding compared with the target's (spread over the vocabulary)
EMBEDDING_AGREEMENT = 0.99  # share of those entries equal in bfloat16: a copy of this target's embedding


def holds(path: Path) -> bool:
    """The folder has the published layout's files (its content is checked by `read`)."""
    return (path / CONFIG).is_file() and any((path / name).is_file() for name in WEIGHTS)


@dataclass
class Checkpoint:
    """A release read and checked against the target; `tensors` maps it onto the drafter's own names."""

    path: Path
    file: Path
    state: dict[str, torch.Tensor]
    variant: dict  # FeatureDrafter's fc_bias, input_norm, final_norm
    meta: dict = field(default_factory=dict)

    @property
    def source(self) -> str:
        return f"{self.path} (EAGLE-1/2 release)"

    def tensors(self, expected: dict[str, tuple]) -> dict[str, torch.Tensor]:
        """The drafter's tensors by its own names, each of the shape `expected` gives (the built drafter's)."""
        hidden = self.meta["hidden_size"]
        out = {}
        for name, tensor in self.state.items():
            if name == "fc.weight" and tensor.ndim == 2 and tensor.shape[1] == 2 * hidden:
                out[name] = torch.cat([tensor[:, hidden:], tensor[:, :hidden]], 1)  # [e ; f] -> [f ; e]
            elif name != EMBEDDING and not (name == "fc.bias" and not self.variant["fc_bias"]):
                out[name] = tensor  # a bias the config switches off: the authors' loader drops it too
        missing = sorted(set(expected) - set(out))
        if missing:
            raise SpecbenchError(f"{self.file}: no tensor {', '.join(missing)} (what the target's decoder layer "
                                 "needs); is it an EAGLE-1/2 drafter for this architecture?")
        extra = sorted(set(out) - set(expected))
        if extra:
            raise SpecbenchError(f"{self.file}: tensors {', '.join(extra)} have no place in the target's decoder "
                                 "layer: the drafter was built for another architecture")
        for name, shape in expected.items():
            if tuple(out[name].shape) != shape:
                raise SpecbenchError(f"{self.file}: tensor `{name}` is {list(out[name].shape)}, the target's "
                                     f"layer needs {list(shape)}")
        return out


def read(path: Path, target: LoadedModel) -> Checkpoint:
    """The release in `path`, refused with the reason when it cannot be the drafter of `target`."""
    config = read_structured(path / CONFIG, str(path / CONFIG), "JSON")
    if not isinstance(config, dict):
        raise SpecbenchError(f"{path / CONFIG}: expected a JSON object of config fields")
    if "draft_vocab_size" in config or any("eagle3" in str(a).lower() for a in config.get("architectures") or ()):
        raise SpecbenchError(f"{path}: an EAGLE-3 drafter (its config has draft_vocab_size); `--method eagle` reads "
                             "EAGLE-1/2 releases")
    _check_shapes(path, config, target)
    _check_layer_settings(path, config, target)
    file = next(path / name for name in WEIGHTS if (path / name).is_file())
    state = af.read_checkpoint(file)
    bias = config.get("bias", True)  # the authors' loader: absent means on
    if not isinstance(bias, bool):
        raise SpecbenchError(f"{path / CONFIG}: field `bias` must be true or false (found {bias!r})")
    if bias and "fc.bias" not in state:
        raise SpecbenchError(f"{file}: no fc.bias, yet {CONFIG} leaves `bias` on (absent means on); set "
                             "\"bias\": false there if the drafter was trained without it")
    if EMBEDDING in state:
        _check_embedding(file, state[EMBEDDING], target)
    hidden = config["hidden_size"]
    meta = {"method": "eagle", "released": "SafeAILab/EAGLE (EAGLE-1/2)", "checkpoint": str(path),
            "model": target.spec, "hidden_size": hidden, "vocab_size": config["vocab_size"], "mask_tokens": 0,
            "fc_bias": bias, "input_norm": False, "final_norm": False}
    return Checkpoint(path, file, state, {"fc_bias": bias, "input_norm": False, "final_norm": False}, meta)


def _check_shapes(path: Path, config: dict, target: LoadedModel) -> None:
    """Hidden size, vocabulary, the layer's widths and the layer count: the release's config against the target."""
    ours = target.model.config
    wanted = {"hidden size": ours.hidden_size, "vocabulary": target.vocab_size,
              "intermediate size": ours.intermediate_size, "attention heads": ours.num_attention_heads,
              "key-value heads": getattr(ours, "num_key_value_heads", None) or ours.num_attention_heads}
    keys = {"hidden size": "hidden_size", "vocabulary": "vocab_size", "intermediate size": "intermediate_size",
            "attention heads": "num_attention_heads", "key-value heads": "num_key_value_heads"}
    theirs = {}
    for what, key in keys.items():
        value = config.get(key, config.get("num_attention_heads") if key == "num_key_value_heads" else None)
        if not isinstance(value, int) or isinstance(value, bool):
            raise SpecbenchError(f"{path / CONFIG}: field `{key}` must be an integer (found {value!r})")
        theirs[what] = value
    if theirs != wanted:
        raise SpecbenchError(f"{path} is an EAGLE drafter for a model with {_said(theirs)} (its {CONFIG}), not for "
                             f"{target.spec} ({_said(wanted)}): a released drafter belongs to the one target it was "
                             "trained on (EAGLE-Vicuna-7B-v1.3: lmsys/vicuna-7b-v1.3); run it with that --model")
    layers = config.get("num_hidden_layers", 1)
    if layers != 1:
        raise SpecbenchError(f"{path / CONFIG}: num_hidden_layers is {layers}; an EAGLE-1/2 drafter has one decoder "
                             "layer (is this folder a whole model rather than its drafter?)")


def _said(shape: dict) -> str:
    return ", ".join(f"{what} {value}" for what, value in shape.items())


def _rope(theta, scaling) -> str:
    """A rotary embedding's base and scaling, as a comparable phrase ("theta 10000", "theta 10000, linear x4")."""
    scaling = scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    return f"theta {float(theta):g}" + ("" if kind == "default" else f", {kind} x{float(scaling.get('factor', 1)):g}")


def _check_layer_settings(path: Path, config: dict, target: LoadedModel) -> None:
    """specbench runs the release's weights in a copy of the target's layer: the settings outside the weights must
    be the drafter's own, or the layer would compute another function."""
    ours = target.model.config
    params = getattr(ours, "rope_parameters", None) or {}
    target_rope = _rope(params.get("rope_theta", getattr(ours, "rope_theta", 10000.0)),
                        params or getattr(ours, "rope_scaling", None))
    drafter_rope = _rope(config.get("rope_theta", 10000.0), config.get("rope_scaling"))
    settings = {"rms_norm_eps": (config.get("rms_norm_eps", 1e-6), getattr(ours, "rms_norm_eps", None)),
                "hidden_act": (config.get("hidden_act", "silu"), getattr(ours, "hidden_act", None)),
                "RoPE": (drafter_rope, target_rope)}
    for name, (theirs, mine) in settings.items():
        if theirs != mine:
            raise SpecbenchError(f"{path}: the drafter's {name} is {theirs}, {target.spec}'s {mine}; specbench runs "
                                 "the drafter's layer with the target's settings, so it would not compute the "
                                 "authors' drafter: use the release made for this target")


def _check_embedding(file: Path, stored: torch.Tensor, target: LoadedModel) -> None:
    """The release stores its target's embedding: rows spread over the vocabulary must equal this target's (in
    bfloat16, so a target loaded in float32, float16 or bfloat16 all compare alike)."""
    from ...core.model.placement import weight_of

    ours = weight_of(target.model.get_input_embeddings()).detach()  # [V, H]
    if tuple(stored.shape) != tuple(ours.shape):
        raise SpecbenchError(f"{file}: its embedding is {list(stored.shape)}, {target.spec}'s {list(ours.shape)}: "
                             "a released drafter belongs to the one target it was trained on")
    rows = torch.linspace(0, ours.shape[0] - 1, EMBEDDING_ROWS).long()
    mine = ours[rows.to(ours.device)].cpu().to(torch.bfloat16)
    same = (stored[rows].to(torch.bfloat16) == mine).float().mean().item()
    if same < EMBEDDING_AGREEMENT:
        raise SpecbenchError(f"{file}: the embedding it stores (its target's) differs from {target.spec}'s "
                             f"({same:.0%} of sampled entries equal): same shapes, another model; run it with the "
                             "model it was trained for")
