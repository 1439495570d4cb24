"""`specbench train ...`: one command per learned artefact (prompt tokens, drafters, heads, projections)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from ..progress import console
from .app import train_app
from .parse import int_list
from .placement_options import DeviceMap, MaxMemory, target_placement
from .train_eval import EvalPrompts, evaluate

# ------------------------------------------------------------------ options every train command shares (same help)

Device = Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:<i>")]
DType = Annotated[str, typer.Option(help="auto, float32, bfloat16")]
Mix = Annotated[Optional[str], typer.Option(
    "--dataset", show_default="the training mix: alpaca-eval and the training-only sources",
    help="Prompts to self-distil, comma-separated: datasets, files, or the training-only sources (`specbench list "
         "datasets`).")]
Steps = Annotated[int, typer.Option(help="Optimiser steps.")]
PeakLR = Annotated[float, typer.Option(help="Peak learning rate (warm-up, then cosine decay).")]
PromptsPerSource = Annotated[int, typer.Option(help="Training prompts per source (after the held-out ones).")]
HeldOut = Annotated[int, typer.Option(help="First prompts of each source left out.")]
ReplyLength = Annotated[int, typer.Option("--max-new-tokens", help="Self-distilled reply length.")]
ContinuationLength = Annotated[int, typer.Option("--max-new-tokens", help="Self-distilled continuation length.")]
SaveEvery = Annotated[int, typer.Option(help="Checkpoint every N steps.")]
Resume = Annotated[bool, typer.Option(help="Continue from the checkpoint in --out.")]
DataFile = Annotated[Optional[str], typer.Option(show_default="the set's own", help="Read the one named --dataset "
                                                 "from this file.")]


def _model(trained: str):
    return Annotated[str, typer.Option(help=f"Target model spec (the {trained} trained for it).")]


def _out(folder: str):
    return Annotated[Optional[Path], typer.Option(show_default=f"artifacts/<model>/{folder}", help="Artefact folder.")]


def _seed(what: str):
    return Annotated[int, typer.Option(help=what)]


PPDOut = _out("ppd")
DrafterModel = _model("drafter is")


def _config(cls, options: dict, **overrides):
    """A trainer's config from a command's options (named as the config's fields), with `overrides` on top; a
    --dataset left out leaves the config's own default (the training mix) in place."""
    names = {f.name for f in fields(cls)} - ({"data"} if options.get("data") is None else set())
    return cls(**({k: v for k, v in options.items() if k in names} | overrides))


@train_app.command("ppd")
def train_ppd(
    model: Annotated[str, typer.Option(help="Model spec (the prompt tokens are trained for it).")] = "smollm2-135m",
    prompt_tokens: Annotated[int, typer.Option(help="S: prompt tokens (token distances predicted).")] = 3,
    ept: Annotated[int, typer.Option(help="Ensemble prompt tokens per prompt token.")] = 1,
    data: Annotated[str, typer.Option("--dataset", help="Prompts to self-distil, comma-separated: datasets, files, "
                                      "or the training-only sources (`specbench list datasets`).")] = "alpaca-eval",
    steps: Annotated[int, typer.Option(help="Optimiser steps (one sequence each).")] = 450,
    out: PPDOut = None,
    dtype: Annotated[str, typer.Option(help="auto (float32 on CPU: bf16 backward is slow there), float32, "
                                            "bfloat16")] = "auto",
    device: Device = "auto",
    device_map: DeviceMap = None,
    max_memory: MaxMemory = None,
    lr: Annotated[float, typer.Option(help="Peak learning rate (cosine decay).")] = 0.01,
    alpha: Annotated[float, typer.Option(help="Loss decay over prompt tokens.")] = 0.8,
    insertions: Annotated[int, typer.Option(help="Random insertion points per sequence per step.")] = 64,
    prompts: Annotated[Optional[int], typer.Option(show_default="one per step, at most 300", help="Training prompts "
                                                   "per --dataset source, after the held-out ones (self-distilling "
                                                   "them is the slow part on a CPU).")] = None,
    held_out: Annotated[int, typer.Option(help="First prompts left out for `specbench estimate`.")] = 100,
    new_tokens: ContinuationLength = 96,
    save_every: SaveEvery = 50,
    resume: Resume = False,
    seed: Annotated[int, typer.Option(help="Data order, insertion points, initial tokens.")] = 0,
    data_file: DataFile = None,
    eval_prompts: EvalPrompts = 30,
):
    """Train PPD's prompt tokens (only their embeddings train; the model is frozen)."""
    from ..methods.ppd.training import TrainConfig, train

    options = dict(locals())
    path = train(_config(TrainConfig, options))
    meta = _heldout(path, "ppd.yaml", options)
    console.print(f"Wrote {escape(str(path))}/prompt_tokens.safetensors, ppd.yaml, loss.png: {meta['steps']} steps, "
                  "final loss "
                  f"{meta['final_loss']} (from {meta['initial_loss']}), {_heldout_said(meta)}"
                  f"{meta['train_seconds']:.0f} s training + {meta['data_seconds']:.0f} s data.")


@train_app.command("drafter")
def train_drafter(
    model: DrafterModel = "smollm2-135m",
    layers: Annotated[int, typer.Option(help="L: decoder layers of the drafter (initialised from the target's "
                                             "first and last layers).")] = 2,
    vocab_top: Annotated[Optional[int], typer.Option(show_default="the full vocabulary", help="K: score only the K "
                                                     "most frequent tokens of the data (cheaper drafts; verification "
                                                     "stays exact).")] = None,
    data: Mix = None,
    steps: Steps = 1500,
    batch: Annotated[int, typer.Option("--sequences", help="Sequences per step.")] = 4,
    out: _out("drafter") = None,
    dtype: DType = "auto",
    device: Device = "auto",
    device_map: DeviceMap = None,
    max_memory: MaxMemory = None,
    lr: PeakLR = 5e-4,
    topk: Annotated[int, typer.Option(help="Teacher probabilities kept per position.")] = 32,
    prompts: Annotated[int, typer.Option(help="Training prompts (after the held-out ones).")] = 300,
    held_out: Annotated[int, typer.Option(help="First prompts left out (the agreement check uses them).")] = 100,
    new_tokens: ContinuationLength = 96,
    save_every: SaveEvery = 100,
    resume: Resume = False,
    seed: _seed("Data order.") = 0,
    data_file: DataFile = None,
):
    """Train a small drafter for sd / pearl that shares the target's tokenizer, embeddings and LM head."""
    from ..methods.sd.training import DrafterConfig, train

    path = train(_config(DrafterConfig, locals()))
    import yaml

    meta = yaml.safe_load((path / "drafter.yaml").read_text())
    console.print(f"Wrote {escape(str(path))}/drafter.safetensors, drafter.yaml, loss.png: "
                  f"{meta['parameters'] / 1e6:.1f} M own "
                  f"parameters, agreement with the target {meta['agreement']:.1%} (untrained "
                  f"{meta['agreement_untrained']:.1%}), speed ratio c = {meta['speed_ratio_c']}, "
                  f"{meta['train_seconds']:.0f} s training + {meta['data_seconds']:.0f} s data.")


@train_app.command("medusa")
def train_medusa(
    model: _model("heads are") = "smollm2-135m",
    heads: Annotated[int, typer.Option(help="K: heads, guessing the tokens 2..K+1 positions ahead.")] = 3,
    layer: Annotated[Optional[int], typer.Option(show_default="the last (Medusa)", help="Layer whose state the heads "
                                                 "read; a middle layer trains early-exit heads, written to "
                                                 "artifacts/<model>/early-exit-l<layer>.")] = None,
    vocab_top: Annotated[Optional[int], typer.Option(show_default="the full vocabulary", help="Restrict the heads to "
                                                     "the K most frequent tokens of the data (cheaper heads; "
                                                     "verification stays exact).")] = None,
    data: Mix = None,
    steps: Steps = 400,
    positions: Annotated[int, typer.Option(help="Random positions per step.")] = 128,
    lr: PeakLR = 1e-3,
    prompts: PromptsPerSource = 120,
    held_out: HeldOut = 100,
    new_tokens: ReplyLength = 96,
    out: _out("medusa") = None,
    dtype: DType = "auto",
    device: Device = "auto",
    device_map: DeviceMap = None,
    max_memory: MaxMemory = None,
    save_every: SaveEvery = 100,
    resume: Resume = False,
    seed: _seed("Data order.") = 0,
    data_file: DataFile = None,
    eval_prompts: EvalPrompts = 30,
):
    """Train Medusa-1 heads for `medusa` / `medusa-typical` (the target stays frozen; its LM head is shared)."""
    from ..methods.medusa.training import MedusaConfig, train

    options = dict(locals())
    _said_trained(train(_config(MedusaConfig, options)), "medusa.yaml", "heads.safetensors", options)


@train_app.command("hidden-transfer")
def train_hidden_transfer(
    model: _model("projections are") = "smollm2-135m",
    transfer_layers: Annotated[Optional[str], typer.Option(
        metavar="L[,L...]", show_default="the measured choice where one exists (12,17,22 for smollm2-135m), else the "
                                         "paper's scaled to the depth",
        help="Strictly increasing layers l_1,l_2,... in 1..L-1, one per transfer step (the paper's choice: from 40% "
             "of the depth, 1/6 of it apart).")] = None,
    data: Mix = None,
    steps: Annotated[int, typer.Option(help="Optimiser steps (one sequence each; 800 is about two passes over "
                                           "the default data).")] = 800,
    insertions: Annotated[int, typer.Option(help="Insertion points per sequence per step.")] = 32,
    lr: PeakLR = 1e-3,
    prompts: PromptsPerSource = 120,
    held_out: HeldOut = 100,
    new_tokens: ReplyLength = 96,
    out: _out("hidden-transfer") = None,
    dtype: DType = "auto",
    device: Device = "auto",
    device_map: DeviceMap = None,
    max_memory: MaxMemory = None,
    save_every: SaveEvery = 50,
    resume: Resume = False,
    seed: _seed("Data order and insertion points.") = 0,
    data_file: DataFile = None,
    masked: Annotated[bool, typer.Option("--masked", help="The paper's Masked ablation: pseudo positions do not "
                                                          "see each other. For accuracy comparisons (estimate, "
                                                          "benchmarks/accuracy_comparison.py); not decodable.")]
    = False,
    eval_prompts: EvalPrompts = 30,
):
    """Train Hidden Transfer's projections for `hidden-transfer` (only the k linear maps train)."""
    options = dict(locals())  # the command's options only
    from ..methods.hidden_transfer.training import TransferConfig, train

    layers = tuple(int_list(transfer_layers, "--transfer-layers")) if transfer_layers else None
    _said_trained(train(_config(TransferConfig, options, transfer_layers=layers)), "hidden-transfer.yaml",
                  "projections.safetensors", options)


def _train_feature(method: str, options: dict) -> None:
    from ..methods.eagle.training import FeatureConfig, train

    cfg = _config(FeatureConfig, options, method=method, vocab_top=options["vocab_top"] or None)
    _said_trained(train(cfg), f"{method}.yaml", "feature-drafter.safetensors", options)


VocabTop = Annotated[int, typer.Option(help="Restrict the drafter's head to the K most frequent tokens of the data "
                                            "(cheaper drafts; verification stays exact). 0: the full vocabulary.")]
Sequences = Annotated[int, typer.Option(help="Sequences per step.")]
Noise = Annotated[float, typer.Option(help="Uniform noise on the input features (EAGLE: 0.1).")]


@train_app.command("eagle")
def train_eagle(
    model: DrafterModel = "smollm2-135m",
    init: Annotated[str, typer.Option(help="Go on training this eagle drafter folder (a second sitting: a new "
                                           "warm-up and cosine over --steps); none: start from the target's last "
                                           "layer.")] = "none",
    vocab_top: VocabTop = 8192,
    data: Mix = None,
    steps: Steps = 1500,
    sequences: Sequences = 4,
    lr: PeakLR = 5e-4,
    noise: Noise = 0.1,
    prompts: PromptsPerSource = 120,
    held_out: HeldOut = 100,
    new_tokens: ReplyLength = 96,
    out: _out("eagle") = None,
    dtype: DType = "auto",
    device: Device = "auto",
    device_map: DeviceMap = None,
    max_memory: MaxMemory = None,
    save_every: SaveEvery = 100,
    resume: Resume = False,
    seed: _seed("Data order and noise.") = 0,
    data_file: DataFile = None,
    eval_prompts: EvalPrompts = 30,
):
    """Train the EAGLE-style feature drafter for `eagle` (one decoder layer over the target's hidden states and the
    next token's embedding; the target's embeddings and LM head are shared, frozen)."""
    _train_feature("eagle", locals())


@train_app.command("parallelspec")
def train_parallelspec(
    model: DrafterModel = "smollm2-135m",
    mask_tokens: Annotated[int, typer.Option(help="k: [MASK] inputs; one drafter forward drafts k + 1 tokens.")] = 4,
    init: Annotated[str, typer.Option(help="Start from this eagle drafter folder (auto: the model's trained "
                                           "`eagle` drafter when there is one; none: the target's last layer), or "
                                           "go on training a parallelspec drafter folder with the same k.")]
    = "auto",
    vocab_top: VocabTop = 8192,
    data: Mix = None,
    steps: Steps = 1500,
    sequences: Sequences = 4,
    groups: Annotated[int, typer.Option(help="Parallel groups (an input and its k masks) per sequence.")] = 24,
    lr: PeakLR = 5e-4,
    noise: Noise = 0.1,
    prompts: PromptsPerSource = 120,
    held_out: HeldOut = 100,
    new_tokens: ReplyLength = 96,
    out: _out("parallelspec") = None,
    dtype: DType = "auto",
    device: Device = "auto",
    device_map: DeviceMap = None,
    max_memory: MaxMemory = None,
    save_every: SaveEvery = 100,
    resume: Resume = False,
    seed: _seed("Data order, groups and noise.") = 0,
    data_file: DataFile = None,
    eval_prompts: EvalPrompts = 30,
):
    """Train the ParallelSpec drafter for `parallelspec`: the feature drafter with k trained [MASK] inputs, by
    group-wise parallel training (ParallelSpec §4.1, Figure 3)."""
    _train_feature("parallelspec", locals())


def _heldout(path: Path, meta_file: str, options: dict) -> dict:
    """Score the new artefact on held-out prompts of its sources (at most those held out) unless
    --eval-prompts 0; returns its metadata, top1_heldout included."""
    import yaml

    prompts = min(options["eval_prompts"], options["held_out"])
    if prompts > 0:
        evaluate(path, options["model"], options["dtype"], options["device"], prompts,
                 placement=target_placement(options["device_map"], options["max_memory"]))
    return yaml.safe_load((path / meta_file).read_text())


def _heldout_said(meta: dict) -> str:
    return f"held-out top-1 per draft position {meta['top1_heldout']}, " if "top1_heldout" in meta else ""


def _before_said(meta: dict) -> str:
    """The agreement before training: untrained, or at the start of a sitting that went on from a trained drafter."""
    if "top1_agreement_at_start" in meta:
        return f"at the start {meta['top1_agreement_at_start']}"
    return f"untrained {meta['top1_agreement_untrained']}"


def _said_trained(path: Path, meta_file: str, weights: str, options: dict) -> None:
    meta = _heldout(path, meta_file, options)
    console.print(f"Wrote {escape(str(path))}/{weights}, {meta_file}, loss.png: {meta['parameters'] / 1e6:.2f} M "
                  f"parameters, {_heldout_said(meta)}top-1 agreement on a training sample "
                  f"{meta['top1_agreement_train_sample']} ({_before_said(meta)}), final "
                  f"loss {meta['final_loss']} (from {meta['initial_loss']}), {meta['train_seconds']:.0f} s training "
                  f"+ {meta['data_seconds']:.0f} s data.")
