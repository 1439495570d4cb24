"""`specbench train hidden-transfer`: Hidden Transfer's projections (Wu et al. 2024, §3.3), distilled from the target.

Only the k projections W_j [H, H] train; the model is frozen. Data: the target's greedy replies to the offline
training mix (no benchmark prompts). Each step takes one sequence: the frozen target runs it once without gradients
(its KV cache, its distribution at every position, and its hidden states entering each transfer layer, captured by
layers.capture), then pseudo positions are inserted after `insertions` random positions i of the reply, k
per insertion, and run on top of that cache (layers.transferred: step j's placeholder becomes W_j h_i at layer
l_j). Pseudo position j (1-based) sits at position i + j, sees the context up to i and the earlier pseudo positions
of its insertion (the paper's "No masked" setting, the layout decoding uses; --masked trains the paper's "Masked"
ablation, where it sees the context only), and learns the target's distribution
of the token j + 1 after i, i.e. the target's own next-token distribution at position i + j:
    loss = sum_j KL(P_{i+j} || P~_j), averaged over insertions (§3.3's loss).
The paper trains the steps one after another with the real hidden states of positions i+1 .. i+j-1 visible; here
all k train at once in the decoding layout, so training sees exactly what decoding will.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
import torch.nn.functional as F

from ..ppd import artifact as pt
from . import artifact as tp
from ...core.artifact_files import model_key
from ...core.batch.cache import crop_to, new_cache
from ...core.batch.forward import with_cache
from ...core.model.load import LoadedModel, model_slug
from .layers import capture, check_transfer_layers, transferred
from ...errors import SpecbenchError
from ...train.configs import TransferConfig  # noqa: F401  (its settings and `train hidden-transfer` options)
from ...train.selfdistill import check_sources
from ...train.recipe import Recipe, run


# Transfer layers measured per model. smollm2-135m: the per-layer sweep (`python benchmarks/transfer_layers.py`,
# Figures 5-6's experiment) proposed 22, 24, 28; trained head to head against 12, 17, 22 it drafted better at the
# first position only and gave a lower tau end to end, so 12, 17, 22 stays (the numbers:
# benchmarks/RESULTS-cpu.md).
MEASURED_LAYERS: dict[str, tuple[int, ...]] = {"smollm2-135m": (12, 17, 22)}


def default_layers(num_layers: int, steps: int = 3, model: str | None = None) -> tuple[list[int], str]:
    """Default transfer layers and how they were chosen. A model with a measured choice (MEASURED_LAYERS) takes it;
    any other takes the paper's choice scaled to its depth: from 40% of the depth, 1/6 of the depth apart (Figures
    5-6: first step at 15 of Vicuna-7B's 32 layers, where accuracy has not dropped yet, second at 20), kept inside
    1..L-1. `python benchmarks/transfer_layers.py --model M` proposes a model's own choice per step; confirm it head to
    head (`benchmarks/accuracy_comparison.py --hidden-transfer A --hidden-transfer B`, tau from `specbench run`)."""
    measured = MEASURED_LAYERS.get(model_slug(model)) if model and not model.startswith("random:") else None
    if measured and len(measured) >= steps and max(measured) < num_layers:
        return (check_transfer_layers(list(measured[:steps]), num_layers),
                "measured for this model (MEASURED_LAYERS)")
    first = max(1, round(0.4 * num_layers))
    gap = max(1, round(num_layers / 6))
    layers = [min(first + j * gap, num_layers - steps + j) for j in range(steps)]
    return check_transfer_layers(layers, num_layers), "the paper's Figure 5-6 choice scaled to this depth"


def pseudo_forward(target: LoadedModel, proj: tp.TransferProjections, cache, past: int, points: list[int],
                   captured: dict[int, torch.Tensor]) -> torch.Tensor:
    """Hidden states [len(points), k, H] of k pseudo positions inserted after each of `points` (real positions in
    `cache`, whose states entering layer l_j are captured[l_j] [past, H]); the cache is left as it was."""
    model, k = target.model, proj.depth
    mask, pos, rows = pt.insertion_inputs(points, k, 1, past, target.dtype, target.device,  # rows: step j
                                          see_earlier=not proj.masked)
    at = torch.tensor(points, device=target.device)
    slots = [torch.nonzero(rows == j).flatten() for j in range(k)]  # [P] input indices of step j
    sources = [captured[layer][at] for layer in proj.layers]  # [P, H] each
    placeholder = torch.zeros(1, rows.shape[0], model.config.hidden_size, dtype=target.dtype, device=target.device)
    with transferred(model, proj.transfers(slots, sources)):
        h = pt.hidden(model, placeholder, mask, pos, cache)  # [P * k, H]
    crop_to(cache, past)
    return h.view(len(points), k, -1)


@torch.no_grad()
def real_forward(target: LoadedModel, seq: list[int], layers: list[int]):
    """The frozen target on one sequence: (cache, last hidden states [T, H], captured states layer -> [T, H])."""
    model = target.model
    ids = torch.tensor([seq], device=target.device)
    cache = new_cache(model)
    with capture(model, layers) as seen:
        h = model.get_decoder()(input_ids=ids, **with_cache(cache), use_cache=True).last_hidden_state[0]
    return cache, h, {layer: s[0] for layer, s in seen.items()}


def make_update_loss(target: LoadedModel, proj: tp.TransferProjections, seqs, insertions: int):
    head = target.model.get_output_embeddings()
    k = proj.depth

    def update_loss(rng: random.Random) -> torch.Tensor:
        seq, first = seqs[rng.randrange(len(seqs))]
        span = range(first - 1, len(seq) - k - 1)  # the reply's positions whose k future targets exist
        points = sorted(rng.sample(span, min(insertions, len(span))))
        cache, last, captured = real_forward(target, seq, proj.layers)
        h = pseudo_forward(target, proj, cache, len(seq), points, captured)  # [P, k, H]
        student = F.log_softmax(head(h).float(), -1)  # [P, k, V]
        at = torch.tensor(points, device=target.device)[:, None] + 1 + torch.arange(k, device=target.device)
        with torch.no_grad():  # the target's distribution at i + j, only at those rows
            teacher = F.log_softmax(head(last[at]).float(), -1)  # [P, k, V]
        return (teacher.exp() * (teacher - student)).sum(-1).mean(0).sum()

    return update_loss


@torch.no_grad()
def top1_agreement(target: LoadedModel, proj: tp.TransferProjections, seqs) -> list[float]:
    """Per step j: share of reply positions where the pseudo state's top-1 guess is the target's greedy token."""
    head = target.model.get_output_embeddings()
    k = proj.depth
    hits, total = [0] * k, 0
    for seq, first in seqs:
        points = list(range(first - 1, len(seq) - k - 1))
        if not points:
            continue
        cache, _, captured = real_forward(target, seq, proj.layers)
        guess = head(pseudo_forward(target, proj, cache, len(seq), points, captured)).argmax(-1)  # [P, k]
        truth = torch.tensor(seq, device=target.device)[torch.tensor(points, device=target.device)[:, None] + 2
                                                        + torch.arange(k, device=target.device)]  # [P, k]
        for j in range(k):
            hits[j] += int((guess[:, j] == truth[:, j]).sum())
        total += len(points)
    return [round(h / max(total, 1), 4) for h in hits]


class TransferRecipe(Recipe):
    """Hidden Transfer's parts of the shared recipe: the k projections train; the target runs in every step."""

    def check(self) -> None:
        cfg = self.cfg
        cfg.check_common()
        if cfg.insertions < 1:
            raise SpecbenchError("--insertions must be at least 1")
        check_sources(cfg.data)

    def before_data(self) -> None:
        cfg, target = self.cfg, self.target
        num_layers = target.model.config.num_hidden_layers
        if cfg.transfer_layers:
            self.layers = check_transfer_layers(cfg.transfer_layers, num_layers, target.spec)
            self.chosen = "given (--transfer-layers)"
        else:
            self.layers, chosen = default_layers(num_layers, model=cfg.model)
            self.chosen = f"default: {chosen}"
        self.label = f"training {len(self.layers)} transfer projection(s) at layers {self.layers}"

    def min_reply(self) -> int:
        return len(self.layers) + 2

    def build(self) -> tp.TransferProjections:
        return tp.TransferProjections(self.target.model.config.hidden_size, self.layers,
                                      self.cfg.masked).to(self.target.device)

    def settings(self) -> dict:
        return self.cfg.settings() | {"transfer_layers": self.layers}

    def update_loss(self, proj: tp.TransferProjections):
        return make_update_loss(self.target, proj, self.seqs, self.cfg.insertions)

    def agreement(self, proj: tp.TransferProjections) -> list[float]:
        held = self.seqs[:: max(1, len(self.seqs) // 12)][:12]  # a sample of the data (before and after)
        return top1_agreement(self.target, proj, held)

    def meta(self, proj: tp.TransferProjections, data: dict, before, after, facts: dict) -> dict:
        cfg, target = self.cfg, self.target
        return {
            "method": "hidden-transfer", "model": target.spec, "model_key": model_key(target),
            "hidden_size": target.model.config.hidden_size, "vocab_size": target.vocab_size,
            "transfer_layers": self.layers, "layers_chosen": self.chosen,
            "masked": cfg.masked,
            "layout": ("pseudo position j sees the context and itself only (Masked: an ablation, not decodable)"
                       if cfg.masked else
                       "pseudo position j sees the context and pseudo positions 1..j-1 of its insertion (No masked)"),
            "parameters": int(proj.weight.numel()), "top1_agreement_train_sample": after,
            "top1_agreement_untrained": before, "steps": cfg.steps, "insertions_per_step": cfg.insertions,
            "lr": cfg.lr, "data": data, "loss": "sum_j KL(target at i+j || pseudo state j)",
            **facts,
        }

    def save(self, proj: tp.TransferProjections, out: Path, meta: dict) -> None:
        tp.save(proj, out, meta)

    def curve(self) -> tuple[str, str]:
        return f"{self.target.spec}: hidden transfer at layers {self.layers}", "sum_j KL(target || pseudo j)"


def train(cfg: TransferConfig) -> Path:
    return run(TransferRecipe(cfg))
