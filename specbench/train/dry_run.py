"""`specbench train METHOD --dry-run`: the trainer's own stages (load the target, prepare, build, optimise) on random
token sequences for a few optimiser steps, timed and with their peak memory, then the full recipe's cost projected
from them: self-distillation (from the target's forward costs), preparation (cached features, scaled to the full
data) and the optimiser steps. Nothing is written. What a user learns before spending hours: does it fit, how long.

The projection is arithmetic on this machine's measurements: steps x the median step; the preparation measured on
DRY_SEQUENCES sequences, scaled by the full recipe's count (its memory too: cached features grow with the data);
self-distillation from selfdistill.generation_seconds (an upper bound: replies that stop early are cheaper).
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, fields, replace

import torch
from rich.markup import escape
from rich.table import Table

from ..core.machine.memory import peak_mb, reset_peak
from ..core.machine.timing import now, since
from ..progress import console, out
from .settings import TrainSettings
from .recipe import Recipe, load_target, distilled_sequences

DRY_SEQUENCES = 8  # random sequences the dry run prepares (the full recipe's count is projected from them)
PROMPT_TOKENS = 64  # a rendered chat prompt's length, as the dry run's random sequences have it
GIB = 2**30


@dataclass
class DryRun:
    """What the dry run measured and what it projects for the full recipe (seconds, MiB)."""

    load_s: float
    load_peak_mb: float
    prepare_s: float
    prepare_mb: float
    update_s: list[float]
    peak_mb: float
    sequences: int  # the full recipe's self-distilled sequences
    full_steps: int
    data_s: float  # projected self-distillation of the full recipe
    target: str = ""  # the target as loaded: spec, dtype, device

    @property
    def per_update(self) -> float:
        later = self.update_s[1:] or self.update_s  # the first step allocates the optimiser's state
        return statistics.median(later)

    @property
    def scale(self) -> float:
        return self.sequences / DRY_SEQUENCES

    def projected_peak_mb(self) -> float:
        return self.peak_mb + max(self.prepare_mb, 0.0) * (self.scale - 1)


def full_sequences(cfg: TrainSettings, recipe: Recipe) -> int:
    """Sequences the full recipe self-distils (recipe.distilled_sequences at the command's default --steps)."""
    return distilled_sequences(replace(cfg, steps=default_of(cfg, "steps")), recipe.prompts)


def default_of(cfg: TrainSettings, name: str):
    return next(f.default for f in fields(cfg) if f.name == name)


def random_sequences(target, count: int, reply: int, seed: int = 0) -> list[tuple[list[int], int]]:
    """`count` (prompt + reply, prompt length) sequences of random token ids: a shared 16-token prefix (the chat
    template's system text, which reply_start skips) then random ids below min(vocab, 32000)."""
    rng = random.Random(seed)
    vocab = min(target.vocab_size, 32000)
    prefix = [rng.randrange(vocab) for _ in range(16)]
    return [(prefix + [rng.randrange(vocab) for _ in range(PROMPT_TOKENS - 16 + reply)], PROMPT_TOKENS)
            for _ in range(count)]


def dry_run(recipe: Recipe, steps: int) -> DryRun:
    """Run the recipe's stages on random data for `steps` optimiser steps (AdamW, as optimiser.optimise: the same
    state and gradients), measuring each; nothing is saved."""
    from .selfdistill import forward_costs, generation_seconds

    cfg = recipe.cfg
    recipe.check()
    device = torch.device("cuda" if cfg.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if cfg.device == "auto" else cfg.device))
    reset_peak(device)
    t = now()
    recipe.target = load_target(replace(cfg, steps=default_of(cfg, "steps")), recipe.prompts)  # the full run's check
    load_s, load_peak = since(t), peak_mb(recipe.target.device)
    device = recipe.target.device
    full_steps = default_of(cfg, "steps")
    recipe.cfg = replace(cfg, steps=full_steps)  # the plan (prompts per source) of the full recipe, not the dry one's
    recipe.before_data()
    recipe.cfg = cfg
    sequences = full_sequences(cfg, recipe)
    data_s = generation_seconds(recipe.target, [[0] * PROMPT_TOKENS] * sequences, cfg.new_tokens,
                                costs=forward_costs(recipe.target))
    recipe.seqs = random_sequences(recipe.target, DRY_SEQUENCES, max(cfg.new_tokens, recipe.min_reply() + 1))
    before = _resident_mb(device)
    t = now()
    recipe.prepare()
    prepare_s, prepare_mb = since(t), _resident_mb(device) - before
    module = recipe.build()
    update_loss = recipe.update_loss(module)
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    rng = random.Random(cfg.seed)
    times = []
    for _ in range(steps):
        t = now()
        opt.zero_grad()
        loss = update_loss(rng)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        loss.item()
        times.append(since(t))
    said = f"{recipe.target.spec} ({str(recipe.target.dtype).removeprefix('torch.')}, {device})"
    return DryRun(load_s, load_peak, prepare_s, prepare_mb, times, peak_mb(device), sequences, full_steps, data_s,
                  said)


