"""The stages every trainer runs around its own loss, and their order (Recipe, run): load the frozen target,
self-distil the training data, find where the replies start, count the vocabulary (--vocab-top), build the trained
part, optimise it (optimiser.optimise), then describe the run in the artefact's metadata and write its loss curve."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

import torch

from ..core.machine.timing import now, since
from ..core.machine.hardware import cpu_model, device_name, hardware_slug
from ..core.model.load import LoadedModel, dtype_name, load_model
from ..errors import SpecbenchError
from .settings import TrainSettings
from .optimiser import optimise
from .plot import plot_losses
from .selfdistill import SLOTS, SourceData, training_data

Sequences = list[tuple[list[int], int]]  # (prompt + greedy reply token ids, prompt length) per sequence


# ---------------------------------------------------------------------------------------------- before training


def load_target(cfg: TrainSettings, prompts: int | None = None) -> LoadedModel:
    """The target model, frozen (only the method's own parts train); its fit check counts the training
    (memory_need.train_workload: the trained part's optimiser state, cached features, a sequence's forward)."""
    from ..core.model.memory_need import stated_workload
    from ..core.model.placement import build_placement

    with stated_workload(training_workload(cfg, prompts)):
        target = load_model(cfg.model, cfg.dtype, cfg.device,
                            placement=build_placement(cfg.device_map, cfg.max_memory))
    target.model.requires_grad_(False)
    return target


def distilled_sequences(cfg: TrainSettings, prompts: int | None = None) -> int:
    """Sequences a run self-distils: prompts per source (the recipe's, else the config's; PPD's default: one per step,
    at most 300) x sources."""
    per_source = prompts if prompts is not None else cfg.prompts
    if per_source is None:
        per_source = min(cfg.steps, 300)
    return per_source * len([s for s in cfg.data.split(",") if s.strip()])


def training_workload(cfg: TrainSettings, prompts: int | None = None):
    """The training's workload for the fit check, or the default where the target's config cannot be read before
    it loads (then the load itself says what is wrong)."""
    from ..core.model.load import model_config, resolve_device, resolve_dtype
    from ..core.model.memory_need import Workload, train_workload

    try:
        config = model_config(cfg.model)
        dtype = resolve_dtype(cfg.dtype, resolve_device(cfg.device))
    except Exception:  # a hub id offline, a bad spec: the load refuses it with its own message
        return Workload()
    return train_workload(cfg.command, cfg, config, dtype, distilled_sequences(cfg, prompts))


def self_distilled(cfg: TrainSettings, target: LoadedModel, min_reply: int,
                   prompts: int | None = None) -> tuple[Sequences, dict]:
    """(the target's greedy replies to prompts held_out.. of each --dataset source (cached per source), the metadata's
    `data` entry describing them: data_facts)."""
    sources = training_data(target, cfg.data, cfg.held_out, cfg.prompts if prompts is None else prompts,
                            cfg.new_tokens, cfg.data_file, min_reply=min_reply)
    return [seq for s in sources for seq in s.sequences], data_facts(cfg, sources)


def reply_start(seqs: Sequences) -> int:
    """The first position worth training on: after the prefix every sequence shares (the chat template's system
    text teaches nothing), and no later than the earliest reply's first prediction."""
    return min(len(os.path.commonprefix([s for s, _ in seqs])), min(first for _, first in seqs) - 1)


def token_counts(seqs: Sequences, vocab_size: int, start: int | None = None) -> torch.Tensor:
    """Occurrences [V] of each token id from position `start` of every sequence (None: from its reply)."""
    return torch.bincount(torch.tensor([t for s, n in seqs for t in s[n if start is None else start:]]),
                          minlength=vocab_size)


def check_vocab_top(top: int, vocab_size: int) -> None:
    if not 1 <= top <= vocab_size:
        raise SpecbenchError(f"--vocab-top must be between 1 and the vocabulary size {vocab_size}")


def frequent_tokens(seqs: Sequences, vocab_size: int, start: int, top: int) -> torch.Tensor:
    """The `top` most frequent token ids of the data from `start` on, sorted [K] (a restricted head's vocabulary)."""
    return token_counts(seqs, vocab_size, start).topk(top).indices.sort().values


# ------------------------------------------------------------------------------------------------------ training


def fit(cfg: TrainSettings, module: torch.nn.Module, update_loss, out: Path, label: str,
        settings: dict | None = None, **loop_options) -> tuple[list[float], float]:
    """optimiser.optimise with the run's shared settings (steps, lr, checkpoints in `out`, --resume, seed); settings:
    what a resumed checkpoint must match (default cfg.settings()); loop_options: warmup, clip, state."""
    return optimise(module, update_loss, steps=cfg.steps, lr=cfg.lr, save_every=cfg.save_every,
                    ckpt_path=checkpoint_path(out), settings=cfg.settings() if settings is None else settings,
                    resume=cfg.resume, label=label, seed=cfg.seed, **loop_options)


# ----------------------------------------------------------------------------------------------- after training


def data_facts(cfg: TrainSettings, sources: list[SourceData]) -> dict:
    """The metadata's `data` entry: the mix, each source's prompt range (less prompts dropped for holding a
    benchmark prompt) and sequences, what was held out, and whether the prompts are disjoint from every benchmark
    set (data/disjoint.py, checked here on the prompts trained on)."""
    from ..data import disjoint

    seqs = [seq for s in sources for seq in s.sequences]
    per_source = {}
    for s in sources:
        entry = {"prompts": s.span, "sequences": len(s.sequences)}
        if s.dropped:
            entry["dropped"] = {"prompts": list(s.dropped), "why": "they contain a benchmark prompt"}
        per_source[s.name] = entry
    return {
        "name": cfg.data_file or cfg.data, "sources": per_source,
        "held_out": f"prompts 0..{cfg.held_out - 1} of each source (top1_heldout reads the first of them)"
        if cfg.held_out else "none",
        "sequences": len(seqs), "tokens": sum(len(s) for s, _ in seqs),
        "continuation": f"greedy, up to {cfg.new_tokens} tokens (unpadded batch engine, {SLOTS} slots, refill)",
        "disjoint": disjoint.check({s.name: s.prompts for s in sources}).statement(),
    }


def hardware(target: LoadedModel) -> str:
    return device_name(target.device) if target.device.type == "cuda" else cpu_model()


def final_loss(losses: list[float]) -> float:
    """The mean of the last 50 losses (one step's loss is noisy)."""
    tail = losses[-50:]
    return round(sum(tail) / max(len(tail), 1), 4)


def run_facts(target: LoadedModel, losses: list[float], train_s: float, data_s: float, seed: int) -> dict:
    """The metadata every artefact ends with: losses, times, dtype, machine (its name and hardware key: the times are
    this machine's), seed, date (in this order)."""
    return {
        "initial_loss": losses[0] if losses else None, "final_loss": final_loss(losses),
        "train_seconds": round(train_s, 1), "data_seconds": round(data_s, 1), "dtype": dtype_name(target.dtype),
        "hardware": hardware(target), "hardware_key": hardware_slug(target.device),  # profiles/ and trees/ key
        "threads": torch.get_num_threads(), "seed": seed,
        "date": time.strftime("%Y-%m-%d"),
    }


def insert_after(meta: dict, key: str, extra: dict) -> dict:
    """meta with `extra`'s entries placed right after `key` (metadata files keep a fixed field order)."""
    out = {}
    for k, v in meta.items():
        out[k] = v
        if k == key:
            out.update(extra)
    return out


def checkpoint_path(out: Path, name: str = "state.pt") -> Path:
    """<out>/checkpoint/<name>: the optimiser's state (state.pt) and caches a trainer keeps between runs."""
    return out / "checkpoint" / name


def write_loss_curve(out: Path, losses: list[float], title: str, ylabel: str) -> None:
    """loss.png next to the artefact, and a .gitignore that keeps its checkpoints out of git."""
    plot_losses(losses, out / "loss.png", title, ylabel)
    (out / ".gitignore").write_text("checkpoint/\n")


# ------------------------------------------------------------------------------------------- the one recipe


class Recipe:
    """One trainer's own parts, which `run` calls in the order every trainer shares. Between the calls the run
    sets `target` (the frozen model, after check) and `seqs` (the self-distilled data, after before_data); a part
    keeps what later parts need on self."""

    label = "training"  # the progress bar's
    target: LoadedModel
    seqs: Sequences

    def __init__(self, cfg: TrainSettings):
        self.cfg = cfg
        self.prompts: int | None = None  # training prompts per source; None: the config's

    def check(self) -> None:
        """Refuse settings no run can use, before any slow work."""
        self.cfg.check_common()

    def before_data(self) -> None:
        """What needs the target but not the data (a layer choice, a plan)."""

    def min_reply(self) -> int:
        """The shortest self-distilled reply worth training on."""
        return 2

    def prepare(self) -> None:
        """Data-derived inputs (reply start, vocabulary, teacher outputs): counted as data time."""

    def build(self) -> torch.nn.Module:
        """The module whose trainable parameters the loop trains."""
        raise NotImplementedError

    def out(self) -> Path:
        return self.cfg.out_dir

    def settings(self) -> dict:
        """What a resumed checkpoint must match."""
        return self.cfg.settings()

    def loop_options(self) -> dict:
        """optimiser.optimise's warmup, clip, state where the trainer's differ from the defaults."""
        return {}

    def update_loss(self, module: torch.nn.Module) -> Callable[[Any], torch.Tensor]:
        raise NotImplementedError

    def agreement(self, module: torch.nn.Module) -> Any:
        """Top-1 agreement on a training sample, before and after training (None: the trainer measures none)."""
        return None

    def meta(self, module: torch.nn.Module, data: dict, before: Any, after: Any, facts: dict) -> dict:
        """The artefact's metadata: the trainer's entries, data (data_facts) and facts (run_facts) placed in them."""
        raise NotImplementedError

    def save(self, module: torch.nn.Module, out: Path, meta: dict) -> None:
        raise NotImplementedError

    def curve(self) -> tuple[str, str]:
        """The loss curve's title and y label."""
        raise NotImplementedError


def run(recipe: Recipe) -> Path:
    """Train with the recipe's parts, in the order every trainer shares; returns the artefact's folder."""
    cfg = recipe.cfg
    recipe.check()
    t_start = now()
    recipe.target = load_target(cfg, recipe.prompts)
    recipe.before_data()
    recipe.seqs, data = self_distilled(cfg, recipe.target, min_reply=recipe.min_reply(), prompts=recipe.prompts)
    recipe.prepare()
    data_s = since(t_start)
    module = recipe.build()
    out = recipe.out()
    before = recipe.agreement(module)
    losses, train_s = fit(cfg, module, recipe.update_loss(module), out, recipe.label, recipe.settings(),
                          **recipe.loop_options())
    module.requires_grad_(False)
    after = recipe.agreement(module)
    facts = run_facts(recipe.target, losses, train_s, data_s, cfg.seed)
    recipe.save(module, out, recipe.meta(module, data, before, after, facts))
    write_loss_curve(out, losses, *recipe.curve())
    return out
