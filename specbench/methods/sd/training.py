"""`specbench train drafter`: a small drafter for `sd` and `pearl` distilled from the target itself.

The drafter (drafter.SharedHeadDrafter) keeps the target's tokenizer, token embeddings and LM head frozen and
shared; only its L decoder layers and final norm train, initialised from the target's first and last layers.
Data: the target's own greedy continuations of prompts from a mix of sources, by default chat (alpaca-eval), code
(stdlib-code) and maths (word-problems) (selfdistill.training_sequences, trainsets; the first `held_out` prompts of
each source stay out for the agreement check, reported per source). The teacher is the target's next-token
distribution at every position after the chat template's common system prefix, kept as its top-k probabilities
(computed once, so later epochs cost only the drafter's forward and backward); loss = cross-entropy of the drafter
against that truncated, renormalised distribution (a top-k approximation of KL(teacher || drafter), as in
DistillSpec's forward KL). With --vocab-top K the drafter scores only the K tokens most frequent in the data; teacher
mass outside them is dropped before renormalising. Checkpoints every `save_every` steps; --resume continues from the
last one.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from .drafter import SharedHeadDrafter, save_artifact
from ...core.machine.forward_cost import forward_costs
from ...core.model.load import LoadedModel
from ...errors import SpecbenchError
from ...progress import progress_bar
from ...train.configs import DrafterConfig  # noqa: F401  (its settings and `train drafter` options)
from ...train.selfdistill import greedy_continuations, load_source, render, source_names
from ...train.recipe import Recipe, check_vocab_top, checkpoint_path, frequent_tokens, insert_after, reply_start, run


def init_layer_ids(n_target: int, n_layers: int) -> list[int]:
    """Which target layers initialise the drafter: the first ceil(L/2) and the last floor(L/2).

    The drafter reads the target's token embeddings and writes into the space its final norm and LM head read;
    the target's first layers are adapted to the former and its last layers to the latter.
    """
    if not 1 <= n_layers <= n_target:
        raise SpecbenchError(f"--layers must be between 1 and the target's {n_target} layers (got {n_layers})")
    first = math.ceil(n_layers / 2)
    return list(range(first)) + list(range(n_target - (n_layers - first), n_target))


@torch.inference_mode()
def teacher_targets(target: LoadedModel, seqs: list[tuple[list[int], int]], start: int, topk: int
                    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per sequence: the target's top-k next-token (probabilities [T', k], ids [T', k]) at positions start..T-2."""
    out = []
    with progress_bar() as bar:
        task = bar.add_task("teacher distributions", total=len(seqs), info="")
        for seq, _ in seqs:
            ids = torch.tensor([seq], device=target.device)
            logits = target.model(input_ids=ids, logits_to_keep=len(seq) - start).logits[0, :-1]  # [T', V]
            probs, top = F.softmax(logits.float(), -1).topk(topk, -1)
            out.append((probs.to(torch.bfloat16).cpu(), top.to(torch.int32).cpu()))
            bar.update(task, advance=1)
    return out


def distill_loss(drafter: SharedHeadDrafter, seq: list[int], start: int, probs: torch.Tensor, top: torch.Tensor,
                 col: torch.Tensor | None) -> torch.Tensor:
    """Soft cross-entropy of the drafter on one sequence against the teacher's top-k (probs, ids [T', k]).

    col: token id -> column of the drafter's restricted head (-1 outside it), or None for the full vocabulary.
    """
    dev = drafter.norm.weight.device
    ids = torch.tensor([seq], device=dev)
    h = drafter.hidden(ids, torch.arange(len(seq), device=dev)[None])[0, start:-1]  # [T', H]
    logp = F.log_softmax(drafter.head_logits(h).float(), -1)  # [T', V or K]
    probs, top = probs.to(dev).float(), top.to(dev).long()
    if col is not None:
        top = col[top]  # [T', k] columns of the restricted head
        probs = probs * (top >= 0)
        top = top.clamp(min=0)
    probs = probs / probs.sum(-1, keepdim=True).clamp(min=1e-9)
    return -(probs * logp.gather(-1, top)).sum(-1).mean()


@torch.inference_mode()
def agreement(target: LoadedModel, drafter: SharedHeadDrafter, seqs: list[tuple[list[int], int]]) -> float:
    """Share of reply positions where the drafter's argmax equals the target's (along the target's greedy reply)."""
    hits = total = 0
    for seq, first in seqs:
        ids = torch.tensor([seq], device=target.device)
        want = target.model(input_ids=ids, logits_to_keep=len(seq) - first + 1).logits[0, :-1].argmax(-1)
        full = drafter(ids).logits[0, first - 1:-1].argmax(-1)
        hits += int((full == want).sum())
        total += len(want)
    return hits / max(total, 1)


