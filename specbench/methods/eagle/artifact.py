"""The EAGLE-style feature drafter (Li et al. 2024, "EAGLE", §4) and its parallel form with [MASK] inputs
(Xiao et al. 2024, "ParallelSpec", §4.1), and their artefacts.

Input at drafter position i: fc([f_i ; e(x_{i+1})]), the target's last (normed) hidden state at position i
concatenated with the embedding of the token after it, projected to the hidden size (fc [H, 2H]). One decoder
layer of the target's architecture (a copy of the target's last layer to start) and a copy of its final norm turn
that into the predicted feature of position i + 1, which the target's frozen LM head reads: q(x_{i+2}).
Drafting autoregressively (`eagle`), the next input pairs the predicted feature with the drafted token.
With k mask inputs (`parallelspec`), k trained vectors [k, H] (in the layer's input space, in place of a fused
pair) follow the last real input at positions i+1..i+k; mask j sees the context and masks 1..j and predicts the
feature of position i+1+j: one forward gives k + 1 draft distributions. Embeddings and LM head are the target's
(frozen references, never stored); `vocab_ids` restricts the head to the K most frequent tokens (`--vocab-top`).

Artefact folder (`specbench train eagle` -> artifacts/<model>/eagle; `train parallelspec` -> .../parallelspec):
  feature-drafter.safetensors   fc, layers.0.*, norm.* (+ masks [k, H], vocab_ids [K])
  eagle.yaml | parallelspec.yaml  model, model_key, hidden_size, vocab_size, mask_tokens, vocab_top, training facts
`eagle` also reads the authors' released EAGLE-1/2 checkpoints (released.py): the same function with fc's bias
on, the layer's input norm and the final norm off (`fc_bias`, `input_norm`, `final_norm`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from ...core.batch.cache import crop_to, new_cache
from ...core.model.cpu_kernels import prepack
from ...core.batch.forward import with_cache
from ...core.machine.timing import median_call_ms
from ...core.model.load import LoadedModel
from ...errors import SpecbenchError
from ...core import artifact_files as af
from ..sd.drafter import SharedHeadDrafter, causal_mask
from . import released

WEIGHTS_FILE = "feature-drafter.safetensors"
OWN_VARIANT = {"fc_bias": False, "input_norm": True, "final_norm": True}  # specbench's drafter (metadata defaults)
META_FILES = {"eagle": "eagle.yaml", "parallelspec": "parallelspec.yaml"}
TRAIN = {"eagle": "specbench train eagle", "parallelspec": "specbench train parallelspec"}


class FeatureDrafter(SharedHeadDrafter):
    """One decoder layer over fused (feature, next-token embedding) inputs, plus `mask_tokens` mask inputs."""

    def __init__(self, target_model: torch.nn.Module, mask_tokens: int = 0, vocab_ids: torch.Tensor | None = None,
                 *, fc_bias: bool = False, input_norm: bool = True, final_norm: bool = True):
        last = target_model.config.num_hidden_layers - 1
        super().__init__(target_model, [last], vocab_ids)
        weight = self.norm.weight
        hidden = weight.shape[0]
        self.fc = torch.nn.Linear(2 * hidden, hidden, bias=fc_bias).to(weight.device, weight.dtype)
        with torch.no_grad():  # start as f + e: both halves pass through unchanged
            self.fc.weight.copy_(torch.cat([torch.eye(hidden), torch.eye(hidden)], 1))
            if fc_bias:
                self.fc.bias.zero_()
        self.masks = torch.nn.Parameter(torch.zeros(mask_tokens, hidden, device=weight.device, dtype=weight.dtype))
        if not input_norm:  # the fused input enters attention as it is (EAGLE's released drafters)
            self.layers[0].input_layernorm = torch.nn.Identity()
        self.final_norm = final_norm  # off: the LM head reads the layer's output directly

    @property
    def variant(self) -> dict:
        """How this drafter departs from specbench's own (the metadata fields that rebuild it)."""
        return {"fc_bias": self.fc.bias is not None, "final_norm": self.final_norm,
                "input_norm": not isinstance(self.layers[0].input_layernorm, torch.nn.Identity)}

    @property
    def mask_tokens(self) -> int:
        return self.masks.shape[0]

    def fuse(self, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """features [n, H] (f_i) and tokens [n] (x_{i+1}) -> the layer's inputs [n, H]."""
        e = self._shared[0](tokens).to(features.dtype)
        return self.fc(torch.cat([features, e], -1))

    def run(self, x: torch.Tensor, position_ids: torch.Tensor, cache=None,
            mask: torch.Tensor | None = None, **attention_kwargs) -> torch.Tensor:
        """x [1, n, H] inputs at position_ids [1, n] -> predicted features [n, H]; mask: additive [1, 1, n, kv]
        (default causal over the cache)."""
        return self.features(x, position_ids, cache, mask, **attention_kwargs)[0]

    def features(self, x: torch.Tensor, position_ids: torch.Tensor, cache=None, mask: torch.Tensor | None = None,
                 **attention_kwargs) -> torch.Tensor:
        """x [B, n, H] -> predicted features [B, n, H]; attention_kwargs reach the attention function (the batch
        engines' packed or padded attention, core/batch/ragged.py and core/batch/padded.py, whose masks they carry)."""
        if mask is None and "ragged" not in attention_kwargs:
            past = cache.get_seq_length() if cache is not None else 0
            mask = causal_mask(past, x.shape[1], x.shape[0], x.dtype, x.device)
        pos_emb = self.rotary_emb(x, position_ids=position_ids)
        h = x
        for layer in self.layers:
            h = layer(h, attention_mask=mask, position_ids=position_ids, **with_cache(cache),
                      use_cache=cache is not None, position_embeddings=pos_emb, **attention_kwargs)
        return self.norm(h) if self.final_norm else h

    def hidden(self, input_ids: torch.Tensor | None, position_ids: torch.Tensor, cache=None,
               attention_mask: torch.Tensor | None = None, *, inputs_embeds: torch.Tensor | None = None,
               **attention_kwargs) -> torch.Tensor:
        """What the batch engines run (core/batch/decoder.py): inputs_embeds [B, n, H] (fused pairs or masks) ->
        predicted features [B, n, H]; token ids alone run the layers on their embeddings, as the causal-LM call does."""
        if inputs_embeds is None:
            return super().hidden(input_ids, position_ids, cache, attention_mask, **attention_kwargs)
        return self.features(inputs_embeds, position_ids, cache, attention_mask, **attention_kwargs)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """Predicted features [..., H] ([n, H] from a proposer, [B, n, H] from a batch engine's step) -> float
        logits [..., V] (restricted heads: -inf outside vocab_ids)."""
        small = self.head_logits(features).float()  # [..., K]
        if self.vocab_ids is None:
            return small
        full = small.new_full((*small.shape[:-1], self.vocab_size), float("-inf"))
        return full.index_copy(small.dim() - 1, self.vocab_ids, small)

    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.parameters())


