"""What the trained artefacts of single-model methods (Medusa heads, Hidden Transfer projections) share: a folder of
<weights>.safetensors + <method>.yaml, found at artifacts/<model key>/<method>/, and refused when its metadata is
malformed (the file and field named) or it was trained for another model (both names given)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
import yaml

from . import store
from .model.load import LoadedModel, model_slug
from .structured import read_structured
from ..errors import SpecbenchError


def default_dir(target: LoadedModel | str, folder: str, meta_file: str) -> Path:
    """artifacts/<model key>/<folder> in the working directory (where `train` writes) when it holds an artefact
    (its meta file), else the repo's."""
    return store.find_artifact_dir(model_slug(target if isinstance(target, str) else target.spec), folder, meta_file)


def read_meta(path: Path, meta_file: str, fields: dict[str, type], optional: dict[str, type] | None = None) -> dict:
    """The artefact's metadata, each required field present with the right type, each `optional` field of the right
    type where present (errors name file and field)."""
    file = path / meta_file
    meta = read_structured(file, str(file))
    if not isinstance(meta, dict):
        raise SpecbenchError(f"{file}: expected a mapping of metadata fields")
    present = {name: kind for name, kind in (optional or {}).items() if name in meta}
    for name, kind in {**fields, **present}.items():
        value = meta.get(name)
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if kind is list:
            ok = isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        if not ok:
            what = "a list of integers" if kind is list else kind.__name__
            raise SpecbenchError(f"{file}: field `{name}` must be {what} (found {value!r})")
    return meta


def check_model(meta: dict, path: Path, target: LoadedModel, train: str) -> None:
    """Refuse an artefact trained for another model: hidden size, vocabulary or model key differ."""
    cfg = target.model.config
    theirs, ours = meta.get("model", "?"), target.spec
    if meta["hidden_size"] != cfg.hidden_size or meta["vocab_size"] != target.vocab_size:
        raise SpecbenchError(f"{path} was trained for {theirs} (hidden size {meta['hidden_size']}, vocabulary "
                             f"{meta['vocab_size']}), not for {ours} (hidden size {cfg.hidden_size}, vocabulary "
                             f"{target.vocab_size}); train one for it with `{train} --model {ours}`")
    if meta.get("model_key") and meta["model_key"] != model_key(target):
        raise SpecbenchError(f"{path} was trained for {theirs} (key {meta['model_key']}), not for {ours} (key "
                             f"{model_key(target)}): same shapes, other weights; train one with "
                             f"`{train} --model {ours}`")


def load_weights(path: Path, weights_file: str, names: dict[str, tuple]) -> dict[str, torch.Tensor]:
    """Tensors by name from <path>/<weights_file>, each of the expected shape (None in a shape: any size)."""
    from safetensors.torch import load_file

    file = path / weights_file
    try:
        tensors = load_file(str(file))
    except (OSError, RuntimeError, ValueError) as exc:
        raise SpecbenchError(f"{file}: cannot read it ({exc})") from exc
    out = {}
    for name, shape in names.items():
        t = tensors.get(name)
        if t is None or t.ndim != len(shape) or any(s is not None and s != d for s, d in zip(shape, t.shape)):
            raise SpecbenchError(f"{file}: tensor `{name}` should have shape {list(shape)} "
                                 f"(found {None if t is None else list(t.shape)}); retrain the artefact")
        out[name] = t.float()
    return out


def read_checkpoint(file: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a published checkpoint file by name: safetensors, or a PyTorch state dict (.bin / .pt, read
    with weights_only: tensors only, no code runs)."""
    import pickle

    from safetensors import SafetensorError

    try:
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(file))
        else:
            state = torch.load(str(file), map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError, SafetensorError) as exc:
        raise SpecbenchError(f"{file}: cannot read it ({str(exc).splitlines()[0] if str(exc) else exc!r})") from exc
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise SpecbenchError(f"{file}: expected a state dict of tensors by name")
    return state


def save(out: Path, weights_file: str, tensors: dict[str, torch.Tensor], meta_file: str, meta: dict) -> None:
    from safetensors.torch import save_file

    try:
        out.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().float().cpu().contiguous() for k, v in tensors.items()}, str(out / weights_file),
                  metadata={"format": "pt"})
        (out / meta_file).write_text(yaml.safe_dump(meta, sort_keys=False))
    except OSError as exc:
        raise SpecbenchError(f"cannot write {out}: {exc.strerror or exc}") from exc


def locate_dir(spec: str | None, target: LoadedModel, folder: str, meta_file: str, what: str, train: str,
               released: str = "") -> Path:
    """--artifact: None = artifacts/<model>/<folder> (here, else the repo's); else the folder given. `released`
    names the files of the authors' published layout the family also reads, for the error of a folder that holds
    neither."""
    path = Path(spec) if spec else default_dir(target, folder, meta_file)
    if not (path / meta_file).is_file():
        if spec:
            where = f"{path}: no such folder" if not path.is_dir() else f"{path}: holds no {what}"
            other = f", or {released}" if released else ""
            raise SpecbenchError(f"{where} (expected {meta_file} from `{train}`{other}); train one with "
                                 f"`{train} --model {target.spec}`")
        raise SpecbenchError(f"no {what} for {target.spec} (looked for artifacts/{model_slug(target.spec)}/{folder} "
                             f"here and in the repo): train them with `{train} --model {target.spec}` (found by "
                             "itself afterwards), or pass --artifact <folder>")
    return path


def model_key(target: LoadedModel) -> str:
    """Which model an artefact belongs to, the same whether the model is loaded in float32 or bfloat16
    (architecture plus a slice of the embeddings rounded to bfloat16)."""
    cfg = target.model.config.to_dict()
    keys = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size")
    h = hashlib.sha256(json.dumps({k: cfg.get(k) for k in keys}, sort_keys=True).encode())
    from .model.placement import weight_of

    emb = weight_of(target.model.get_input_embeddings())[:4, :16].detach().to(torch.bfloat16).float().cpu()
    h.update(emb.numpy().tobytes())
    return h.hexdigest()[:12]
