"""Drafters for `sd` and `pearl`: a small model sharing the target's tokenizer, token embeddings and LM head
(frozen, referenced, never copied), with L decoder layers of its own initialised from the target's layers and
trained by self-distillation (`specbench train drafter`, DistillSpec-style; used as M_q in PEARL's notation).

Also: the shipped drafter artefact of the embedded default (artifacts/<model>/drafter/), resolving `--drafter`,
and the vocabulary check that refuses a drafter whose tokenizer differs from the target's.
Works for Llama-style targets (base model with .layers, .norm, .rotary_emb).
"""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
import yaml

from ...core import store
from ...core.model.cpu_kernels import prepack
from ...core.batch.cache import window_mask
from ...core.batch.decoder import DraftModule
from ...core.batch.forward import with_cache
from ...core.model.placement import output_device, own_copy, resident, state_dict_of, weight_of
from ...core.model.load import LoadedModel, load_model
from ...errors import SpecbenchError

WEIGHTS_FILE, META_FILE = "drafter.safetensors", "drafter.yaml"


def causal_mask(past: int, n: int, batch: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Additive 4-D mask [batch, 1, n, past + n]: 0 where query i may attend key j (j <= past + i), else -max."""
    q = torch.arange(n, device=device).unsqueeze(1) + past  # [n, 1]
    k = torch.arange(past + n, device=device).unsqueeze(0)  # [1, past + n]
    mask = torch.zeros(n, past + n, dtype=dtype, device=device).masked_fill(k > q, torch.finfo(dtype).min)
    return mask[None, None].expand(batch, 1, n, past + n)


class SharedHeadDrafter(DraftModule):
    """L decoder layers of the target's architecture between the target's embeddings and LM head.

    Only the layers and the final norm are parameters of this module; the target's embedding and head are held
    as references (not submodules), so they are neither trained nor saved. With `vocab_ids` [K] the head scores
    only those K tokens (--vocab-top K): cheaper drafts, the other tokens are never drafted (logits -inf).
    """

    def __init__(self, target_model: torch.nn.Module, layer_ids: list[int], vocab_ids: torch.Tensor | None = None):
        super().__init__()
        base = target_model.base_model
        self.config = copy.deepcopy(target_model.config)
        self.config.num_hidden_layers = len(layer_ids)
        if getattr(self.config, "layer_types", None):
            self.config.layer_types = [self.config.layer_types[i] for i in layer_ids]
        self.layer_ids = list(layer_ids)
        self.layers = torch.nn.ModuleList()
        for i, src in enumerate(layer_ids):  # copies of the target's layers, offloaded ones read from their store
            layer = type(base.layers[src])(self.config, i)
            layer.load_state_dict(state_dict_of(base.layers[src]))
            self.layers.append(layer)
        self.norm = own_copy(base.norm)
        # one device for the drafter: the target's LM head's (the states and head it reads live there)
        device, dtype = output_device(target_model), self.norm.weight.dtype
        self.to(device=device, dtype=dtype)
        self.rotary_emb = type(base.rotary_emb)(config=self.config).to(device)  # inv_freq stays float32
        self.register_buffer("vocab_ids", None if vocab_ids is None else vocab_ids.to(device).long())
        # references to the target's frozen modules: a tuple is not registered as a submodule. An offloaded one
        # (disk / CPU offload) gets a resident copy instead: its hook swaps the weights in and out around each
        # forward, which PEARL's drafter thread and target thread would otherwise race on
        self._shared = (resident(target_model.get_input_embeddings()), resident(target_model.get_output_embeddings()))
        self._head_k: torch.Tensor | None = None  # rows of the head for vocab_ids (derived, never saved)

    @property
    def vocab_size(self) -> int:
        return self._shared[1].weight.shape[0]

    def get_input_embeddings(self):
        return self._shared[0]

    def get_output_embeddings(self):
        return self._shared[1]

    def hidden(self, input_ids: torch.Tensor | None, position_ids: torch.Tensor, cache=None,
               attention_mask: torch.Tensor | None = None, *, inputs_embeds: torch.Tensor | None = None,
               **attention_kwargs) -> torch.Tensor:
        """input_ids [B, n] (or their embeddings, inputs_embeds [B, n, H]) -> normed final hidden states [B, n, H].
        attention_mask: a 4-D additive mask (padded batches; default causal); attention_kwargs reach the attention
        function (core/batch/ragged.py's packed batches)."""
        x = inputs_embeds if inputs_embeds is not None else self._shared[0](input_ids)
        h = x.to(self.norm.weight.device)  # [B, n, H] (embeddings may sit elsewhere)
        position_ids = position_ids.to(h.device)
        past = cache.get_seq_length() if cache is not None else 0
        mask = attention_mask
        if mask is None and "ragged" not in attention_kwargs:  # causal, the target's sliding windows applied
            mask = window_mask(self, causal_mask(past, h.shape[1], h.shape[0], h.dtype, h.device),
                               position_ids[:1])
        kinds = getattr(self.config, "layer_types", None) or ["full_attention"] * len(self.layers)
        pos_emb = self.rotary_emb(h, position_ids=position_ids)
        for layer, kind in zip(self.layers, kinds):  # a mask per layer kind (hybrid models) or one for all
            own = mask.get(kind, mask.get("full_attention")) if isinstance(mask, dict) else mask
            h = layer(h, attention_mask=own, position_ids=position_ids, **with_cache(cache),
                      use_cache=cache is not None, position_embeddings=pos_emb, **attention_kwargs)
        return self.norm(h)

    def head_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Hidden [B, n, H] -> logits over the drafter's vocabulary [B, n, K] (K = V without --vocab-top)."""
        head = self._shared[1]
        if self.vocab_ids is None:
            return head(h)
        if self._head_k is None or self._head_k.device != h.device or self._head_k.dtype != h.dtype:
            rows = weight_of(head).detach()  # [V, H] (a real copy when the head is offloaded)
            self._head_k = rows[self.vocab_ids.to(rows.device)].to(h.device, h.dtype)  # [K, H]
        return F.linear(h, self._head_k)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None, cache=None,
                use_cache: bool = True, logits_to_keep: int | torch.Tensor = 0,
                attention_mask: torch.Tensor | None = None, past_key_values=None, **attention_kwargs):
        """The causal-LM call the methods use; logits [B, n, V] over the full vocabulary (logits_to_keep: the last
        n positions, or a tensor of the positions to keep, as transformers' models take it)."""
        cache = cache if cache is not None else past_key_values  # either keyword (core/batch/forward.CACHE_KEYWORD)
        if position_ids is None:
            past = cache.get_seq_length() if cache is not None else 0
            position_ids = torch.arange(past, past + input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        h = self.hidden(input_ids, position_ids, cache if use_cache else None, attention_mask,
                        **attention_kwargs)
        if isinstance(logits_to_keep, torch.Tensor):
            h = h[:, logits_to_keep]
        elif logits_to_keep:
            h = h[:, -logits_to_keep:]
        return SimpleNamespace(logits=self.logits(h))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Hidden [..., H] -> logits over the full vocabulary [..., V] (-inf outside vocab_ids)."""
        logits = self.head_logits(h)  # [..., K]
        if self.vocab_ids is not None:
            full = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))  # [..., V]
            full[..., self.vocab_ids] = logits
            logits = full
        return logits

    def top_ids(self, h: torch.Tensor, k: int) -> torch.Tensor:
        """Hidden [n, H] -> ids [n, k] of the k largest logits, as logits(h).topk(k) gives them, without the full
        [n, V] row (greedy drafting: with --vocab-top the head is K rows, so the top-k over K and a gather)."""
        top = self.head_logits(h).float().topk(k, -1).indices  # [n, k] of [n, K]
        return top if self.vocab_ids is None else self.vocab_ids[top]

    def on_device(self, device: torch.device) -> "SharedHeadDrafter":
        """A copy on another device (PEARL's `devices` mode), with its own copy of the embedding and head there."""
        other = copy.deepcopy(self)
        other._shared = tuple(module.to(device) for module in other._shared)
        other._head_k = None
        return other.to(device)

    def own_state(self) -> dict[str, torch.Tensor]:
        """What an artefact stores: the drafter's layers and norm (and vocab ids), never embeddings or head."""
        return {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}


def wrap(target: LoadedModel, module: torch.nn.Module, spec: str, meta: dict | None = None) -> LoadedModel:
    """A drafter module as a LoadedModel sharing the target's tokenizer and device."""
    return LoadedModel(module.eval(), target.tokenizer, spec, f"{target.name}-drafter-{len(module.layers)}L",
                       target.device, target.dtype, target.context_length, "trained drafter" if meta else "untrained",
                       {"meta": meta or {}})


def layer_drafter(target: LoadedModel, layer_ids: list[int], vocab_ids: torch.Tensor | None = None) -> LoadedModel:
    """An untrained drafter made of copies of some of the target's layers (the training start; tests)."""
    module = SharedHeadDrafter(target.model, layer_ids, vocab_ids).requires_grad_(False)
    prepack(module)
    return wrap(target, module, f"layers{layer_ids}")


def save_artifact(module: SharedHeadDrafter, out: Path, meta: dict, storage_dtype=torch.bfloat16) -> None:
    """drafter.safetensors (own layers + norm, stored in `storage_dtype`) and drafter.yaml (metadata)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    state = {k: (v.to(storage_dtype) if v.is_floating_point() else v) for k, v in module.own_state().items()}
    save_file(state, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    (out / META_FILE).write_text(yaml.safe_dump(meta, sort_keys=False))


def is_artifact(path: str | Path) -> bool:
    return (Path(path) / META_FILE).is_file() and (Path(path) / WEIGHTS_FILE).is_file()


def load_artifact(path: str | Path, target: LoadedModel, check_fingerprint: bool = True) -> LoadedModel:
    """A trained drafter artefact for this target (refused when it was trained for another model)."""
    from safetensors.torch import load_file

    path = Path(path)
    if not is_artifact(path):
        raise SpecbenchError(f"{path}: not a drafter artefact (needs {META_FILE} and {WEIGHTS_FILE}); train one "
                             "with `specbench train drafter`.")
    meta = yaml.safe_load((path / META_FILE).read_text()) or {}
    want = meta.get("target_fingerprint")
    if check_fingerprint and want and want != target.fingerprint():
        raise SpecbenchError(f"{path} was trained for {meta.get('target', '?')} (fingerprint {want}), not for "
                             f"{target.spec} ({target.fingerprint()}); train a drafter for this model with "
                             f"`specbench train drafter --model {target.spec}`.")
    state = load_file(str(path / WEIGHTS_FILE))
    vocab_ids = state.get("vocab_ids")
    module = SharedHeadDrafter(target.model, list(meta["init_layers"]), vocab_ids)
    module.load_state_dict({k: v.to(module.norm.weight.dtype) if v.is_floating_point() else v
                            for k, v in state.items()})
    module.requires_grad_(False)
    prepack(module)  # its own layers (the shared head is the target's, packed with it)
    return wrap(target, module, str(path), meta)


def default_artifact(target: LoadedModel) -> Path | None:
    """artifacts/<model key>/drafter in the working directory (where `specbench train drafter` writes), else the
    repo's (the key: core/model/naming.model_slug)."""
    from ...core.model.load import model_slug

    key = model_slug(target.spec)
    for path in (store.artifact_dir(key, "drafter"), store.shipped_artifacts() / key / "drafter"):
        if is_artifact(path):
            return path
    return None


def default_drafter(target: LoadedModel) -> LoadedModel | None:
    """The shipped drafter for the target (loaded once per target), or None when the repo has none."""
    if "default_drafter" not in target.extras:
        path = default_artifact(target)
        target.extras["default_drafter"] = load_artifact(path, target) if path else None
    return target.extras["default_drafter"]


def resolve_drafter(spec: str, target: LoadedModel, dtype: str = "auto", device: str = "auto",
                    placement=None) -> LoadedModel:
    """--drafter: a drafter artefact folder (it lives with the target's LM head), or any model spec load_model
    accepts (same tokenizer as the target), placed by --drafter-device-map / --drafter-max-memory."""
    if is_artifact(spec):
        return load_artifact(spec, target)
    drafter = load_model(spec, dtype, device, placement=placement)
    check_vocabulary(target, drafter)
    return drafter


def check_vocabulary(target: LoadedModel, drafter: LoadedModel) -> None:
    """Refuse a drafter whose tokenizer differs from the target's (its token ids would mean other strings)."""
    if drafter.tokenizer is target.tokenizer or drafter.tokenizer.backend is target.tokenizer.backend:
        return
    t_vocab, d_vocab = _vocab(target), _vocab(drafter)
    if t_vocab != d_vocab:
        detail = (f"{len(d_vocab)} vs {len(t_vocab)} tokens" if len(d_vocab) != len(t_vocab)
                  else "same size, different token ids")
        raise SpecbenchError(
            f"drafter {drafter.spec} uses a different vocabulary than the target {target.spec} ({detail}). "
            "Speculative decoding needs the same tokenizer: pick a drafter of the same model family, or train "
            f"one with `specbench train drafter --model {target.spec}`.")


def _vocab(model: LoadedModel) -> dict:
    backend = model.tokenizer.backend
    if hasattr(backend, "get_vocab"):
        return backend.get_vocab()
    return {"__class__": type(backend).__name__, "size": getattr(backend, "vocab_size", None)}
