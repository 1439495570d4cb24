"""Random-weight models of real size, built in seconds: the module tree is made without storage (accelerate's
init_empty_weights: parameters on the meta device, buffers such as RoPE's inv_freq computed for real), then every
parameter gets its storage directly in the run's dtype on the run's device and a cheap seeded fill.

Why not transformers' own initialisation: it draws a normal for every weight, far slower than a fill at memory
speed on a real-size model (and a GPU run would first build it on the CPU). Timing and memory depend on shapes, not
values, so the fill tiles one seeded block of normals (a prime length, so no two rows of a matrix start alike) at
memory speed. Norm weights are 1 and biases 0, as transformers initialises them, so activations stay in range.
"""

from __future__ import annotations

import torch

BLOCK = 1_000_003  # prime: a matrix row of any width starts at a different offset of the block
STD = 0.02  # transformers' default initializer_range


def seeded_block(dtype: torch.dtype, device: torch.device, seed: int = 0) -> torch.Tensor:
    """[2 x BLOCK] seeded normals (the block twice: any rotation of it is a slice, no copy)."""
    g = torch.Generator().manual_seed(seed)
    block = torch.randn(BLOCK, generator=g).mul_(STD).to(device=device, dtype=dtype)
    return torch.cat([block, block])


def tile_fill(out: torch.Tensor, block: torch.Tensor, offset: int) -> None:
    """out (any shape, contiguous) <- the block repeated from `offset` on: [full x BLOCK] copies, then the rest."""
    flat = out.view(-1)
    rolled = block[offset:offset + BLOCK]
    full, rest = divmod(flat.numel(), BLOCK)
    if full:
        flat[: full * BLOCK].view(full, BLOCK).copy_(rolled.expand(full, BLOCK))
    if rest:
        flat[full * BLOCK:].copy_(rolled[:rest])


def build_filled(config, dtype: torch.dtype, device: torch.device, attention: str):
    """A causal LM of `config` with every parameter allocated once, in `dtype` on `device` (no float32 copy, nothing
    on the CPU first for a GPU run), filled as the module docstring says; tied weights stay tied."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attention, dtype=dtype)
    block = seeded_block(dtype, device)
    seen: dict[int, torch.nn.Parameter] = {}
    for index, (module_name, module) in enumerate(model.named_modules()):
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            if id(param) in seen:  # a tied weight: the one already made
                module._parameters[name] = seen[id(param)]
                continue
            data = torch.empty(param.shape, dtype=dtype, device=device)
            if param.dim() >= 2:
                tile_fill(data, block, (index * 7919) % BLOCK)  # each module its own offset into the block
            elif name == "bias":
                data.zero_()
            else:  # norm weights
                data.fill_(1.0)
            new = torch.nn.Parameter(data, requires_grad=False)
            seen[id(param)] = new
            module._parameters[name] = new
    for module in model.modules():  # buffers (RoPE's inv_freq) were built for real, on the CPU in float32
        for name, buf in list(module._buffers.items()):
            if buf is not None and buf.device != device:
                module._buffers[name] = buf.to(device)
    model.tie_weights()
    return model
