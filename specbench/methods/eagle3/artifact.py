"""EAGLE-3 drafter folders: the EAGLE repository's published layout, which specbench's own artefact also uses.

A folder holds config.json (the drafter layer's Llama shape: hidden_size, num_attention_heads, num_key_value_heads,
intermediate_size, rms_norm_eps, rope_theta, vocab_size, draft_vocab_size, optionally target_hidden_size and
head_dim) and its weights, model.safetensors or pytorch_model.bin, with the keys of the EAGLE repository's
eagle/model/cnets.py Model: fc.weight [H, 3H_t], midlayer.{self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj,
hidden_norm, input_layernorm, post_attention_layernorm}.weight, norm.weight, lm_head.weight [K, H], d2t [K]
(draft id d is target id d + d2t[d]) and t2d [V] (bool); embed_tokens.weight [V, H] where the checkpoint brings
its own embeddings (else the target's are shared, which needs H = the target's hidden size). The authors' released
EAGLE-3 drafters are such folders; `specbench train eagle3` writes one (bfloat16) plus eagle3.yaml, its training
metadata, which also ties it to the model it was trained for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from ...core import artifact_files as af
from ...core.model.cpu_kernels import prepack
from ...core.model.load import LoadedModel
from ...core.model.placement import resident, weight_of
from ...errors import SpecbenchError
from .drafter import Eagle3Drafter, drafter_config

META_FILE, CONFIG_FILE = "eagle3.yaml", "config.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
TRAIN = "specbench train eagle3"
EXPECTED = (f"{CONFIG_FILE} and {WEIGHT_FILES[0]} or {WEIGHT_FILES[1]} (the EAGLE repository's EAGLE-3 layout: "
            "fc.weight, midlayer.*, norm.weight, lm_head.weight, d2t, t2d)")


@dataclass
class Eagle3Artifact:
    drafter: Eagle3Drafter
    meta: dict = field(default_factory=dict)
    source: str = ""


def config_json(drafter: Eagle3Drafter) -> dict:
    """config.json as the EAGLE repository's EAGLE-3 drafters carry it."""
    c = drafter.config
    out = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": c.hidden_size,
           "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
           "head_dim": c.head_dim, "intermediate_size": c.intermediate_size, "rms_norm_eps": c.rms_norm_eps,
           "rope_theta": (getattr(c, "rope_parameters", None) or {}).get("rope_theta", getattr(c, "rope_theta", None)),
           "max_position_embeddings": c.max_position_embeddings, "num_hidden_layers": 1, "hidden_act": "silu",
           "vocab_size": c.vocab_size, "draft_vocab_size": drafter.lm_head.out_features, "torch_dtype": "bfloat16"}
    if drafter.target_hidden != c.hidden_size:
        out["target_hidden_size"] = drafter.target_hidden
    return out


def save(drafter: Eagle3Drafter, out: Path, meta: dict) -> None:
    """config.json, model.safetensors (floating weights in bfloat16: the drafter only proposes, so its rounding never
    changes what a lossless method emits) and eagle3.yaml."""
    from safetensors.torch import save_file

    state = {n: (t.to(torch.bfloat16) if t.is_floating_point() else t) for n, t in drafter.own_state().items()}
    try:
        out.mkdir(parents=True, exist_ok=True)
        save_file(state, str(out / WEIGHT_FILES[0]), metadata={"format": "pt"})
        (out / CONFIG_FILE).write_text(json.dumps(config_json(drafter), indent=2) + "\n")
        (out / META_FILE).write_text(yaml.safe_dump(meta, sort_keys=False))
    except OSError as exc:
        raise SpecbenchError(f"cannot write {out}: {exc.strerror or exc}") from exc


def is_folder(path: Path) -> bool:
    return path.is_dir() and (path / CONFIG_FILE).is_file() and any((path / w).is_file() for w in WEIGHT_FILES)


