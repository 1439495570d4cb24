"""Each trainer's config: its settings and, in the same fields, its `specbench train` command's options
(settings.option: help text, flag, default as shown). cli/train.py makes one command per class of CONFIGS (the
classes the families' declarations name, specbench/families/); the family's training module (`trainer`) reads the
config. They live here, outside specbench.methods, because importing
that package loads every method (and torch), and `specbench train X --help` must stay light.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import families
from ..errors import BadValue
from .settings import TrainSettings, option

VOCAB_TOP_HELP = "most frequent tokens of the data (cheaper {what}; verification stays exact)."


@dataclass(frozen=True)
class PPDConfig(TrainSettings):
    """Train PPD's prompt tokens (only their embeddings train; the model is frozen)."""

    command = "ppd"
    trainer = "specbench.methods.ppd.training"
    options = ("model", "prompt_tokens", "ept", "data", "steps", "out", "dtype", "device", "device_map", "max_memory",
               "lr", "alpha", "insertions", "prompts", "held_out", "new_tokens", "save_every", "resume", "seed",
               "data_file", "eval_prompts", "dry_run")

    model: str = option("smollm2-135m", "Model spec (the prompt tokens are trained for it).")
    prompt_tokens: int = option(3, "S: prompt tokens (token distances predicted).")
    ept: int = option(1, "Ensemble prompt tokens per prompt token.")
    data: str = option("alpaca-eval", shown=True)
    steps: int = option(450, "Optimiser steps (one sequence each).")
    lr: float = option(0.01, "Peak learning rate (cosine decay).")  # no warm-up (PPD §5)
    dtype: str = option("auto", "auto (float32 on CPU: bf16 backward is slow there), float32, bfloat16")
    alpha: float = option(0.8, "Loss decay over prompt tokens.")
    insertions: int = option(64, "Random insertion points per sequence per step.")
    # None: what the steps use (training.auto_prompts)
    prompts: int | None = option(None, "Training prompts per --dataset source, after the held-out ones "
                                 "(self-distilling them is the slow part on a CPU).", shown="one per step, at most 300")
    held_out: int = option(100, "First prompts left out for `specbench estimate`.")
    new_tokens: int = option(96, "Self-distilled continuation length.")
    save_every: int = 50
    seed: int = option(0, "Data order, insertion points, initial tokens.")

    @property
    def out_dir(self) -> Path:
        return self.artifact_out(self.command)  # where ppd / estimate look


@dataclass(frozen=True)
class DrafterConfig(TrainSettings):
    """Train a small drafter for sd / pearl that shares the target's tokenizer, embeddings and LM head."""

    command = "drafter"
    trainer = "specbench.methods.sd.training"
    options = ("model", "layers", "vocab_top", "data", "steps", "batch", "out", "dtype", "device", "device_map",
               "max_memory", "lr", "topk", "prompts", "held_out", "new_tokens", "save_every", "resume", "seed",
               "data_file", "dry_run")

    layers: int = option(2, "L: decoder layers of the drafter (initialised from the target's first and last "
                         "layers).")
    vocab_top: int | None = option(None, "K: score only the K " + VOCAB_TOP_HELP.format(what="drafts"),
                                   shown="the full vocabulary")
    steps: int = 1500  # optimiser steps of `batch` sequences each
    batch: int = option(4, "Sequences per step.", flag="--sequences")  # the field's name is in older checkpoints
    lr: float = 5e-4  # AdamW, 30 warm-up steps then cosine decay
    topk: int = option(32, "Teacher probabilities kept per position.")
    prompts: int = option(300, "Training prompts (after the held-out ones).")
    held_out: int = option(100, "First prompts left out (the agreement check uses them).")
    new_tokens: int = option(96, "Self-distilled continuation length.")
    # held-out prompts of the agreement check: no option, and part of the settings a checkpoint records
    eval_prompts: int = option(20, cli=False, resumable=False)

    @property
    def out_dir(self) -> Path:
        return self.artifact_out("drafter")


