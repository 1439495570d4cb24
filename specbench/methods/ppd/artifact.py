"""PPD's prompt tokens (PPD §3.1-3.2): S trained embeddings, each E ensemble copies (EPT), and their artefact.

Artefact folder (`specbench train ppd` writes it; artifacts/<model>/ppd/ ships for the embedded default):
  prompt_tokens.safetensors   "embeddings" [S, E, H] float32 (a few KB; the model's own weights are never copied)
  ppd.yaml                    metadata: model, model_key, S, EPT, steps, data, final loss, training time, init ids
Also: the forward that feeds embeddings (token and prompt rows) through the frozen decoder with a custom mask.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from ...core import store
from ...core.artifact_files import model_key
from ...core.batch.cache import window_mask
from ...core.batch.forward import with_cache
from ...core.model.load import LoadedModel
from ...errors import SpecbenchError

WEIGHTS_FILE, META_FILE = "prompt_tokens.safetensors", "ppd.yaml"


@dataclass
class PromptTokens:
    embeddings: torch.Tensor  # [S, E, H] float32
    meta: dict = field(default_factory=dict)
    source: str = ""

    @property
    def count(self) -> int:
        return self.embeddings.shape[0]

    @property
    def ept(self) -> int:
        return self.embeddings.shape[1]

    def table(self, dtype: torch.dtype, device) -> torch.Tensor:
        """[S * E, H]: row j * E + e is prompt token j's ensemble copy e (Tree.prompt_rows indexes it)."""
        return self.embeddings.reshape(-1, self.embeddings.shape[-1]).to(device=device, dtype=dtype)


def from_token_ids(target: LoadedModel, token_ids: list[int], count: int, ept: int) -> torch.Tensor:
    """Initial prompt tokens [S, E, H]: copies of real token embeddings (PPD §5: initialised with text tokens)."""
    from ...core.model.placement import weight_of

    weight = weight_of(target.model.get_input_embeddings()).detach()
    return weight[torch.tensor(token_ids, device=weight.device)].float().cpu().reshape(count, ept, -1).clone()


