"""`specbench train eagle3`: the EAGLE-3 drafter (drafter.py) trained by training-time test (EAGLE-3 §3.2) on the
target's own greedy replies to the offline training mix (selfdistill.training_sequences; no benchmark prompts).
The frozen target runs once per sequence, when a step first draws it (TargetStates); its fused states g [T, 3H] and
final states f [T, H] are kept (bfloat16).

Training-time test, per sequence: step 0 feeds every pair (fc(g_t), x_{t+1}) causally, and at `columns` random reply
positions t its output o_t is trained towards the target's distribution of x_{t+2}; step k >= 1 feeds, at those t, the pair
(o_t of step k - 1, x_{t+1+k}) at position t + k, trained towards the target's x_{t+2+k}. The unrolled steps share
one KV cache: position t at step k sees step 0's keys up to t, its own keys of steps 1..k - 1 and itself, which is
the tree mask the drafting gives a node at depth k on its path (the EAGLE repository's
eagle/traineagle3/cnets.py attends the same way). Loss: the soft cross-entropy to the target's distribution
renormalised over the draft vocabulary, step k weighted 0.8^k (the repository's traineagle3/main.py); no
feature-regression term (EAGLE-3 §3.1).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from rich.markup import escape

from . import artifact as e3
from .drafter import Eagle3Drafter, initial
from .layers import fused_states, feature_layers
from ...core.artifact_files import model_key
from ...core.batch.cache import new_cache
from ...core.tree import additive
from ...errors import SpecbenchError
from ...progress import console
from ...train.configs import Eagle3Config
from ...train.selfdistill import check_sources
from ...train.recipe import Recipe, frequent_tokens, reply_start, run

STEP_WEIGHT = 0.8  # step k's loss weight STEP_WEIGHT ** k
AGREEMENT_SEQUENCES = 20  # training sequences the agreement before and after training reads


def teacher_log_probs(head_rows: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """The target's log-probabilities over the draft vocabulary [n, K] from its final states f [n, H]."""
    return F.log_softmax((f.to(head_rows.dtype) @ head_rows.T).float(), -1)


def unrolled(drafter: Eagle3Drafter, g: torch.Tensor, ids: torch.Tensor, columns: list[int],
             steps: int) -> list[tuple[list[int], torch.Tensor]]:
    """The training-time test of one sequence: g [n, 3H] (the target's fused states at positions 0..n-1), ids [n + 1]
    (the sequence), the positions unrolled past step 0, the steps -> per step k: (the positions t trained at
    step k, o [len, H] there). Step 0 returns every position 0..n-1."""
    n = g.shape[0]
    device = g.device
    cache = new_cache(drafter)
    x = drafter.fuse(g, ids[1:n + 1])  # [n, 2H]
    o = drafter.run(x[None], torch.arange(n, device=device)[None], cache)  # [n, H]
    out = [(list(range(n)), o)]
    slot_of: list[dict[int, int]] = []  # per earlier step >= 1: position t -> its key's index in the cache
    length = n
    prev, prev_cols = o, list(range(n))
    for k in range(1, steps):
        cols = [t for t in columns if t + 1 + k <= n]
        if not cols:
            break
        at_prev = {t: i for i, t in enumerate(prev_cols)}
        src = torch.tensor([at_prev[t] for t in cols], device=device)
        x = drafter.fuse(prev[src], ids[torch.tensor(cols, device=device) + 1 + k])  # [m, 2H]
        m = len(cols)
        vis = torch.zeros(m, length + m, dtype=torch.bool)
        for r, t in enumerate(cols):
            vis[r, :t + 1] = True  # step 0's keys up to t
            for earlier in slot_of:
                vis[r, earlier[t]] = True  # its own keys of the earlier steps
            vis[r, length + r] = True
        pos = (torch.tensor(cols, device=device) + k)[None]
        o = drafter.run(x[None], pos, cache, additive(vis.to(device), x.dtype))  # [m, H]
        slot_of.append({t: length + r for r, t in enumerate(cols)})
        length += m
        out.append((cols, o))
        prev, prev_cols = o, cols
    return out


