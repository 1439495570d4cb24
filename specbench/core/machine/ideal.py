"""The hardware's ideal latency of one forward of w new tokens on a KV cache of kv entries: the time it takes only to
read its bytes or only to do its arithmetic, whichever is longer.

    bytes(w, kv) = weight_bytes + kv_bytes_per_token * (kv + w)        (core/machine/roofline.py's bytes: every
                                                                        weight once, the cache read and the w new
                                                                        entries written)
    FLOPs(w, kv) = 2 w * linear_params                                 (a multiply and an add per weight and token:
                                                                        every linear layer, the LM head over all w rows)
                 + 4 * layers * heads * head_dim * (w kv + w (w + 1) / 2)   (scores and their weighted sum: row i of
                                                                        the w sees kv + i + 1 keys)
    ideal(w, kv) = max(bytes / bandwidth, FLOPs / peak)

bandwidth: core/machine/bandwidth.py, measured in the profile's sitting; peak: the faster of a GEMM and the panels
linear at the forward's dtype (core/machine/peak.py), measured once per machine. A measured L(w) over ideal(w) says
how far a forward of that width is from this hardware: a curve whose ratio grows with w spends its width on kernels,
not on the hardware.
"""

from __future__ import annotations

import torch

from .roofline import kv_bytes_per_token, weight_bytes


def linear_params(model) -> int:
    """Weights every token is multiplied by: the 2-D weights of every module but embedding tables (a forward
    gathers rows of those; a head tied to the table is a module of its own and counted there)."""
    total = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, torch.nn.Embedding) or not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            continue
        total += weight.numel()
    return int(total)


def attention_flops_per_key(config) -> int:
    """FLOPs per (query row, visible key) pair over every layer: q.k and the weighted sum of v, 2 x 2 x heads x
    head_dim a layer."""
    text = getattr(config, "get_text_config", lambda: config)()
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return int(4 * text.num_hidden_layers * heads * head_dim)


def forward_flops(linear: int, per_key: int, width: int, kv: int) -> float:
    """FLOPs of one forward of `width` new tokens on `kv` cached entries (module docstring)."""
    return 2.0 * width * linear + per_key * (width * kv + width * (width + 1) / 2)


def forward_bytes(weights: int, per_token: int, width: int, kv: int) -> float:
    return float(weights + per_token * (kv + width))


def block(model, dtype, bandwidth, peak, widths: list[int], curves: dict[int, dict]) -> dict:
    """A profile's `ideal:` entry: the rates and where they came from, the model's bytes and arithmetic, and per KV
    length the ideal ms of every width, the measured median over it, and which bound sets it."""
    weights, per_token = weight_bytes(model), kv_bytes_per_token(model.config, dtype)
    linear, per_key = linear_params(model), attention_flops_per_key(model.config)
    out = {"formula": "max(bytes / bandwidth, FLOPs / peak) per forward",
           "bandwidth_gb_s": bandwidth.gb_s, "bandwidth_source": bandwidth.source,
           "peak_gflops": peak.gflops, "peak_dtype": peak.dtype, "peak_source": peak.source,
           "weight_bytes": weights, "kv_bytes_per_token": per_token, "linear_params": linear,
           "attention_flops_per_key": per_key, "curves": []}
    for kv, curve in sorted(curves.items()):
        ideal, bound = [], []
        for w in widths:
            memory_s = forward_bytes(weights, per_token, w, kv) / (bandwidth.gb_s * 1e9)
            compute_s = forward_flops(linear, per_key, w, kv) / (peak.gflops * 1e9)
            ideal.append(float(f"{1e3 * max(memory_s, compute_s):.6g}"))  # ms, 6 significant digits
            bound.append("bandwidth" if memory_s >= compute_s else "compute")
        ratio = [round(m / i, 3) for m, i in zip(curve["median_ms"], ideal)]
        out["curves"].append({"kv_length": int(kv), "ideal_ms": ideal, "measured_over_ideal": ratio, "bound": bound})
    return out


def of_profile(target, widths: list[int], curves: dict[int, dict]) -> dict:
    """The `ideal:` entry of a profile of `target` (a LoadedModel) on the target's device at its dtype: the bandwidth
    measured in the profile's own sitting, right after its timing (a VM's bandwidth moved 44.8 -> 77.5 GB/s within
    the hour, benchmarks/RESULTS-cpu.md, stop 59: a cached reading from another hour says little about this one),
    the peak measured once per machine (or read from the user cache); a model over several devices gets a note
    instead (one device's rates do not bound it)."""
    from .bandwidth import for_run
    from .peak import peak

    if not str(getattr(target, "placement", "single")).startswith("single"):
        return {"note": f"not computed for placement {target.placement}: one device's rates do not bound it"}
    device = torch.device(target.device)
    bandwidth = for_run(device, moment="right after the profile's timing")
    return block(target.model, target.dtype, bandwidth, peak(device, target.dtype), widths, curves)


def stated(meta: dict) -> dict[int, dict]:
    """KV length -> {ideal_ms, measured_over_ideal, bound} from a profile's meta (written or read back); empty for a
    profile without it (older files, several devices)."""
    entry = meta.get("ideal") if isinstance(meta, dict) else None
    if not isinstance(entry, dict) or not isinstance(entry.get("curves"), list):
        return {}
    return {int(c["kv_length"]): c for c in entry["curves"] if isinstance(c, dict) and "kv_length" in c
            and isinstance(c.get("ideal_ms"), list) and isinstance(c.get("measured_over_ideal"), list)}
