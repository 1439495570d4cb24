"""The one optimiser loop every trainer uses: AdamW (no weight decay) with an optional short warm-up and cosine decay,
optional gradient clipping, a progress bar with the running loss, a checkpoint every `save_every` steps, and
`--resume` from the last one (only with the same settings: the settings dict is stored in the checkpoint and
compared)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.markup import escape

from ..core.machine.timing import now, since
from ..errors import SpecbenchError
from ..progress import console, progress_bar


@dataclass
class CheckpointState:
    """How the trained weights enter and leave a checkpoint. The default stores module.state_dict() under "module";
    a trainer with another format (PPD: "embeddings", plus its initial token ids) gives its own functions.
    weights() and extra() are merged into the checkpoint (extra just before "train_s"); restore(state) reads them."""

    weights: Callable[[], dict]
    restore: Callable[[dict], None]
    extra: Callable[[], dict] = field(default=lambda: {})

    @staticmethod
    def of_module(module: torch.nn.Module) -> "CheckpointState":
        return CheckpointState(lambda: {"module": module.state_dict()},
                               lambda state: module.load_state_dict(state["module"]))


def default_warmup(steps: int) -> int:
    """Warm-up steps: a tenth of the run, at least 1 and at most 30."""
    return max(1, min(30, steps // 10))


def optimise(module: torch.nn.Module, update_loss: Callable[[random.Random], torch.Tensor], *, steps: int, lr: float,
             save_every: int, ckpt_path: Path, settings: dict, resume: bool, label: str,
             seed: int = 0, warmup: int | None = None, clip: float | None = 1.0,
             state: CheckpointState | None = None) -> tuple[list[float], float]:
    """Train module's parameters on update_loss(rng) for `steps` steps; returns (loss per step, training seconds).

    warmup: linear warm-up steps before the cosine decay (None: default_warmup(steps); 0: cosine from the first
    step). clip: the gradients' largest total norm (None: no clipping). state: the checkpoint's weight format.
    """
    params = [p for p in module.parameters() if p.requires_grad]
    state = state or CheckpointState.of_module(module)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    losses: list[float] = []
    start, train_s = 0, 0.0
    if resume and ckpt_path.exists():
        saved = torch.load(ckpt_path, weights_only=False)
        if saved["settings"] != settings:
            raise SpecbenchError(f"--resume: {ckpt_path} was made with other settings; use the same options or "
                                 "another --out")
        state.restore(saved)
        opt.load_state_dict(saved["optimizer"])
        start, losses, train_s = saved["step"], saved["losses"], saved["train_s"]
        rng.setstate(saved["rng"])
        console.print(f"Resuming from step {start} ({escape(str(ckpt_path))})")
    elif ckpt_path.exists():
        console.print(f"[yellow]note[/] {escape(str(ckpt_path))} exists; starting over (pass --resume to continue it)")
    t_loop = now()

    def save_checkpoint(step: int) -> None:
        ckpt_path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"settings": settings, **state.weights(), "optimizer": opt.state_dict(),
                    "step": step, "losses": losses, "rng": rng.getstate(), **state.extra(),
                    "train_s": train_s + since(t_loop)}, ckpt_path)

    warmup = default_warmup(steps) if warmup is None else warmup
    with progress_bar() as bar:
        task = bar.add_task(label, total=steps, completed=start, info="")
        for step in range(start, steps):
            scale = (step + 1) / warmup if step < warmup else 0.5 * (1 + math.cos(math.pi * step / steps))
            for group in opt.param_groups:
                group["lr"] = lr * scale
            opt.zero_grad()
            loss = update_loss(rng)
            loss.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(params, clip)
            opt.step()
            losses.append(round(loss.item(), 5))
            bar.update(task, advance=1, info=f"loss {sum(losses[-20:]) / len(losses[-20:]):.3f}")
            if (step + 1) % save_every == 0 or step + 1 == steps:
                save_checkpoint(step + 1)
    return losses, train_s + since(t_loop)
