"""`specbench train ppd`: train PPD's prompt tokens (Chen et al. 2024, PPD §3.3 and §5 "Training").

Only the S x EPT prompt-token embeddings train; the model is frozen. Initialised from real token embeddings.
Data: the model's own greedy continuations of dataset prompts (self-distillation; the first `held_out` prompts are
left for `specbench estimate`). Every step takes one sequence, runs it once without gradients (teacher logits and
a KV cache), then inserts blocks of prompt tokens after `insertions` random positions of its reply (PPD's random
insertion) and runs only those blocks on top of the cache. Prompt token j (0-based) inserted after x_i learns the
teacher's distribution of x_{i+2+j}; loss = sum_j alpha^j KL(teacher || student), averaged over blocks (PPD Eq. 1).
EPT > 1: the ensemble mask (copy e sees only copies e of earlier prompt tokens) and averaged logits (PPD §3.2).
Checkpoints every `save_every` steps; `resume` continues from the last one (same settings).
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.markup import escape

from . import artifact as pt
from ...core.batch.cache import new_cache
from ...core.model.load import LoadedModel
from ...core.machine.timing import now, since
from ...errors import SpecbenchError
from ...progress import console, status
from ...train.configs import PPDConfig
from ...train.optimiser import CheckpointState
from ...train.selfdistill import generation_seconds, pending_prompts, source_names
from ...train.recipe import Recipe, checkpoint_path, insert_after, run, token_counts

PPD_LOSS = "sum_j 0.8^j KL(teacher || student)"  # the loss curve's label
MAX_AUTO_PROMPTS = 300  # --prompts by default: one per step (each step trains on one sequence), at most this many


def auto_prompts(steps: int, sources: int) -> int:
    """Training prompts per source when --prompts is not given: as many as the steps can use, at most 300."""
    return max(1, min(MAX_AUTO_PROMPTS, -(-steps // max(sources, 1))))


def duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min" if seconds < 5400 \
        else f"{seconds / 3600:.1f} h"


def update_seconds(target: LoadedModel, cfg: "TrainConfig", length: int) -> float:
    """Time of one training step (forward, backward) on `length` random tokens, after a small untimed one."""
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, min(target.vocab_size, 32000), (length,), generator=g).to(target.device)
    emb = torch.nn.Parameter(torch.zeros(cfg.prompt_tokens, cfg.ept, target.model.config.hidden_size,
                                         device=target.device))
    span = range(length - cfg.prompt_tokens)
    points = sorted(random.Random(0).sample(span, min(cfg.insertions, len(span))))
    update_loss(target, emb, seq[:cfg.prompt_tokens + 2], [0], cfg.alpha).backward()  # warm-up: first-use costs
    start = now()
    update_loss(target, emb, seq, points, cfg.alpha).backward()
    return since(start, target.device)


TrainConfig = PPDConfig  # its settings and `train ppd` options (train/configs.py)


def _causal(n: int, dtype, device) -> torch.Tensor:
    return torch.full((n, n), torch.finfo(dtype).min, dtype=dtype, device=device).triu(1)[None, None]


def update_loss(target: LoadedModel, emb: torch.Tensor, seq: torch.Tensor, points: list[int],
              alpha: float) -> torch.Tensor:
    """Distillation loss of prompt tokens emb [S, E, H] inserted after `points` of one sequence seq [T]."""
    model, head = target.model, target.model.get_output_embeddings()
    count, ept = emb.shape[0], emb.shape[1]
    n, dev = seq.shape[0], seq.device
    cache = new_cache(model)
    with torch.no_grad():  # the teacher: the frozen model on the real tokens (its KV cache is reused below)
        real = pt.hidden(model, model.get_input_embeddings()(seq)[None], _causal(n, target.dtype, dev),
                         torch.arange(n, device=dev)[None], cache)  # [T, H]
        at = torch.tensor(points, device=dev)[:, None] + 1 + torch.arange(count, device=dev)  # [K, S]
        teacher = F.log_softmax(head(real[at]).float(), -1)  # [K, S, V]: distribution of x_{i+2+j}
    mask, pos, rows = pt.insertion_inputs(points, count, ept, n, target.dtype, dev)
    table = emb.reshape(count * ept, -1).to(target.dtype)  # [S * E, H]
    h = pt.hidden(model, table[rows][None], mask, pos, cache)  # [K * S * E, H]
    student = F.log_softmax(head(h).float().view(len(points), count, ept, -1).mean(2), -1)  # [K, S, V]
    kl = (teacher.exp() * (teacher - student)).sum(-1).mean(0)  # [S]
    return (kl * alpha ** torch.arange(count, device=dev)).sum()


class PPDRecipe(Recipe):
    """PPD's parts of the shared recipe: the trained tensor is the prompt-token embeddings [S, E, H]."""

    label = "training prompt tokens"

    def check(self) -> None:
        cfg = self.cfg
        if cfg.prompt_tokens < 1 or cfg.ept < 1 or cfg.steps < 1 or cfg.insertions < 1:
            raise SpecbenchError("--prompt-tokens, --ept, --steps and --insertions must be at least 1")
        if cfg.prompts is not None and cfg.prompts < 1:
            raise SpecbenchError("--prompts must be at least 1 (leave it out: as many as the steps use)")
        self.sources = source_names(cfg.data)

    def before_data(self) -> None:
        """The prompts per source (given, the resumed run's, or what the steps use), and the training said first."""
        cfg = self.cfg
        ckpt_path = checkpoint_path(cfg.out_dir)
        saved = torch.load(ckpt_path) if cfg.resume and ckpt_path.exists() else None
        self.prompts = (cfg.prompts or (saved or {}).get("settings", {}).get("prompts")
                        or auto_prompts(cfg.steps, len(self.sources)))
        announce_training(self.target, cfg, self.prompts, len(self.sources), cfg.steps - (saved["step"] if saved else 0))

    def min_reply(self) -> int:
        return self.cfg.prompt_tokens + 3

    def settings(self) -> dict:
        return self.cfg.settings() | {"prompts": self.prompts}

    def build(self) -> torch.nn.Module:
        cfg, target = self.cfg, self.target
        # initial prompt tokens: embeddings of reply tokens drawn by frequency (PPD §5: initialised with text tokens)
        counts = token_counts(self.seqs, target.vocab_size).float()  # [V]
        self.init_ids = torch.multinomial(counts, cfg.prompt_tokens * cfg.ept, replacement=False,
                                          generator=torch.Generator().manual_seed(cfg.seed)).tolist()
        self.emb = torch.nn.Parameter(pt.from_token_ids(target, self.init_ids, cfg.prompt_tokens, cfg.ept)
                                      .to(target.device))
        holder = torch.nn.Module()  # the one trained tensor, as the loop's module
        holder.register_parameter("embeddings", self.emb)
        return holder

    def loop_options(self) -> dict:
        def restore(state: dict) -> None:
            self.emb.data.copy_(state["embeddings"])
            self.init_ids = state["init_token_ids"]

        # PPD's checkpoint format: the embeddings [S, E, H] and the token ids they started from
        state = CheckpointState(lambda: {"embeddings": self.emb.detach().cpu()}, restore,
                                lambda: {"init_token_ids": self.init_ids})
        return {"warmup": 0, "clip": None, "state": state}  # PPD §5: cosine decay to zero, no warm-up, no clipping

    def update_loss(self, module: torch.nn.Module):
        cfg, target, seqs = self.cfg, self.target, self.seqs

        def update_loss_of(rng: random.Random) -> torch.Tensor:  # one sequence per step
            seq, first = seqs[rng.randrange(len(seqs))]
            # insertion points: random positions of the reply (where decoding inserts them), from its first
            # token's predecessor to the deepest one whose every target exists
            span = range(first - 1, len(seq) - cfg.prompt_tokens)
            points = sorted(rng.sample(span, min(cfg.insertions, len(span))))
            return update_loss(target, self.emb, torch.tensor(seq, device=target.device), points, cfg.alpha)

        return update_loss_of

    def meta(self, module, data: dict, before, after, facts: dict) -> dict:
        cfg, target = self.cfg, self.target
        return {
            "method": "ppd", "model": target.spec, "model_key": pt.model_key(target),
            "model_fingerprint": target.fingerprint(), "prompt_tokens": cfg.prompt_tokens, "ept": cfg.ept,
            "steps": cfg.steps, "data": data,
            "loss": "sum_j alpha^j KL(teacher || student)", "alpha": cfg.alpha, "lr": cfg.lr, "schedule": "cosine",
            "insertions_per_step": cfg.insertions,
            **insert_after(facts, "threads", {"init_token_ids": self.init_ids}),
        }

    def save(self, module, out: Path, meta: dict) -> None:
        pt.save(pt.PromptTokens(self.emb.detach().cpu().float(), meta), out)

    def curve(self) -> tuple[str, str]:
        return f"{self.target.spec}: S={self.cfg.prompt_tokens}, EPT={self.cfg.ept}", PPD_LOSS


