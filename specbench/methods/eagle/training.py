"""`specbench train eagle` and `specbench train parallelspec`: the feature drafter (artifact.py) distilled
from the target on its own greedy replies to the offline training mix (selfdistill.training_sequences; no benchmark
prompts). The frozen target runs once per sequence; its last (normed) hidden states f [T, H] are kept.

Loss per predicted feature f^ of position t (EAGLE §4.3's two terms, here the classification term is a KL to the
target's own distribution): KL(p_target(. | f_t) || p(. | f^)) + SmoothL1(f^, f_t), on the reply positions.
Inputs carry uniform noise U(-noise, noise) on the features (EAGLE's robustness to its own predicted features).
`parallelspec` adds group-wise parallel training (ParallelSpec §4.1, Figure 3): `groups` random reply positions i
per sequence each get a parallel group of k masks after them (positions i+1..i+k, seeing inputs <= i and the
group's earlier masks only); mask j is trained towards the target at position i+1+j, and the sum of the group's
losses is the EAGLE loss over the K + 1 tokens of the group (§4.3). It starts from the trained `eagle` drafter
when there is one (`--init`), with masks at zero.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from . import artifact as fd
from ...core.artifact_files import model_key
from ...core.model.load import LoadedModel
from ...core.tree import additive
from ...errors import SpecbenchError
from ...progress import console, progress_bar
from ...train.configs import FeatureConfig  # noqa: F401  (eagle's and parallelspec's settings)
from ...train.selfdistill import check_sources
from ...train.recipe import Recipe, frequent_tokens, reply_start, run


def teacher_log_probs(lm_head: torch.nn.Module, features: torch.Tensor,
                      vocab_ids: torch.Tensor | None) -> torch.Tensor:
    """The target's next-token log-probabilities [n, K] from its features [n, H] (restricted: renormalised over
    vocab_ids, the distribution a restricted drafter can match)."""
    weight = lm_head.weight if vocab_ids is None else lm_head.weight[vocab_ids]
    return F.log_softmax((features.to(weight.dtype) @ weight.T).float(), -1)


@torch.inference_mode()
def target_features(target: LoadedModel, seqs: list[tuple[list[int], int]]) -> list[torch.Tensor]:
    """Per sequence: the target's last normed hidden states [T, H], float32."""
    out = []
    with progress_bar() as bar:
        task = bar.add_task("target features", total=len(seqs), info="")
        for seq, _ in seqs:
            ids = torch.tensor([seq], device=target.device)
            out.append(target.model.get_decoder()(input_ids=ids).last_hidden_state[0].float())
            bar.update(task, advance=1)
    return out


