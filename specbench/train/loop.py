"""The optimiser loop `train medusa` and `train hidden-transfer` share: AdamW with a short warm-up and cosine decay,
a progress bar with the running loss, a checkpoint every `save_every` steps, and `--resume` from the last one (only
with the same settings: the settings dict is stored in the checkpoint and compared)."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from pathlib import Path

import torch
from rich.markup import escape

from ..errors import SpecbenchError
from ..progress import console, progress_bar


def optimise(module: torch.nn.Module, step_loss: Callable[[random.Random], torch.Tensor], *, steps: int, lr: float,
             save_every: int, ckpt_path: Path, settings: dict, resume: bool, label: str,
             seed: int = 0) -> tuple[list[float], float]:
    """Train module's parameters on step_loss(rng) for `steps` steps; returns (loss per step, training seconds)."""
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    losses: list[float] = []
    start, train_s = 0, 0.0
    if resume and ckpt_path.exists():
        state = torch.load(ckpt_path, weights_only=False)
        if state["settings"] != settings:
            raise SpecbenchError(f"--resume: {ckpt_path} was made with other settings; use the same options or "
                                 "another --out")
        module.load_state_dict(state["module"])
        opt.load_state_dict(state["optimizer"])
        start, losses, train_s = state["step"], state["losses"], state["train_s"]
        rng.setstate(state["rng"])
        console.print(f"Resuming from step {start} ({escape(str(ckpt_path))})")
    elif ckpt_path.exists():
        console.print(f"[yellow]note[/] {escape(str(ckpt_path))} exists; starting over (pass --resume to continue it)")
    t_loop = time.perf_counter()

    def save_checkpoint(step: int) -> None:
        ckpt_path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"settings": settings, "module": module.state_dict(), "optimizer": opt.state_dict(),
                    "step": step, "losses": losses, "rng": rng.getstate(),
                    "train_s": train_s + time.perf_counter() - t_loop}, ckpt_path)

    warmup = max(1, min(30, steps // 10))
    with progress_bar() as bar:
        task = bar.add_task(label, total=steps, completed=start, info="")
        for step in range(start, steps):
            scale = (step + 1) / warmup if step < warmup else 0.5 * (1 + math.cos(math.pi * step / steps))
            for group in opt.param_groups:
                group["lr"] = lr * scale
            opt.zero_grad()
            loss = step_loss(rng)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            losses.append(round(loss.item(), 5))
            bar.update(task, advance=1, info=f"loss {sum(losses[-20:]) / len(losses[-20:]):.3f}")
            if (step + 1) % save_every == 0 or step + 1 == steps:
                save_checkpoint(step + 1)
    return losses, train_s + time.perf_counter() - t_loop


def check_common(steps: int, lr: float, save_every: int) -> None:
    if steps < 1 or save_every < 1:
        raise SpecbenchError("--steps and --save-every must be at least 1")
    if not lr > 0:
        raise SpecbenchError(f"--lr must be positive (got {lr})")