@dataclass(frozen=True)
class MedusaConfig(TrainSettings):
    """Train Medusa-1 heads for `medusa` / `medusa-typical` (the target stays frozen; its LM head is shared)."""

    command = "medusa"
    trainer = "specbench.methods.medusa.training"
    options = ("model", "heads", "layer", "vocab_top", "data", "steps", "positions", "lr", "prompts", "held_out",
               "new_tokens", "out", "dtype", "device", "device_map", "max_memory", "save_every", "resume", "seed",
               "data_file", "eval_prompts", "dry_run")

    model: str = option("smollm2-135m", "Target model spec (the heads are trained for it).")
    heads: int = option(3, "K: heads, guessing the tokens 2..K+1 positions ahead.")
    # None: the last layer (Medusa); l < L: early-exit heads on the state after l layers
    layer: int | None = option(None, "Layer whose state the heads read; a middle layer trains early-exit heads, "
                               "written to artifacts/<model>/early-exit-l<layer>.", shown="the last (Medusa)")
    vocab_top: int | None = option(None, "Restrict the heads to the K " + VOCAB_TOP_HELP.format(what="heads"),
                                   shown="the full vocabulary")
    steps: int = 400
    positions: int = option(128, "Random positions per step.")
    prompts: int = 120

    def folder(self, layers: int) -> str:
        return self.command if self.layer in (None, layers) else f"early-exit-l{self.layer}"

    def out_dir(self, layers: int) -> Path:
        return self.artifact_out(self.folder(layers))


def transfer_layers(text: str | None) -> tuple[int, ...] | None:
    """--transfer-layers 12,17,22 as the field's tuple (None: the default choice); errors worded as cli/parse.py's
    for every list option (not imported: train/ sits below cli/)."""
    if not text:
        return None
    try:
        layers = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise BadValue(f"--transfer-layers: expected comma-separated integers, got {text!r}") from None
    if not layers:
        raise BadValue("--transfer-layers: give at least one value")
    return layers


@dataclass(frozen=True)
class TransferConfig(TrainSettings):
    """Train Hidden Transfer's projections for `hidden-transfer` (only the k linear maps train)."""

    command = "hidden-transfer"
    trainer = "specbench.methods.hidden_transfer.training"
    options = ("model", "transfer_layers", "data", "steps", "insertions", "lr", "prompts", "held_out", "new_tokens",
               "out", "dtype", "device", "device_map", "max_memory", "save_every", "resume", "seed", "data_file",
               "masked", "eval_prompts", "dry_run")

    model: str = option("smollm2-135m", "Target model spec (the projections are trained for it).")
    # None: hidden_transfer.training.default_layers(L, 3, model)
    transfer_layers: tuple[int, ...] | None = option(
        None, "Strictly increasing layers l_1,l_2,... in 1..L-1, one per transfer step (the paper's choice: from 40% "
              "of the depth, 1/6 of it apart).", metavar="L[,L...]", cli_type=str, convert=transfer_layers,
        shown="the measured choice where one exists (12,17,22 for smollm2-135m), else the paper's scaled to the depth")
    steps: int = option(800, "Optimiser steps (one sequence each; 800 is about two passes over the default data).")
    insertions: int = option(32, "Insertion points per sequence per step.")
    prompts: int = 120
    save_every: int = 50
    seed: int = option(0, "Data order and insertion points.")
    # the paper's "Masked" ablation: pseudo positions do not see each other
    masked: bool = option(False, "The paper's Masked ablation: pseudo positions do not see each other. For accuracy "
                          "comparisons (estimate, benchmarks/accuracy_comparison.py); not decodable.", flag="--masked")

    @property
    def out_dir(self) -> Path:
        return self.artifact_out(self.command)