def group_forward(drafter: fd.FeatureDrafter, pairs: torch.Tensor, points: list[int],
                  group_inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """pairs [n, H] (real inputs at positions 0..n-1) and group_inputs [G, j, H] (G groups of j inputs after the
    points) -> (outputs of the real inputs [n, H], outputs of the groups [G, j, H]) in one forward."""
    n, (g, j) = pairs.shape[0], group_inputs.shape[:2]
    pos, vis = fd.group_layout(n, points, j, pairs.device)
    x = torch.cat([pairs, group_inputs.reshape(g * j, pairs.shape[1]).to(pairs.dtype)])
    out = drafter.run(x[None], pos[None], None, additive(vis, x.dtype))
    return out[:n], out[n:].reshape(g, j, pairs.shape[1])


def make_update_loss(cfg: FeatureConfig, drafter: fd.FeatureDrafter, seqs, feats, start: int):
    """update_loss(rng): the summed KL + SmoothL1 loss of `sequences` random sequences."""
    lm_head = drafter.get_output_embeddings()
    k = cfg.k

    def sequence_loss(rng, s: int) -> torch.Tensor:
        ids, f = torch.tensor(seqs[s][0], device=feats[s].device), feats[s]
        n = len(ids) - 1  # pairs (f_i, x_{i+1}), i = 0..n-1; pair i predicts f_{i+1}
        first = max(start, seqs[s][1] - 1)
        noisy = f[:n] + (torch.rand_like(f[:n]) * 2 - 1) * cfg.noise
        pairs = drafter.fuse(noisy.to(lm_head.weight.dtype), ids[1:])
        room = list(range(first, n - k))  # group points whose last mask still has a target (i + 1 + k <= n)
        points = sorted(rng.sample(room, min(cfg.groups, len(room)))) if k and room else []
        masks = drafter.masks[None].expand(len(points), k, -1)
        pair_out, group_out = group_forward(drafter, pairs, points, masks)
        # predicted rows and the position whose feature each should be
        pred = [pair_out[first:n]]
        want = list(range(first + 1, n + 1))
        if points and k:
            pred.append(group_out.reshape(-1, group_out.shape[-1]))
            want += [i + 1 + j for i in points for j in range(1, k + 1)]
        pred_rows = torch.cat(pred)  # [R, H]
        target_rows = f[torch.tensor(want, device=f.device)]  # [R, H]
        reg = F.smooth_l1_loss(pred_rows.float(), target_rows)
        pick = torch.tensor(rng.sample(range(len(want)), min(cfg.kl_rows, len(want))), device=f.device)
        with torch.no_grad():
            teacher = teacher_log_probs(lm_head, target_rows[pick], drafter.vocab_ids)  # [r, K]
        student = F.log_softmax(drafter.head_logits(pred_rows[pick]).float(), -1)
        kl = (teacher.exp() * (teacher - student)).sum(-1).mean()
        return kl + reg

    def update_loss(rng) -> torch.Tensor:
        chosen = [rng.randrange(len(seqs)) for _ in range(cfg.sequences)]
        return sum(sequence_loss(rng, s) for s in chosen) / cfg.sequences

    return update_loss


@torch.no_grad()  # not inference_mode: the drafter caches its head rows, which training then reads
def position_agreement(drafter: fd.FeatureDrafter, seqs, feats, start: int) -> list[float]:
    """Top-1 agreement with the target's greedy token per drafted position 1..k+1 (teacher-forced features; position
    1 is the pair's own prediction, position 1+j mask j's), over every reply position of the given sequences."""
    k = drafter.mask_tokens
    lm_head = drafter.get_output_embeddings()
    hits, total = [0] * (k + 1), [0] * (k + 1)
    for (seq, reply), f in zip(seqs, feats):
        ids = torch.tensor(seq, device=f.device)
        n = len(seq) - 1
        first = max(start, reply - 1)
        points = list(range(first, n - k))
        if not points:
            continue
        pairs = drafter.fuse(f[:n].to(lm_head.weight.dtype), ids[1:])
        pair_out, group_out = group_forward(drafter, pairs, points, drafter.masks[None].expand(len(points), k, -1))
        truth = lm_head(f.to(lm_head.weight.dtype)).argmax(-1)  # [T]: the target's greedy token after t
        at = torch.tensor(points, device=f.device)
        guesses = [pair_out[at]] + [group_out[:, j] for j in range(k)]
        for d, g in enumerate(guesses):
            hits[d] += int((drafter.logits(g).argmax(-1) == truth[at + 1 + d]).sum())
            total[d] += len(points)
    return [round(h / max(t, 1), 4) for h, t in zip(hits, total)]


def _starting_drafter(cfg: FeatureConfig, target: LoadedModel, vocab_ids) -> tuple[fd.FeatureDrafter, str, int]:
    """(drafter, where it started from, steps it was trained before). Fresh: the target's last layer, fc = [I I].
    --init names a trained drafter to go on from: eagle from an eagle drafter; parallelspec from an eagle drafter
    (auto: the model's own, if trained), masks at zero, or from a parallelspec drafter with the same k, masks kept
    (longer training in a second sitting). A started drafter keeps its head vocabulary when it has --vocab-top tokens
    too: parallelspec keeps only replies of at least k + 3 tokens, so its own count of the same data can break a
    frequency tie the other way."""
    fresh = cfg.init in (None, "none") or (cfg.method == "eagle" and cfg.init == "auto")
    if fresh:
        return fd.FeatureDrafter(target.model, cfg.k, vocab_ids), "the target's last layer", 0
    spec = None if cfg.init == "auto" else cfg.init
    try:
        art = fd.resolve(spec, target, _init_kind(cfg.method, spec))
    except SpecbenchError:
        if spec:
            raise
        return (fd.FeatureDrafter(target.model, cfg.k, vocab_ids),
                "the target's last layer (no trained eagle drafter to start from)", 0)
    theirs = art.drafter.vocab_ids
    if (theirs is None) != (vocab_ids is None) or (theirs is not None and len(theirs) != len(vocab_ids)):
        mine = "the full vocabulary" if vocab_ids is None else f"{len(vocab_ids)} tokens"
        its = "the full vocabulary" if theirs is None else f"{len(theirs)} tokens"
        raise SpecbenchError(f"--init {art.source}: its head covers {its}, this run's --vocab-top asks for {mine}; "
                             "train with the same --vocab-top or pass --init none")
    theirs_k = art.drafter.mask_tokens
    if theirs_k and theirs_k != cfg.k:
        raise SpecbenchError(f"--init {art.source}: a parallelspec drafter with {theirs_k} masks, this run asks "
                             f"for --mask-tokens {cfg.k}; use the same k, or start from an eagle drafter")
    drafter = fd.FeatureDrafter(target.model, cfg.k, None if theirs is None else theirs.to(target.device),
                                **art.drafter.variant)  # a release's layout too (fc bias, no input / final norm)
    state = {n: t for n, t in art.drafter.state_dict().items() if n != "masks" or theirs_k}
    drafter.load_state_dict(state, strict=False)
    before = art.meta.get("steps_total", art.meta.get("steps", 0))
    return drafter, art.source, before if isinstance(before, int) else 0


def start_key(steps_before: int) -> str:
    """The metadata key of the agreement before this sitting: untrained for a fresh drafter, at_start for one that
    goes on from a trained artefact (--init)."""
    return "top1_agreement_untrained" if steps_before == 0 else "top1_agreement_at_start"


def _init_kind(method: str, spec: str | None) -> str:
    """The artefact kind --init reads: eagle, or parallelspec when training parallelspec from a folder holding one."""
    if method == "parallelspec" and spec and (Path(spec) / fd.META_FILES["parallelspec"]).is_file():
        return "parallelspec"
    return "eagle"


def check(cfg: FeatureConfig) -> None:
    cfg.check_common()
    if cfg.method == "parallelspec" and cfg.mask_tokens < 1:
        raise SpecbenchError(f"--mask-tokens must be at least 1 (got {cfg.mask_tokens}): ParallelSpec drafts "
                             "k + 1 tokens per forward with k masks")
    if cfg.sequences < 1 or cfg.kl_rows < 1 or (cfg.method == "parallelspec" and cfg.groups < 1):
        raise SpecbenchError("--sequences, --kl-rows and --groups must be at least 1")
    if cfg.vocab_top is not None and cfg.vocab_top < 1:
        raise SpecbenchError(f"--vocab-top must be at least 1 (got {cfg.vocab_top})")
    if not 0 <= cfg.noise < 10:
        raise SpecbenchError(f"--noise must be between 0 and 10 (got {cfg.noise})")
    check_sources(cfg.data)


class FeatureRecipe(Recipe):
    """The feature drafter's parts of the shared recipe (eagle and parallelspec): it trains on the target's
    features, computed once; it may go on from a trained drafter (--init)."""

    def check(self) -> None:
        check(self.cfg)

    def min_reply(self) -> int:
        return self.cfg.k + 3

    def prepare(self) -> None:
        cfg, target, seqs = self.cfg, self.target, self.seqs
        self.start = reply_start(seqs)
        vocab_ids = None
        if cfg.vocab_top:
            if cfg.vocab_top > target.vocab_size:
                raise SpecbenchError(f"--vocab-top must be at most the vocabulary size {target.vocab_size}")
            vocab_ids = frequent_tokens(seqs, target.vocab_size, self.start, cfg.vocab_top).to(target.device)
        # before the features: a refused --init is quick
        self.drafter, self.init_from, self.steps_before = _starting_drafter(cfg, target, vocab_ids)
        self.feats = target_features(target, seqs)

    def build(self) -> fd.FeatureDrafter:
        drafter = self.drafter
        drafter.requires_grad_(True)
        drafter.eval()  # for the agreement check and, as before the shared recipe, through training too
        self.what = "EAGLE drafter" if self.cfg.method == "eagle" else f"ParallelSpec drafter ({self.cfg.k} masks)"
        self.label = f"training the {self.what}"
        console.print(f"[dim]{self.what}: {drafter.parameter_count():,} parameters, starting from {self.init_from}[/]")
        return drafter

    def out(self) -> Path:
        return self.cfg.out_dir()

    def update_loss(self, drafter: fd.FeatureDrafter):
        return make_update_loss(self.cfg, drafter, self.seqs, self.feats, self.start)

    def agreement(self, drafter: fd.FeatureDrafter) -> list[float]:
        held = max(1, len(self.seqs) // 10)  # a tenth of the data (before and after)
        return position_agreement(drafter, self.seqs[:held], self.feats[:held], self.start)

    def meta(self, drafter: fd.FeatureDrafter, data: dict, before, after, facts: dict) -> dict:
        cfg, target = self.cfg, self.target
        return {
            "method": cfg.method, "model": target.spec, "model_key": model_key(target),
            "hidden_size": target.model.config.hidden_size, "vocab_size": target.vocab_size, "mask_tokens": cfg.k,
            "vocab_top": cfg.vocab_top, "parameters": drafter.parameter_count(),
            "architecture": "fc [H, 2H] over (feature, next-token embedding), one decoder layer, final norm"
                            + (f", {cfg.k} mask inputs" if cfg.k else ""),
            "init_from": self.init_from, "shares": "the target's embeddings and LM head (frozen, not stored)",
            "top1_agreement_train_sample": after, start_key(self.steps_before): before,
            "steps": cfg.steps, "steps_total": self.steps_before + cfg.steps, "sequences_per_step": cfg.sequences,
            "groups_per_sequence": cfg.groups if cfg.k else None,
            "lr": cfg.lr, "noise": cfg.noise,
            "data": data, "loss": "KL(target || drafter) + SmoothL1(predicted feature, target feature)",
            **facts,
        }

    def save(self, drafter: fd.FeatureDrafter, out: Path, meta: dict) -> None:
        fd.save(drafter, out, meta, self.cfg.method)

    def curve(self) -> tuple[str, str]:
        return f"{self.target.spec}: {self.what}", "KL + SmoothL1"


def train(cfg: FeatureConfig) -> Path:
    return run(FeatureRecipe(cfg))