def untrained(target: LoadedModel, count: int = 3, ept: int = 1, seed: int = 0) -> PromptTokens:
    """Prompt tokens that were never trained: embeddings of random real tokens (tests; the untrained baseline)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, target.vocab_size, (count * ept,), generator=g).tolist()
    return PromptTokens(from_token_ids(target, ids, count, ept),
                        {"untrained": True, "init_token_ids": ids, "prompt_tokens": count, "ept": ept},
                        f"untrained:{count}")


def save(tokens: PromptTokens, out: Path) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file({"embeddings": tokens.embeddings.float().contiguous()}, str(out / WEIGHTS_FILE),
              metadata={"format": "pt"})
    (out / META_FILE).write_text(yaml.safe_dump(tokens.meta, sort_keys=False))


def load(path: str | Path, target: LoadedModel, initial: bool = False) -> PromptTokens:
    """A prompt-token artefact for this model (refused when trained for another). initial=True gives the
    embeddings it started from (the untrained baseline of the same run)."""
    from safetensors.torch import load_file

    path = Path(path)
    if not ((path / WEIGHTS_FILE).is_file() and (path / META_FILE).is_file()):
        raise SpecbenchError(f"{path}: not a prompt-token artefact (needs {WEIGHTS_FILE} and {META_FILE}); train "
                             f"one with `specbench train ppd --model {target.spec}`.")
    meta = yaml.safe_load((path / META_FILE).read_text()) or {}
    want = meta.get("model_key")
    if want and want != model_key(target):
        raise SpecbenchError(f"{path} holds prompt tokens trained for {meta.get('model', '?')} (key {want}), not "
                             f"for {target.spec} ({model_key(target)}); train them for this model with "
                             f"`specbench train ppd --model {target.spec}`.")
    emb = load_file(str(path / WEIGHTS_FILE))["embeddings"].float()  # [S, E, H]
    if emb.ndim != 3 or emb.shape[-1] != target.model.config.hidden_size:
        raise SpecbenchError(f"{path}: embeddings of shape {list(emb.shape)} do not fit {target.spec} (hidden size "
                             f"{target.model.config.hidden_size}); retrain with `specbench train ppd`.")
    if initial:
        emb = from_token_ids(target, list(meta["init_token_ids"]), emb.shape[0], emb.shape[1])
    return PromptTokens(emb, meta, str(path) + (" (initial)" if initial else ""))


def default_path(target: LoadedModel | str) -> Path:
    """artifacts/<model key>/ppd in the working directory (where `specbench train ppd` writes), else the repo's
    (the key: core/model/naming.model_slug, the same for every command)."""
    from ...core.model.load import model_slug

    return store.find_artifact_dir(model_slug(target if isinstance(target, str) else target.spec), "ppd", META_FILE)


def resolve(spec: str | None, target: LoadedModel) -> PromptTokens:
    """--artifact: None = the shipped artefact of this model; `untrained[:S]` = random real-token embeddings;
    a folder written by `specbench train ppd`."""
    if spec and spec.startswith("untrained"):
        count = spec.partition(":")[2]
        if count and not count.isdigit():
            raise SpecbenchError(f"--artifact {spec}: use untrained or untrained:<prompt tokens>")
        return untrained(target, int(count or 3))
    if spec is None:
        path = default_path(target)
        if not (path / META_FILE).is_file():
            from ...core.model.load import model_slug

            raise SpecbenchError(f"no prompt tokens for {target.spec} (looked for artifacts/{model_slug(target.spec)}"
                                 f"/ppd here and in the repo): train them with `specbench train ppd --model "
                                 f"{target.spec}` (it writes that folder, which is then found by itself), or pass "
                                 "--artifact <folder>.")
        return load(path, target)
    return load(spec, target)


# ------------------------------------------------------------------------------------------------- forward

def embed(model, token_ids: torch.Tensor, prompt_rows: torch.Tensor | None) -> torch.Tensor:
    """token_ids [n] and prompt embeddings [P, H] -> inputs_embeds [1, n + P, H] (tokens first)."""
    h = model.get_input_embeddings()(token_ids)  # [n, H]
    if prompt_rows is not None and prompt_rows.shape[0]:
        h = torch.cat([h, prompt_rows.to(h.dtype)])
    return h.unsqueeze(0)


def hidden(model, inputs_embeds: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor,
           cache=None) -> torch.Tensor:
    """The frozen decoder on inputs_embeds [1, q, H] with an additive mask [1, 1, q, kv] -> normed hidden [q, H]
    (logits only for the rows a caller needs: core/batch/forward.target_logits(model, hidden[rows]))."""
    mask = window_mask(model, mask, position_ids)  # sliding-window layers: their window applied to the mask
    out = model.get_decoder()(inputs_embeds=inputs_embeds, attention_mask=mask, position_ids=position_ids,
                              **with_cache(cache), use_cache=cache is not None)
    return out.last_hidden_state[0]


def insertion_inputs(points: list[int], count: int, ept: int, past: int, dtype: torch.dtype,
                     device, see_earlier: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prompt tokens inserted after many real positions at once, on top of a cache of `past` real tokens
    (training with random insertion, PPD §3.3; acceptance estimates). Block b, inserted after real position
    points[b], holds inputs (j, e) in that order; (b, j, e) sees real positions <= points[b] and (b, j' <= j, e)
    (the ensemble mask, PPD §3.2), at position points[b] + 1 + j. see_earlier=False drops (b, j' < j, e): each
    input sees the real positions and itself only (Hidden Transfer's "Masked" ablation).
    Returns mask [1, 1, q, past + q], position_ids [1, q] and the embedding row of every input [q]."""
    per = count * ept
    q = len(points) * per
    j = torch.arange(count, device=device).repeat_interleave(ept).repeat(len(points))  # [q]
    e = torch.arange(ept, device=device).repeat(count * len(points))  # [q]
    b = torch.arange(len(points), device=device).repeat_interleave(per)  # [q]
    at = torch.tensor(points, device=device)[b]  # [q]
    allowed_real = torch.arange(past, device=device)[None, :] <= at[:, None]  # [q, past]
    earlier = j[None, :] <= j[:, None] if see_earlier else j[None, :] == j[:, None]
    allowed_own = (b[:, None] == b[None, :]) & (e[:, None] == e[None, :]) & earlier  # [q, q]
    allowed = torch.cat([allowed_real, allowed_own], dim=1)
    mask = torch.zeros(q, past + q, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[None, None], (at + 1 + j).unsqueeze(0), j * ept + e