class DrafterRecipe(Recipe):
    """The drafter's parts of the shared recipe: its layers train on the target's top-k distributions (cached)."""

    def check(self) -> None:
        cfg = self.cfg
        if cfg.steps < 1 or cfg.batch < 1 or cfg.topk < 1:
            raise SpecbenchError("--steps, --sequences and --topk must be at least 1")
        if not cfg.lr > 0:
            raise SpecbenchError(f"--lr must be positive (got {cfg.lr})")
        if cfg.vocab_top is not None and cfg.vocab_top < 1:
            raise SpecbenchError(f"--vocab-top must be at least 1 (got {cfg.vocab_top}); leave it out for the full "
                                 "vocabulary")

    def before_data(self) -> None:
        self.layer_ids = init_layer_ids(self.target.model.config.num_hidden_layers, self.cfg.layers)
        self.label = f"training a {self.cfg.layers}-layer drafter"

    def prepare(self) -> None:
        cfg, target, seqs = self.cfg, self.target, self.seqs
        self.start = start = reply_start(seqs)  # positions shared by every sequence (the system prefix) teach nothing
        self.vocab_ids = self.col = None
        if cfg.vocab_top:
            check_vocab_top(cfg.vocab_top, target.vocab_size)
            self.vocab_ids = frequent_tokens(seqs, target.vocab_size, start, cfg.vocab_top)  # [K]
            col = torch.full((target.vocab_size,), -1, dtype=torch.long)
            col[self.vocab_ids] = torch.arange(cfg.vocab_top)
            self.col = col.to(target.device)
        teacher_path = checkpoint_path(cfg.out_dir, "teacher.pt")
        # the teacher depends on the target and the data only: other layer counts or learning rates reuse it
        settings = cfg.settings()
        teacher_key = {k: settings[k] for k in ("model", "data", "data_file", "prompts", "held_out", "new_tokens",
                                                "topk", "dtype", "device")}
        teacher_key.update(start=start, sequences=len(seqs))
        teacher = None
        if teacher_path.exists():
            saved = torch.load(teacher_path)
            teacher = saved["targets"] if saved["key"] == teacher_key else None
        if teacher is None:
            teacher = teacher_targets(target, seqs, start, cfg.topk)
            teacher_path.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"key": teacher_key, "targets": teacher}, teacher_path)
        self.teacher = teacher

    def build(self) -> SharedHeadDrafter:
        module = SharedHeadDrafter(self.target.model, self.layer_ids, self.vocab_ids)
        module.train()
        return module

    def update_loss(self, module: SharedHeadDrafter):
        cfg, seqs, start, teacher, col = self.cfg, self.seqs, self.start, self.teacher, self.col

        def update_loss(rng) -> torch.Tensor:  # `batch` sequences, drawn with the loop's seeded rng
            picks = [rng.randrange(len(seqs)) for _ in range(cfg.batch)]
            return sum(distill_loss(module, seqs[i][0], start, *teacher[i], col) for i in picks) / cfg.batch

        return update_loss

    def meta(self, module: SharedHeadDrafter, data: dict, before, after, facts: dict) -> dict:
        module.eval()
        return drafter_meta(self.cfg, self.target, module, self.layer_ids, data, facts)

    def save(self, module: SharedHeadDrafter, out: Path, meta: dict) -> None:
        save_artifact(module, out, meta)

    def curve(self) -> tuple[str, str]:
        return f"{self.target.spec}: {self.cfg.layers}-layer drafter", "soft cross-entropy"


def train(cfg: DrafterConfig) -> Path:
    """Train, checkpoint, and write the artefact (drafter.safetensors + drafter.yaml + loss.png)."""
    return run(DrafterRecipe(cfg))


def drafter_meta(cfg: DrafterConfig, target: LoadedModel, module: SharedHeadDrafter, layer_ids: list[int],
                 data: dict, facts: dict) -> dict:
    """The artefact's metadata, with agreement and the speed ratio c measured on held-out prompts."""
    n_eval = min(cfg.eval_prompts, cfg.held_out)
    agree, agree_init = {}, {}
    untrained = SharedHeadDrafter(target.model, layer_ids, module.vocab_ids).eval().requires_grad_(False)
    for name in source_names(cfg.data):  # each source's first n_eval prompts: held out of training
        rendered = [render(target, p) for p in load_source(name, n_eval, cfg.data_file)]
        conts = greedy_continuations(target, rendered, 64, label=f"held-out continuations ({name})")
        eval_seqs = [(p + c, len(p)) for p, c in zip(rendered, conts) if c]
        agree[name] = round(agreement(target, module, eval_seqs), 4)
        agree_init[name] = round(agreement(target, untrained, eval_seqs), 4)
    costs = forward_costs(target, module, target.device, (1,), "trained-drafter")
    own = sum(v.numel() for v in module.own_state().values() if v.is_floating_point())
    return {
        "method": "drafter", "target": target.spec, "target_fingerprint": target.fingerprint(),
        "layers": cfg.layers, "init_layers": layer_ids, "vocab_top": cfg.vocab_top, "parameters": own,
        "shares": "token embeddings and LM head of the target (frozen, not stored)",
        "agreement": round(sum(agree.values()) / len(agree), 4), "agreement_by_source": agree,
        "agreement_untrained": round(sum(agree_init.values()) / len(agree_init), 4),
        "agreement_untrained_by_source": agree_init,
        "agreement_data": f"prompts 0..{n_eval - 1} of each source (held out), target's greedy reply, 64 tokens",
        "speed_ratio_c": round(costs["c"], 3), "target_forward_ms": round(costs["target_s"][1] * 1e3, 2),
        "drafter_forward_ms": round(costs["draft_s"] * 1e3, 2),
        "steps": cfg.steps, "batch": cfg.batch, "lr": cfg.lr, "teacher_topk": cfg.topk,
        "data": data,
        "loss": "soft cross-entropy against the target's top-k next-token distribution",
        **insert_after(facts, "dtype", {"stored_dtype": "bfloat16"}),
    }