def make_update_loss(cfg: Eagle3Config, drafter: Eagle3Drafter, seqs, feats, start: int, head_rows: torch.Tensor):
    """update_loss(rng): the weighted training-time-test loss of `sequences` random sequences."""

    def sequence_loss(rng, s: int) -> torch.Tensor:
        g, f = feats[s]
        ids = torch.tensor(seqs[s][0], device=g.device)
        n = len(ids) - 1
        first = max(start, seqs[s][1] - 1)
        room = list(range(first, n))
        cols = sorted(rng.sample(room, min(cfg.columns, len(room))))
        total = g.new_zeros((), dtype=torch.float32)
        for k, (at, o) in enumerate(unrolled(drafter, g[:n].to(head_rows.dtype), ids, cols, cfg.ttt_steps)):
            keep = cols if k == 0 else list(range(len(at)))  # step 0 ran every position; its loss reads the columns
            rows = torch.tensor(keep, device=g.device)
            want = torch.tensor([at[i] + 1 + k for i in keep], device=g.device)  # f of the position before the token
            with torch.no_grad():
                teacher = teacher_log_probs(head_rows, f[want])
            student = F.log_softmax(drafter.head_logits(o[rows]).float(), -1)
            total = total + STEP_WEIGHT ** k * -(teacher.exp() * student).sum(-1).mean()
        return total

    def update_loss(rng) -> torch.Tensor:
        chosen = [rng.randrange(len(seqs)) for _ in range(cfg.sequences)]
        return sum(sequence_loss(rng, s) for s in chosen) / cfg.sequences

    return update_loss


@torch.no_grad()
def depth_agreement(drafter: Eagle3Drafter, seqs, feats, start: int, steps: int) -> list[float]:
    """Top-1 agreement with the target's greedy token per unrolled step (the drafter fed its own outputs, the true
    tokens), over every reply position of the given sequences."""
    head = drafter.vocab_ids
    hits, total = [0] * steps, [0] * steps
    for (seq, reply), (g, f) in zip(seqs, feats):
        ids = torch.tensor(seq, device=g.device)
        n = len(seq) - 1
        cols = list(range(max(start, reply - 1), n))
        if not cols:
            continue
        dtype = drafter.fc.weight.dtype
        for k, (at, o) in enumerate(unrolled(drafter, g[:n].to(dtype), ids, cols, steps)):
            keep = [i for i, t in enumerate(at) if t >= cols[0] and t + 2 + k <= n]
            if not keep:
                continue
            truth = ids[torch.tensor([at[i] + 2 + k for i in keep], device=g.device)]
            guess = head[drafter.head_logits(o[torch.tensor(keep, device=g.device)]).argmax(-1)]
            hits[k] += int((guess == truth).sum())
            total[k] += len(keep)
    return [round(h / max(t, 1), 4) for h, t in zip(hits, total)]


def check(cfg: Eagle3Config) -> None:
    cfg.check_common()
    if not 1 <= cfg.ttt_steps <= 16:
        raise SpecbenchError(f"--ttt-steps must be between 1 and 16 (got {cfg.ttt_steps})")
    if cfg.sequences < 1 or cfg.columns < 1:
        raise SpecbenchError("--sequences and --columns must be at least 1")
    if cfg.vocab_top < 0:
        raise SpecbenchError(f"--vocab-top must be at least 0 (got {cfg.vocab_top})")
    check_sources(cfg.data)


def starting_drafter(cfg: Eagle3Config, target, seqs, start: int) -> tuple[Eagle3Drafter, str, int]:
    """(drafter, where it started from, updates it had before). Fresh: the target's last layer, its draft vocabulary
    the data's `--vocab-top` most frequent tokens. --init: a trained drafter's weights and its draft vocabulary (a
    second sitting on other data would count another frequency order; the head's rows are the drafter's own)."""
    vocab = target.vocab_size
    if cfg.init in (None, "none"):
        top = cfg.vocab_top or vocab
        draft_ids = frequent_tokens(seqs, vocab, start, top) if top < vocab else torch.arange(vocab)
        return initial(target.model, draft_ids), "the target's last layer", 0
    art = e3.load(cfg.init, target)
    theirs = art.drafter.vocab_ids
    if len(theirs) != min(cfg.vocab_top or vocab, vocab):
        raise SpecbenchError(f"--init {art.source}: its head covers {len(theirs)} draft tokens, this run's "
                             f"--vocab-top asks for {cfg.vocab_top}; train with --vocab-top {len(theirs)} or pass "
                             "--init none")
    drafter = initial(target.model, theirs.cpu())
    drafter.load_state_dict({n: t.detach().clone() for n, t in art.drafter.own_state().items()}, strict=False)
    before = int(art.meta.get("steps_total", art.meta.get("steps", 0)))
    return drafter, f"{art.source} ({before} updates; its draft vocabulary kept)", before