def _config(path: Path) -> dict:
    try:
        cfg = json.loads((path / CONFIG_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise SpecbenchError(f"{path / CONFIG_FILE}: cannot read it as JSON ({exc})") from exc
    need = ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
    missing = [k for k in need if not isinstance(cfg.get(k), int)]
    if not isinstance(cfg, dict) or missing:
        raise SpecbenchError(f"{path / CONFIG_FILE}: not an EAGLE-3 drafter config (missing integer fields "
                             f"{', '.join(missing)})")
    return cfg


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    file = next(path / w for w in WEIGHT_FILES if (path / w).is_file())
    try:
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(file))
        state = torch.load(str(file), map_location="cpu", weights_only=True)
    except Exception as exc:  # a torn or foreign file: its reader's own message
        raise SpecbenchError(f"{file}: cannot read it ({exc})") from exc
    if not isinstance(state, dict):
        raise SpecbenchError(f"{file}: expected a state dict of tensors")
    return state


def _check_shapes(path: Path, drafter: Eagle3Drafter, tensors: dict[str, torch.Tensor]) -> None:
    want = {n: tuple(t.shape) for n, t in drafter.own_state().items()}
    missing = sorted(set(want) - set(tensors))
    if missing:
        raise SpecbenchError(f"{path}: not an EAGLE-3 drafter: its weights lack {', '.join(missing[:6])}"
                             f"{' ...' if len(missing) > 6 else ''}; expected {EXPECTED}")
    wrong = [f"{n} {tuple(tensors[n].shape)} (expected {s})" for n, s in want.items() if tuple(tensors[n].shape) != s]
    if wrong:
        raise SpecbenchError(f"{path}: weights of another shape than its config.json and the target say: "
                             + "; ".join(wrong[:4]))


def load(path: str | Path, target: LoadedModel) -> Eagle3Artifact:
    """A folder in the published EAGLE-3 layout (module docstring), checked against the target."""
    path = Path(path)
    if not is_folder(path):
        raise SpecbenchError(f"{path}: not an EAGLE-3 drafter folder; expected {EXPECTED}")
    meta = {}
    if (path / META_FILE).is_file():  # specbench's own: trained for one model
        meta = af.read_meta(path, META_FILE, {"model": str, "hidden_size": int, "vocab_size": int})
        af.check_model(meta, path, target, TRAIN)
    cfg = _config(path)
    tensors = _tensors(path)
    model = target.model
    t_hidden, vocab = model.config.hidden_size, target.vocab_size
    theirs_t = cfg.get("target_hidden_size", cfg["hidden_size"])
    if theirs_t != t_hidden or cfg["vocab_size"] != vocab:
        raise SpecbenchError(f"{path}: an EAGLE-3 drafter for a target of hidden size {theirs_t} and vocabulary "
                             f"{cfg['vocab_size']}, not for {target.spec} (hidden size {t_hidden}, vocabulary "
                             f"{vocab})")
    d2t = tensors.get("d2t")
    k = cfg.get("draft_vocab_size", vocab)
    if d2t is None:  # a full-vocabulary head needs no map
        d2t = torch.zeros(k, dtype=torch.long)
        tensors["d2t"] = d2t
        tensors.setdefault("t2d", torch.ones(vocab, dtype=torch.bool))
    draft_ids = torch.arange(d2t.shape[0]) + d2t.long()
    if draft_ids.numel() != k or draft_ids.min() < 0 or draft_ids.max() >= vocab:
        raise SpecbenchError(f"{path}: d2t maps its {d2t.shape[0]} draft tokens outside the target's vocabulary "
                             f"of {vocab} (or draft_vocab_size {k} differs)")
    embeddings = resident(model.get_input_embeddings())  # a resident copy where the target's is offloaded
    if "embed_tokens.weight" in tensors:
        embeddings = torch.nn.Embedding.from_pretrained(tensors.pop("embed_tokens.weight"), freeze=True)
    elif cfg["hidden_size"] != t_hidden:
        raise SpecbenchError(f"{path}: a drafter of hidden size {cfg['hidden_size']} without its own "
                             f"embed_tokens.weight cannot share the target's embeddings (hidden size {t_hidden})")
    rope = cfg.get("rope_scaling") if isinstance(cfg.get("rope_scaling"), dict) else None
    dcfg = drafter_config(cfg["hidden_size"], cfg["num_attention_heads"],
                          cfg.get("num_key_value_heads") or cfg["num_attention_heads"], cfg["intermediate_size"],
                          cfg.get("rms_norm_eps", 1e-6), cfg.get("rope_theta", 10000.0),
                          cfg.get("max_position_embeddings", 2048), vocab, cfg.get("head_dim"), rope)
    drafter = Eagle3Drafter(dcfg, t_hidden, draft_ids, embeddings)
    _check_shapes(path, drafter, tensors)
    weight = weight_of(model.get_output_embeddings())
    dtype = weight.dtype
    drafter.load_state_dict({n: (t.to(dtype) if t.is_floating_point() else t) for n, t in tensors.items()
                             if n in drafter.state_dict()}, strict=False)
    drafter.place(weight.device, dtype)
    if embeddings is not model.get_input_embeddings():  # its own, or a resident copy of an offloaded one
        drafter._shared = (embeddings.to(weight.device, dtype),)
    drafter.requires_grad_(False).eval()
    prepack(drafter)
    return Eagle3Artifact(drafter, meta, str(path))


def resolve(spec: str | None, target: LoadedModel) -> Eagle3Artifact:
    """--artifact: None = this model's trained drafter (artifacts/<model>/eagle3); else a folder in the published
    EAGLE-3 layout (the authors' released drafters, or one `train eagle3` wrote)."""
    if spec:
        return load(spec, target)
    path = af.default_dir(target, "eagle3", META_FILE)
    if not (path / META_FILE).is_file():
        raise SpecbenchError(f"no EAGLE-3 drafter for {target.spec} (looked for artifacts/{path.parent.name}/eagle3 "
                             f"here and in the repo): train one with `{TRAIN} --model {target.spec}`, or pass "
                             "--artifact <folder> (a released EAGLE-3 drafter: config.json and model.safetensors "
                             "or pytorch_model.bin)")
    return load(path, target)