def train(cfg: TrainConfig) -> Path:
    """Train, checkpoint, and write the artefact (safetensors + ppd.yaml + loss.png); returns its folder."""
    return run(PPDRecipe(cfg))


def announce_training(target: LoadedModel, cfg: TrainConfig, prompts: int, sources: int, steps: int) -> None:
    """Say up front what training will do and about how long it takes here, before the slow part starts: data from
    timed forwards of 1 and 129 tokens (selfdistill.generation_seconds), training from one timed step."""
    todo = pending_prompts(target, cfg.data, cfg.held_out, prompts, cfg.new_tokens, cfg.data_file)
    with status("Timing a few forwards and one training step (for the time estimate)"):
        data_s = generation_seconds(target, todo, cfg.new_tokens)
        typical = sorted(len(p) for p in todo)[len(todo) // 2] if todo else 64
        train_s = steps * update_seconds(target, cfg, typical + cfg.new_tokens) if steps > 0 else 0.0
    data = (f"self-distil {len(todo)} prompts x up to {cfg.new_tokens} tokens (about {duration(data_s)})" if todo
            else f"self-distilled data of {prompts} prompts per source cached")
    console.print(f"[bold]train ppd[/] {escape(target.spec)}: {data}, then {steps} steps (about "
                  f"{duration(train_s)}): [bold]about {duration(data_s + train_s)}[/] on this machine. "
                  f"{prompts} training prompt(s) per source ({sources} source(s)); --steps and --prompts change it.")
