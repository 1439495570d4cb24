"""Latency curves for hardware that is not here: a roofline estimate from a chip's published peak rates.

L_fp(n) ~= overhead + max(FLOPs(n) / peak FLOP/s, bytes(n) / memory bandwidth), with FLOPs and bytes of one
forward of n tokens on a KV cache of length kv (weights read once; KV read once; attention FLOPs included).
Everything estimated here is labelled `source: estimated`; a measured profile of the same hardware always wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..core import store
from ..errors import SpecbenchError
from ..core.profile_file import BatchCurve
from .profile import DEFAULT_KV_LENGTHS, LatencyProfile, load_profile


@dataclass(frozen=True)
class Chip:
    """Published dense (no sparsity) bf16/fp16 tensor-core peak and memory bandwidth of one GPU."""

    name: str
    tflops: float  # dense bf16/fp16, fp32 accumulate
    bandwidth_gbs: float
    slug_hint: str  # substring of the NVML-derived hardware slug, to find measured profiles


# Vendor datasheets (NVIDIA A100 / H100 / H200 / L40S / GeForce RTX 4090, 3090 whitepapers).
CHIPS = {
    "a100": Chip("NVIDIA A100-SXM4-40GB", 312.0, 1555.0, "a100-sxm4-40gb"),
    "a100-80gb": Chip("NVIDIA A100-SXM4-80GB", 312.0, 2039.0, "a100-sxm4-80gb"),
    "h100": Chip("NVIDIA H100 80GB HBM3 (SXM)", 989.0, 3350.0, "h100"),
    "h200": Chip("NVIDIA H200 (SXM)", 989.0, 4800.0, "h200"),
    "l40s": Chip("NVIDIA L40S", 362.0, 864.0, "l40s"),
    "rtx4090": Chip("NVIDIA GeForce RTX 4090", 165.2, 1008.0, "rtx-4090"),
    "rtx3090": Chip("NVIDIA GeForce RTX 3090", 71.0, 936.0, "rtx-3090"),
}
GPU_CHOICES = (*CHIPS, "cpu")


@dataclass(frozen=True)
class ModelShape:
    """What a roofline needs from a decoder-only config."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def from_config(cls, config) -> "ModelShape":
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(config.num_hidden_layers, config.hidden_size, config.intermediate_size, heads,
                   getattr(config, "num_key_value_heads", None) or heads, head_dim, config.vocab_size)

    @property
    def weights_per_layer(self) -> int:
        q_o = 2 * self.hidden * self.heads * self.head_dim
        k_v = 2 * self.hidden * self.kv_heads * self.head_dim
        return q_o + k_v + 3 * self.hidden * self.intermediate

    def flops(self, n: int, kv: int) -> float:
        return float(self.matmul_flops(n) + self.attention_flops(n, kv))

    def matmul_flops(self, n: int) -> float:
        """The linear layers and the LM head over n tokens."""
        return 2.0 * n * (self.layers * self.weights_per_layer + self.vocab * self.hidden)

    def attention_flops(self, n: int, kv: int) -> float:
        """n new tokens attending to kv cached ones and to each other (one row)."""
        return 4.0 * n * (kv + n) * self.heads * self.head_dim * self.layers

    def bytes(self, n: int, kv: int, bytes_per_value: int) -> float:
        weights = self.layers * self.weights_per_layer + self.vocab * self.hidden
        cache = 2 * self.layers * (kv + n) * self.kv_heads * self.head_dim
        return float((weights + cache) * bytes_per_value)


def default_overhead_ms(shape: ModelShape) -> float:
    """Fixed per-forward cost (kernel launches, Python) when no measured profile supplies it: an assumption of
    about 0.25 ms per decoder layer plus 1 ms, typical of eager PyTorch on a GPU."""
    return fixed_forward_ms(shape.layers)


def fixed_forward_ms(layers: float) -> float:
    """The assumed fixed cost of one forward through `layers` decoder layers (default_overhead_ms's law)."""
    return 1.0 + 0.25 * max(layers, 1.0)


def drafting_forward_ms(profile, kv_length: int, share: float, layers: float) -> float:
    """One drafting forward on `profile`: its fixed cost plus the drafter's `share` of the target's weight-reading
    time. An estimated profile states the target's fixed cost (overhead_ms), so the drafter pays its own fixed cost
    (fixed_forward_ms of its `layers`) plus share x (L(1) - the target's fixed cost): a one-layer drafter's forward is
    not 1/32 of a 32-layer target's when launches dominate. A measured profile does not split L(1), so there the
    forward is share x L(1)."""
    one = profile.latency_ms(1, kv_length)
    overhead = (profile.meta or {}).get("overhead_ms") if profile.source == "estimated" else None
    if not isinstance(overhead, (int, float)) or share <= 0:
        return one * share
    return fixed_forward_ms(layers) + share * max(one - overhead, 0.0)


# Share of the datasheet peaks that eager PyTorch kernels reach in practice (assumptions, stated in every
# estimated profile): large GEMMs reach about 60% of tensor-core peak, streaming reads about 80% of bandwidth.
COMPUTE_EFFICIENCY = 0.6
BANDWIDTH_EFFICIENCY = 0.8


def roofline_ms(shape: ModelShape, chip: Chip, n: int, kv: int, bytes_per_value: int, overhead_ms: float) -> float:
    compute_s = shape.flops(n, kv) / (chip.tflops * 1e12 * COMPUTE_EFFICIENCY)
    memory_s = shape.bytes(n, kv, bytes_per_value) / (chip.bandwidth_gbs * 1e9 * BANDWIDTH_EFFICIENCY)
    return overhead_ms + 1000 * max(compute_s, memory_s)