@dataclass(frozen=True)
class FeatureConfig(TrainSettings):
    """The feature drafter's settings, eagle's and parallelspec's (`method`); EagleConfig and ParallelSpecConfig
    are their commands."""

    trainer = "specbench.methods.eagle.training"

    method: str = option("eagle", cli=False)  # eagle | parallelspec
    mask_tokens: int = option(4, "k: [MASK] inputs; one drafter forward drafts k + 1 tokens.")  # parallelspec's k
    # 0 on the command line: the full vocabulary (None here)
    vocab_top: int | None = option(8192, "Restrict the drafter's head to the K " + VOCAB_TOP_HELP.format(what="drafts")
                                   + " 0: the full vocabulary.", cli_type=int, convert=lambda top: top or None)
    steps: int = 1500
    sequences: int = option(4, "Sequences per step.")
    groups: int = option(24, "Parallel groups (an input and its k masks) per sequence.")  # parallelspec
    kl_rows: int = option(192, cli=False)  # predicted positions per sequence the KL term reads (the head costs most)
    noise: float = option(0.1, "Uniform noise on the input features (EAGLE: 0.1).")
    lr: float = 5e-4
    # a trained drafter to go on from (training._starting_drafter; auto: parallelspec from the model's eagle drafter,
    # eagle fresh)
    init: str | None = option("auto", "Start from this eagle drafter folder (auto: the model's trained `eagle` "
                              "drafter when there is one; none: the target's last layer), or go on training a "
                              "parallelspec drafter folder with the same k.")
    prompts: int = 120

    @property
    def k(self) -> int:
        return self.mask_tokens if families.get(self.method).mask_inputs else 0

    def out_dir(self) -> Path:
        return self.artifact_out(self.method)


@dataclass(frozen=True)
class EagleConfig(FeatureConfig):
    """Train the EAGLE-style feature drafter for `eagle` (one decoder layer over the target's hidden states and the
    next token's embedding; the target's embeddings and LM head are shared, frozen)."""

    command = "eagle"
    options = ("model", "init", "vocab_top", "data", "steps", "sequences", "lr", "noise", "prompts", "held_out",
               "new_tokens", "out", "dtype", "device", "device_map", "max_memory", "save_every", "resume", "seed",
               "data_file", "eval_prompts", "dry_run")

    method: str = "eagle"
    mask_tokens: int = option(4, cli=False)  # eagle has no masks (k = 0); kept: its checkpoints record it
    groups: int = option(24, cli=False)
    init: str | None = option("none", "Go on training this eagle drafter folder (a second sitting: a new warm-up "
                              "and cosine over --steps); none: start from the target's last layer.")
    seed: int = option(0, "Data order and noise.")


@dataclass(frozen=True)
class ParallelSpecConfig(FeatureConfig):
    """Train the ParallelSpec drafter for `parallelspec`: the feature drafter with k trained [MASK] inputs, by
    group-wise parallel training (ParallelSpec §4.1, Figure 3)."""

    command = "parallelspec"
    options = ("model", "mask_tokens", "init", "vocab_top", "data", "steps", "sequences", "groups", "lr", "noise",
               "prompts", "held_out", "new_tokens", "out", "dtype", "device", "device_map", "max_memory",
               "save_every", "resume", "seed", "data_file", "eval_prompts", "dry_run")

    method: str = "parallelspec"
    seed: int = option(0, "Data order, groups and noise.")


@dataclass(frozen=True)
class Eagle3Config(TrainSettings):
    """Train the EAGLE-3 drafter for `eagle3` (one decoder layer over the target's fused low, middle and high-layer
    states and the next token's embedding, its own head over a reduced draft vocabulary), by training-time test."""

    command = "eagle3"
    trainer = "specbench.methods.eagle3.training"
    options = ("model", "init", "vocab_top", "ttt_steps", "columns", "data", "steps", "sequences", "lr", "prompts",
               "held_out", "new_tokens", "out", "dtype", "device", "device_map", "max_memory", "save_every", "resume",
               "seed", "data_file", "eval_prompts", "dry_run")

    vocab_top: int = option(8192, "Draft vocabulary: the K " + VOCAB_TOP_HELP.format(what="drafts")
                            + " 0: the full vocabulary.")
    ttt_steps: int = option(6, "Training-time test: the drafter's unrolled steps, each fed its own previous "
                            "outputs (EAGLE-3: 7; here as deep as the trees draft).")
    columns: int = option(64, "Positions per sequence unrolled past the first step (every position trains the "
                          "first step).")
    steps: int = 1500
    sequences: int = option(4, "Sequences per step.")
    lr: float = 5e-4
    init: str | None = option("none", "Go on training this EAGLE-3 drafter folder (a second sitting: a new warm-up "
                              "and cosine over --steps, its draft vocabulary kept); none: start from the target's "
                              "last layer.")

    def out_dir(self) -> Path:
        return self.artifact_out(self.command)


# one `specbench train` command each: the config each family's declaration names, in the registry's order
CONFIGS = tuple(families.load(family.train_config) for family in families.trained())