def _resident_mb(device: torch.device) -> float:
    """Memory held now: allocated on CUDA, RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / 2**20
    from pathlib import Path

    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def report(command: str, cfg: TrainSettings, result: DryRun) -> None:
    """The dry run's table: measured, then projected for the full recipe."""
    table = Table(title=f"train {command} --dry-run: {result.target}, {len(result.update_s)} steps on random data")
    for name in ("", "time", "peak memory", "how"):
        table.add_column(name, justify="right" if name in ("time", "peak memory") else "left")
    table.add_row("load the target", _duration(result.load_s), f"{result.load_peak_mb / 1024:.2f} GiB", "measured")
    table.add_row(f"prepare ({DRY_SEQUENCES} sequences)", _duration(result.prepare_s),
                  f"+{max(result.prepare_mb, 0) / 1024:.2f} GiB", "measured (cached features, teacher outputs)")
    table.add_row("one optimiser step", _duration(result.per_update), f"{result.peak_mb / 1024:.2f} GiB",
                  f"measured: median of steps {'2..' if len(result.update_s) > 1 else '1..'}{len(result.update_s)}")
    table.add_section()
    table.add_row(f"self-distil {result.sequences} prompts", _duration(result.data_s), "",
                  f"projected: {cfg.new_tokens} new tokens each, from the target's forward costs (upper bound)")
    table.add_row(f"prepare {result.sequences} sequences", _duration(result.prepare_s * result.scale),
                  f"+{max(result.prepare_mb, 0) * result.scale / 1024:.2f} GiB", f"projected: x{result.scale:.0f}")
    train_s = result.per_update * result.full_steps
    table.add_row(f"{result.full_steps} optimiser steps", _duration(train_s), "",
                  f"projected: {result.full_steps} x {result.per_update:.3f} s")
    total = result.load_s + result.data_s + result.prepare_s * result.scale + train_s
    table.add_row("[bold]the full recipe[/]", f"[bold]{_duration(total)}[/]",
                  f"[bold]{result.projected_peak_mb() / 1024:.2f} GiB[/]", "projected peak: the step's + the "
                  "features of the full data")
    out.print(table)
    console.print(f"[dim]--dry-run: nothing was written. The full recipe's {result.full_steps} steps are `train "
                  f"{escape(command)}`'s default (--steps sets the dry run's own). Timings are this machine's, on "
                  "random weights and data where the target is random.[/]")


def recipe_class(trainer: str) -> type[Recipe]:
    """The Recipe subclass a trainer module defines (each defines one; its train(cfg) is run(ThatRecipe(cfg)))."""
    import importlib
    import inspect

    module = importlib.import_module(trainer)
    found = [obj for obj in vars(module).values() if inspect.isclass(obj) and issubclass(obj, Recipe)
             and obj.__module__ == module.__name__]
    if len(found) != 1:
        raise TypeError(f"{trainer} defines {len(found)} Recipe classes; the dry run needs exactly one")
    return found[0]


def run_dry(cls, cfg: TrainSettings, steps: int) -> DryRun:
    """Dry-run the recipe of `cls` (a config class of train/configs.py) for `steps` optimiser steps."""
    return dry_run(recipe_class(cls.trainer)(replace(cfg, steps=max(steps, 1))), steps)