def roofline_batch_ms(shape: ModelShape, chip: Chip, batch: int, w: int, kv: int, bytes_per_value: int,
                      overhead_ms: float) -> float:
    """roofline_ms of one forward of `batch` rows of w new tokens, each row on its own KV cache of kv tokens: the
    linear layers see batch x w tokens and read the weights once; attention and the KV reads are per row."""
    flops = shape.matmul_flops(batch * w) + batch * shape.attention_flops(w, kv)
    cache = 2 * shape.layers * (kv + w) * shape.kv_heads * shape.head_dim * batch
    memory = shape.bytes(0, 0, bytes_per_value) + cache * bytes_per_value  # weights once, every row's cache
    compute_s = flops / (chip.tflops * 1e12 * COMPUTE_EFFICIENCY)
    memory_s = memory / (chip.bandwidth_gbs * 1e9 * BANDWIDTH_EFFICIENCY)
    return overhead_ms + 1000 * max(compute_s, memory_s)


def estimate_profile(model: str, config, chip_key: str, dtype: str, widths, kv_lengths=DEFAULT_KV_LENGTHS,
                     overhead_ms: float | None = None, batch_sizes=()) -> LatencyProfile:
    """An estimated LatencyProfile of `config` on a preset chip (with L(B, w) for every B > 1 in batch_sizes, at
    the same widths)."""
    chip = CHIPS[chip_key]
    shape = ModelShape.from_config(config)
    overhead = default_overhead_ms(shape) if overhead_ms is None else overhead_ms
    width_bytes = 4 if dtype == "float32" else 2
    curves = {}
    for kv in kv_lengths:
        med = [round(roofline_ms(shape, chip, n, kv, width_bytes, overhead), 4) for n in widths]
        curves[kv] = {"median_ms": med, "p10_ms": med, "p90_ms": med}
    batches = {}
    for b in sorted({b for b in batch_sizes if b > 1}):
        batches[b] = BatchCurve(list(widths), {})
        for kv in kv_lengths:
            med = [round(roofline_batch_ms(shape, chip, b, w, kv, width_bytes, overhead), 4) for w in widths]
            batches[b].curves[kv] = {"median_ms": med, "p10_ms": med, "p90_ms": med}
    meta = {"chip": chip.name, "peak_tflops": chip.tflops, "bandwidth_gbs": chip.bandwidth_gbs,
            "overhead_ms": overhead, "compute_efficiency": COMPUTE_EFFICIENCY,
            "bandwidth_efficiency": BANDWIDTH_EFFICIENCY,
            "method": "roofline: overhead + max(FLOPs / (peak x efficiency), bytes / (bandwidth x efficiency))"}
    return LatencyProfile(model, dtype, chip_key, "estimated", list(widths), curves, meta, batches)


def find_measured(root: Path, slug_hint: str, model: str, dtype: str) -> Path | None:
    """A measured profile of this model and dtype on hardware whose slug contains slug_hint."""
    if not root.exists():
        return None
    for folder in sorted(root.iterdir()):
        candidate = folder / store.profile_name(model, dtype)
        if slug_hint in folder.name and candidate.exists():
            return candidate
    return None


def resolve_profile(gpu: str, model: str, config, dtype: str, local_slug: str, widths,
                    root: Path = store.profiles_dir(), spec: str | None = None, batch_sizes=()) -> LatencyProfile:
    """The latency curve that `--gpu X` means: a profile path, a measured profile of that hardware (always wins),
    else a roofline estimate from the chip preset. `cpu` means this machine's measured CPU profile.
    `model` is the model's file-name key (model_slug); `spec` the model as the user named it (for the advice)."""
    if gpu.endswith((".yaml", ".yml")) or Path(gpu).is_file():
        return load_profile(gpu)
    if gpu == "cpu":
        name = store.profile_name(model, dtype)
        path = root / local_slug / name  # this CPU's own profile only: never another CPU's
        if not path.is_file():
            others = sorted(str(p) for p in root.glob(f"cpu-*/{name}")) if root.exists() else []
            hint = (f" Profiles of other CPUs exist ({', '.join(others)}), but a curve measured elsewhere chooses "
                    "the wrong tree here; pass one as --gpu PATH to borrow it knowingly (labelled borrowed).") \
                if others else ""
            raise SpecbenchError(f"--gpu cpu: no measured profile of {spec or model} ({dtype}) for this CPU "
                                 f"({local_slug}): looked for {path}; run `specbench profile --model "
                                 f"{spec or model} --dtype {dtype} --device cpu` first.{hint}")
        return load_profile(path)
    if gpu not in CHIPS:
        raise SpecbenchError(f"unknown --gpu {gpu!r}: use one of {', '.join(GPU_CHOICES)} or a profile .yaml path")
    measured = find_measured(root, CHIPS[gpu].slug_hint, model, dtype)
    if measured is not None:
        return load_profile(measured)
    overhead = None
    for folder in sorted(root.glob("*")) if root.exists() else []:
        if CHIPS[gpu].slug_hint in folder.name:  # the same chip measured with another model: reuse its overhead
            for other in folder.glob("*.yaml"):
                overhead = load_profile(other).meta.get("overhead_ms")
                break
    return estimate_profile(model, config, gpu, dtype, widths, overhead_ms=overhead, batch_sizes=batch_sizes)
