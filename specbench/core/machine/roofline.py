"""The bytes a decoding forward reads and run.yaml's `roofline:` block: what bounds a forward that only
reads its weights and KV cache once (the formulas and the report's use of them: report/roofline.py)."""

from __future__ import annotations

WIDTH_UP_TO = 16  # the widest profiled width the verdict compares with L(1)


# ---------------------------------------------------------------------------------------------- bytes of a model

def dtype_bytes(dtype) -> int:
    import torch

    return torch.empty((), dtype=dtype).element_size()


def weight_bytes(model) -> int:
    """Bytes a forward reads of the weights: every parameter once, but the input embedding table unless it is the LM
    head too (tied)."""
    params = {id(p): p for p in model.parameters()}  # tied parameters once
    total = sum(p.numel() * p.element_size() for p in params.values())
    embed = getattr(model, "get_input_embeddings", lambda: None)()
    head = getattr(model, "get_output_embeddings", lambda: None)()
    table = getattr(embed, "weight", None)
    if table is not None and table is not getattr(head, "weight", None) and id(table) in params:
        total -= table.numel() * table.element_size()
    return int(total)


def kv_bytes_per_token(config, dtype) -> int:
    """Bytes of K and V per context position over every layer (what a forward reads of its cache per token)."""
    text = getattr(config, "get_text_config", lambda: config)()
    heads = getattr(text, "num_attention_heads", 0) or 0
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or (text.hidden_size // heads if heads else 0)
    return int(text.num_hidden_layers * 2 * kv_heads * head_dim * dtype_bytes(dtype))


def floor_s(block: dict, context: float) -> float:
    """Seconds of one forward at `context` if it only read its bytes: (weights + KV) / bandwidth."""
    return (block["weight_bytes"] + block["kv_bytes_per_token"] * context) / (block["bandwidth_gb_s"] * 1e9)


# ------------------------------------------------------------------------------------------ run.yaml's block

def run_block(target, bw, context: float, profile=None) -> dict:
    """run.yaml's `roofline:` block: the bandwidth and where it came from, the bytes, the bound at the run's mean
    context (prompt + half the new tokens, `context_tokens`), and L(1), L(k) of this hardware's profile there."""
    block = {"bandwidth_gb_s": bw.gb_s, "bandwidth_source": bw.source, "bandwidth_measured_at": bw.measured_at,
             "bandwidth_copy_gb_s": bw.copy_gb_s, "bandwidth_read_gb_s": bw.read_gb_s,
             "bandwidth_kernel_gb_s": bw.kernel_gb_s,
             "weight_bytes": weight_bytes(target.model),
             "kv_bytes_per_token": kv_bytes_per_token(target.model.config, target.dtype),
             "context_tokens": int(round(context))}
    block["kv_bytes"] = block["kv_bytes_per_token"] * block["context_tokens"]
    floor = floor_s(block, context)
    block["bound_ms"] = round(floor * 1e3, 4)
    block["bound_tok_s"] = round(1 / floor, 2)
    block.update(profile_points(profile, context))
    if block.get("profile"):  # which chip measured it, beside this one's: a key covers several (Zen 4 and Zen 5 EPYCs)
        from .hardware import hardware_identity  # (lazily, as this module's torch: hardware imports it)

        block.update(profile_chip=chip(profile.identity), chip=chip(hardware_identity(target.device)))
    return block


def chip(identity: dict | None) -> str:
    """A chip's short name from a hardware identity: 'AMD EPYC (family 26, model 2)' for a CPU, the GPU's name; ''
    without one (an estimated profile)."""
    if not isinstance(identity, dict):
        return ""
    if identity.get("kind") == "cpu" and identity.get("family") is not None:
        return f"{identity.get('name', 'CPU')} (family {identity['family']}, model {identity.get('model')})"
    return str(identity.get("name", ""))


def profile_points(profile, context: float) -> dict:
    """{profile_kv_length, profile_width, profile_l1_ms, profile_lk_ms} from a latency profile (empty without)."""
    if profile is None or not profile.widths:
        return {}
    kv = min(profile.curves, key=lambda k: abs(k - context))
    wide = [w for w in profile.widths if 1 < w <= WIDTH_UP_TO]
    if not wide or profile.widths[0] != 1:
        return {}
    k = max(wide)
    return {"profile": f"{profile.hardware} {profile.dtype}", "profile_kv_length": int(kv), "profile_width": int(k),
            "profile_l1_ms": round(profile.latency_ms(1, kv), 4), "profile_lk_ms": round(profile.latency_ms(k, kv), 4)}


def mean_context(prompt_lengths: list[int], max_new_tokens: int) -> float:
    """The run's mean context during decoding: mean prompt length + half the new tokens (0 without prompts)."""
    if not prompt_lengths:
        return max_new_tokens / 2
    return sum(prompt_lengths) / len(prompt_lengths) + max_new_tokens / 2


def add_after(meta_path, device) -> None:
    """run.yaml's roofline block gains a second bandwidth reading, taken after the turns (`bandwidth_after_gb_s`,
    its time and source): the report states `ar` against both, since a VM's bandwidth can move by 40% within the
    hour (benchmarks/RESULTS-cpu.md, stop 59). Nothing where the run has no roofline block or its bandwidth was
    given ($SPECBENCH_BANDWIDTH_GB_S); a disturbed reading is kept with its note (the report says so)."""
    import torch
    import yaml

    from . import contention
    from .bandwidth import measure
    from .hardware import hardware_slug

    meta = yaml.safe_load(meta_path.read_text()) or {}
    block = meta.get("roofline")
    if not isinstance(block, dict) or str(block.get("bandwidth_source", "")).startswith("$"):
        return
    device = torch.device(device)
    found, reading = contention.beside(lambda: measure(device, hardware_slug(device)))
    block["bandwidth_after_gb_s"] = found.gb_s
    block["bandwidth_after_measured_at"] = found.measured_at
    block["bandwidth_after_source"] = (contention.not_cached_note(reading) if contention.disturbed(reading)
                                       else "measured now, after the run's turns")
    meta_path.write_text(yaml.safe_dump(meta, sort_keys=False))