class Eagle3Recipe(Recipe):
    """EAGLE-3's parts of the shared recipe: it trains on the target's fused and final states, computed once."""

    def check(self) -> None:
        check(self.cfg)

    def min_reply(self) -> int:
        return 3

    def prepare(self) -> None:
        cfg, target, seqs = self.cfg, self.target, self.seqs
        self.start = reply_start(seqs)
        vocab = target.vocab_size
        if cfg.vocab_top > vocab:
            raise SpecbenchError(f"--vocab-top must be at most the vocabulary size {vocab}")
        self.drafter, self.init_from, self.steps_before = starting_drafter(cfg, target, seqs, self.start)
        weight = target.model.get_output_embeddings().weight
        self.head_rows = weight.detach()[self.drafter.vocab_ids.to(weight.device)]  # [K, H]: the teacher's
        self.feats = TargetStates(target, seqs)

    def build(self) -> Eagle3Drafter:
        drafter = self.drafter
        drafter.requires_grad_(True)
        drafter.masks.requires_grad_(False)
        drafter.eval()
        self.label = "training the EAGLE-3 drafter"
        console.print(f"[dim]EAGLE-3 drafter: {drafter.parameter_count():,} parameters, "
                      f"{drafter.lm_head.out_features} draft tokens, {self.cfg.ttt_steps} training-time-test "
                      f"steps, starting from {escape(self.init_from)}[/]")
        return drafter

    def out(self) -> Path:
        return self.cfg.out_dir()

    def update_loss(self, drafter: Eagle3Drafter):
        return make_update_loss(self.cfg, drafter, self.seqs, self.feats, self.start, self.head_rows)

    def agreement(self, drafter: Eagle3Drafter) -> list[float]:
        held = range(max(1, min(len(self.seqs) // 10, AGREEMENT_SEQUENCES)))
        return depth_agreement(drafter, [self.seqs[i] for i in held], [self.feats[i] for i in held], self.start,
                              self.cfg.ttt_steps)

    def meta(self, drafter: Eagle3Drafter, data: dict, before, after, facts: dict) -> dict:
        cfg, target = self.cfg, self.target
        layers = feature_layers(target.model.config.num_hidden_layers)
        return {
            "method": "eagle3", "model": target.spec, "model_key": model_key(target),
            "hidden_size": target.model.config.hidden_size, "vocab_size": target.vocab_size,
            "draft_vocab_size": drafter.lm_head.out_features, "parameters": drafter.parameter_count(),
            "architecture": f"fc [H, 3H] over the states entering layers {list(layers)}, one decoder layer over "
                            "[norm(embedding) ; norm(feature)], final norm, own head over the draft vocabulary",
            "init_from": self.init_from, "shares": "the target's embeddings (frozen, not stored)",
            "top1_agreement_train_sample": after,
            ("top1_agreement_at_start" if self.steps_before else "top1_agreement_untrained"): before,
            "steps": cfg.steps, "steps_total": self.steps_before + cfg.steps, "sequences_per_step": cfg.sequences,
            "ttt_steps": cfg.ttt_steps,
            "columns_per_sequence": cfg.columns, "lr": cfg.lr, "data": data,
            "loss": f"sum over training-time-test steps k of {STEP_WEIGHT}^k x CE(target || drafter) on the draft "
                    "vocabulary",
            **facts,
        }

    def save(self, drafter: Eagle3Drafter, out: Path, meta: dict) -> None:
        e3.save(drafter, out, meta)

    def curve(self) -> tuple[str, str]:
        return f"{self.target.spec}: EAGLE-3 drafter", "weighted cross-entropy"


class TargetStates:
    """Per sequence: (g [T, 3H], f [T, H]) in bfloat16, from one target forward when first asked for, then kept (a
    run that visits a fraction of its data pays for that fraction only)."""

    def __init__(self, target, seqs):
        self.target, self.seqs = target, seqs
        self.kept: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @torch.no_grad()
    def __getitem__(self, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        if s not in self.kept:
            ids = torch.tensor([self.seqs[s][0]], device=self.target.device)
            g, f = fused_states(self.target.model, ids)
            self.kept[s] = (g.to(torch.bfloat16), f.to(torch.bfloat16))
        return self.kept[s]


def train(cfg: Eagle3Config) -> Path:
    return run(Eagle3Recipe(cfg))
