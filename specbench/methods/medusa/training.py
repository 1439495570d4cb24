"""`specbench train medusa`: Medusa-1 heads distilled from the target itself (Medusa §2.2.1 with the
self-distillation of §2.3.2: the target's own replies and its own distributions as the teacher).

Data: the target's greedy replies to the offline training mix (selfdistill.training_sequences; no benchmark
prompts). The frozen target runs once per sequence; its states at the heads' layer and its last hidden states are
kept, so training never runs the target again. Each step takes `positions` random positions i of the data; head k
(1-based) learns the target's distribution of the token k + 1 after i, which is the target's own next-token
distribution at position i + k: loss = sum_k KL(teacher_{i+k} || head_k(h_i)), averaged over positions (with
--vocab-top both restricted to the head's vocabulary and renormalised). `--layer l` below the model's depth trains
early-exit heads on the state after l layers (Hidden Transfer's Figure 3 baseline), written to early-exit-l<l>.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from . import artifact as mh
from ...core.artifact_files import model_key
from ...core.model.load import LoadedModel
from ...errors import SpecbenchError
from ...progress import progress_bar
from ...train.configs import MedusaConfig  # noqa: F401  (its settings and `train medusa` options)
from ...train.selfdistill import check_sources
from ...train.recipe import Recipe, check_vocab_top, frequent_tokens, reply_start, run


@torch.inference_mode()
def head_states(target: LoadedModel, seqs: list[tuple[list[int], int]], layer: int
                ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per sequence: (the heads' input [T, H] at `layer`, the last hidden state [T, H]), float32 on the device."""
    out = []
    with progress_bar() as bar:
        task = bar.add_task("target states", total=len(seqs), info="")
        for seq, _ in seqs:
            x, last = mh.head_states(target.model, layer, torch.tensor([seq], device=target.device))
            out.append((x.float(), last.float()))
            bar.update(task, advance=1)
    return out