def group_layout(n: int, points: list[int], k: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-wise parallel training (ParallelSpec §4.1, Figure 3): n real inputs (positions 0..n-1), then for
    every point i in `points` a parallel group of k masks at positions i+1..i+k. Returns (position ids [Q],
    visibility [Q, Q] bool) with Q = n + len(points) * k: a real input sees the real inputs up to it and no mask;
    mask j of point i sees real inputs 0..i and masks 1..j of its own group (never another group's masks)."""
    q = n + len(points) * k
    vis = torch.zeros(q, q, dtype=torch.bool)
    vis[:n, :n] = torch.ones(n, n, dtype=torch.bool).tril()
    pos = list(range(n))
    for g, i in enumerate(points):
        start = n + g * k
        for j in range(k):
            vis[start + j, : i + 1] = True
            vis[start + j, start:start + j + 1] = True
            pos.append(i + 1 + j)
    return torch.tensor(pos, device=device), vis.to(device)


@dataclass
class FeatureArtifact:
    drafter: FeatureDrafter
    meta: dict = field(default_factory=dict)
    source: str = ""


def save(drafter: FeatureDrafter, out: Path, meta: dict, method: str, storage_dtype=torch.bfloat16) -> None:
    """Weights stored in `storage_dtype` (bfloat16: half the size; the drafter only proposes, so its rounding never
    changes what a lossless method emits), vocab_ids as integers."""
    from safetensors.torch import save_file

    state = {n: (t.to(storage_dtype) if t.is_floating_point() else t) for n, t in drafter.own_state().items()}
    meta = {**meta, **{k: v for k, v in drafter.variant.items() if v != OWN_VARIANT[k]}}  # rebuilt by `load`
    try:
        out.mkdir(parents=True, exist_ok=True)
        save_file(state, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
        (out / META_FILES[method]).write_text(yaml.safe_dump(meta, sort_keys=False))
    except OSError as exc:
        raise SpecbenchError(f"cannot write {out}: {exc.strerror or exc}") from exc


def load(path: str | Path, target: LoadedModel, method: str) -> FeatureArtifact:
    path = Path(path)
    meta = af.read_meta(path, META_FILES[method], {"model": str, "hidden_size": int, "vocab_size": int,
                                                   "mask_tokens": int}, {name: bool for name in OWN_VARIANT})
    af.check_model(meta, path, target, TRAIN[method])
    k = meta["mask_tokens"]
    if k < 0 or (method == "parallelspec" and k < 1):
        raise SpecbenchError(f"{path / META_FILES[method]}: field `mask_tokens` must be at least "
                             f"{1 if method == 'parallelspec' else 0} (found {k})")
    from safetensors import safe_open

    if not (path / WEIGHTS_FILE).is_file():
        raise SpecbenchError(f"{path}: {META_FILES[method]} but no {WEIGHTS_FILE}; retrain it with `{TRAIN[method]}`")
    with safe_open(str(path / WEIGHTS_FILE), "pt") as f:
        restricted = "vocab_ids" in f.keys()
    vocab_ids = None
    if restricted:
        vocab_ids = af.load_weights(path, WEIGHTS_FILE, {"vocab_ids": (None,)})["vocab_ids"].long()
    drafter = FeatureDrafter(target.model, k, vocab_ids, **{n: meta.get(n, v) for n, v in OWN_VARIANT.items()})
    return FeatureArtifact(_filled(drafter, af.load_weights(path, WEIGHTS_FILE, _own_shapes(drafter))), meta,
                           str(path))


def load_released(path: str | Path, target: LoadedModel) -> FeatureArtifact:
    """An EAGLE-1/2 checkpoint as the authors publish it (released.py), refused when it belongs to another model."""
    checkpoint = released.read(Path(path), target)
    drafter = FeatureDrafter(target.model, **checkpoint.variant)
    tensors = checkpoint.tensors(_own_shapes(drafter))
    return FeatureArtifact(_filled(drafter, tensors), checkpoint.meta, checkpoint.source)


def _own_shapes(drafter: FeatureDrafter) -> dict[str, tuple]:
    """The tensors an artefact must give this drafter: its own state, less a final norm it skips and empty masks."""
    return {name: tuple(t.shape) for name, t in drafter.own_state().items()
            if name != "vocab_ids" and t.numel() and (drafter.final_norm or not name.startswith("norm."))}


def _filled(drafter: FeatureDrafter, tensors: dict[str, torch.Tensor]) -> FeatureDrafter:
    dtype = drafter.norm.weight.dtype
    drafter.load_state_dict({n: t.to(dtype) for n, t in tensors.items()}, strict=False)
    drafter.requires_grad_(False).eval()
    prepack(drafter)
    return drafter


def resolve(spec: str | None, target: LoadedModel, method: str) -> FeatureArtifact:
    """--artifact: None = this model's shipped drafter for `method`; else a folder written by `train <method>`, or
    for eagle an EAGLE-1/2 checkpoint in the authors' published layout (released.py)."""
    if spec and method == "eagle" and released.holds(Path(spec)):
        return load_released(spec, target)
    what = "EAGLE drafter" if method == "eagle" else "ParallelSpec drafter"
    path = af.locate_dir(spec, target, method, META_FILES[method], what, TRAIN[method],
                         released.EXPECTED if method == "eagle" else "")
    return load(path, target, method)


@torch.inference_mode()
def forward_ms(drafter: FeatureDrafter, rows: int, context: int = 256, repeats: int = 20) -> float:
    """Median milliseconds of one drafting forward: `rows` inputs on a cache of `context` positions, then the head
    on every row (build-tree adds this per drafter forward to the target's step latency)."""
    weight = drafter.norm.weight
    cache = new_cache(drafter)
    x = torch.randn(1, context, weight.shape[0], device=weight.device, dtype=weight.dtype)
    drafter.run(x, torch.arange(context, device=weight.device)[None], cache)
    new = torch.randn(1, rows, weight.shape[0], device=weight.device, dtype=weight.dtype)
    pos = torch.arange(context, context + rows, device=weight.device)[None]
    return median_call_ms(lambda: drafter.logits(drafter.run(new, pos, cache)), weight.device, repeats,
                          reset=lambda: crop_to(cache, context))