def small_logits(heads: mh.MedusaHeads, lm_head: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
    """[K, n, V'] logits over the heads' own vocabulary (training: no -inf columns) from h [n, H]."""
    weight = lm_head.weight if heads.vocab_ids is None else lm_head.weight[heads.vocab_ids]
    return (heads.states(h) @ weight.T).float()


def make_update_loss(target: LoadedModel, heads: mh.MedusaHeads, states, start: int, positions: int):
    """update_loss(rng): the heads' distillation loss on `positions` random (sequence, position) pairs."""
    lm_head = target.model.get_output_embeddings()
    k_max = heads.heads
    usable = [(s, i) for s, (x, _) in enumerate(states) for i in range(start, x.shape[0] - k_max)]
    if not usable:
        raise SpecbenchError("the training sequences are too short for the heads: raise --max-new-tokens")
    ids = heads.vocab_ids

    def update_loss(rng) -> torch.Tensor:
        picks = [usable[rng.randrange(len(usable))] for _ in range(positions)]
        x = torch.stack([states[s][0][i] for s, i in picks])  # [P, H]
        with torch.no_grad():  # teacher rows i + k, k = 1..K: [K, P, V']
            last = torch.stack([torch.stack([states[s][1][i + k] for s, i in picks]) for k in range(1, k_max + 1)])
            weight = lm_head.weight if ids is None else lm_head.weight[ids]
            teacher = F.log_softmax((last.to(weight.dtype) @ weight.T).float(), -1)
        student = F.log_softmax(small_logits(heads, lm_head, x.to(lm_head.weight.dtype)), -1)  # [K, P, V']
        kl = (teacher.exp() * (teacher - student)).sum(-1).mean(-1)  # [K]
        return kl.sum()

    return update_loss


@torch.inference_mode()
def top1_agreement(target: LoadedModel, heads: mh.MedusaHeads, states, start: int) -> list[float]:
    """Per head: share of positions where its top-1 guess equals the target's greedy token k + 1 ahead."""
    lm_head = target.model.get_output_embeddings()
    hits, total = [0] * heads.heads, [0] * heads.heads
    for x, last in states:
        guess = heads.logits(lm_head, x[start:].to(lm_head.weight.dtype)).argmax(-1)  # [K, T']
        truth = lm_head(last.to(lm_head.weight.dtype)).argmax(-1)  # [T]: the target's next token per position
        for k in range(1, heads.heads + 1):
            n = x.shape[0] - start - k
            if n > 0:
                hits[k - 1] += int((guess[k - 1, :n] == truth[start + k:start + k + n]).sum())
                total[k - 1] += n
    return [round(h / max(t, 1), 4) for h, t in zip(hits, total)]


class MedusaRecipe(Recipe):
    """Medusa's parts of the shared recipe: the heads train on the target's states, computed once."""

    def check(self) -> None:
        cfg = self.cfg
        cfg.check_common()
        if cfg.heads < 1 or cfg.positions < 1:
            raise SpecbenchError("--heads and --positions must be at least 1")
        check_sources(cfg.data)

    def before_data(self) -> None:
        cfg, target = self.cfg, self.target
        self.layers = target.model.config.num_hidden_layers
        self.layer = self.layers if cfg.layer is None else cfg.layer
        if not 1 <= self.layer <= self.layers:
            raise SpecbenchError(f"--layer {self.layer}: {target.spec} has layers 1..{self.layers} (the heads read "
                                 f"the state after that many layers; {self.layers} = the last, Medusa)")
        self.what = "Medusa heads" if self.layer == self.layers else f"early-exit heads at layer {self.layer}"
        self.label = f"training {cfg.heads} {self.what}"

    def min_reply(self) -> int:
        return self.cfg.heads + 2

    def prepare(self) -> None:
        cfg, target = self.cfg, self.target
        self.start = reply_start(self.seqs)
        self.vocab_ids = None
        if cfg.vocab_top:
            check_vocab_top(cfg.vocab_top, target.vocab_size)
            self.vocab_ids = frequent_tokens(self.seqs, target.vocab_size, self.start, cfg.vocab_top).to(target.device)
        self.states = head_states(target, self.seqs, self.layer)

    def build(self) -> mh.MedusaHeads:
        return mh.MedusaHeads(self.target.model.config.hidden_size, self.cfg.heads, self.layer,
                              self.vocab_ids).to(self.target.device)

    def out(self) -> Path:
        return self.cfg.out_dir(self.layers)

    def update_loss(self, module: mh.MedusaHeads):
        return make_update_loss(self.target, module, self.states, self.start, self.cfg.positions)

    def agreement(self, module: mh.MedusaHeads) -> list[float]:
        held = self.states[: max(1, len(self.states) // 10)]  # a tenth of the data (before and after)
        return top1_agreement(self.target, module, held, self.start)

    def meta(self, heads: mh.MedusaHeads, data: dict, before, after, facts: dict) -> dict:
        cfg, target = self.cfg, self.target
        return {
            "method": "medusa" if self.layer == self.layers else "early-exit", "model": target.spec,
            "model_key": model_key(target), "hidden_size": target.model.config.hidden_size,
            "vocab_size": target.vocab_size, "heads": cfg.heads, "layer": self.layer, "vocab_top": cfg.vocab_top,
            "parameters": int(heads.weight.numel() + heads.bias.numel()),
            "shares": "the target's LM head (frozen, not stored)",
            "top1_agreement_train_sample": after, "top1_agreement_untrained": before,
            "steps": cfg.steps, "positions_per_step": cfg.positions, "lr": cfg.lr,
            "data": data, "loss": "sum_k KL(target at i+k || head k at i)",
            **facts,
        }

    def save(self, heads: mh.MedusaHeads, out: Path, meta: dict) -> None:
        mh.save(heads, out, meta)

    def curve(self) -> tuple[str, str]:
        return f"{self.target.spec}: {self.cfg.heads} {self.what}", "sum_k KL(target || head k)"


def train(cfg: MedusaConfig) -> Path:
    return run(MedusaRecipe(cfg))
