"""The EAGLE-3 drafter (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of Large Language Models via
Training-Time Test", §3): one decoder layer over the target's fused low, middle and high-layer features.

Input at drafter position i, at the first step: g_i = [l_i ; m_i ; h_i] [3H_t], the target's hidden states entering
its decoder layers 2, L // 2 and L - 3 (the EAGLE repository's choice, eagle/model/modeling_llama_kv.py), projected
by fc [H, 3H_t] to a = fc(g_i) [H]; paired with the embedding e of the token after position i. The layer
(`Eagle3Layer`) normalises both halves separately (input_layernorm on e, hidden_norm on a), reads the
concatenation [2H] in its attention projections and keeps a as its residual stream; its output o [H] (before the
final norm) is the drafter's own feature, which replaces fc(g) as the hidden half of the next drafted input (the
training-time test trains exactly that: training.py). Tokens come from lm_head(norm(o)) over a reduced draft
vocabulary of K tokens; draft id d is target id d + d2t[d], and t2d [V] marks the target ids the head covers.

The drafter's state names follow the EAGLE repository's published EAGLE-3 checkpoints (fc.weight, midlayer.*,
norm.weight, lm_head.weight, d2t, t2d; eagle/model/cnets.py), so one loader reads both those and specbench's own
artefact (artifact.py). The target's token embeddings are shared (a frozen reference), unless a checkpoint brings
its own embed_tokens.weight.

Interface for the feature drafting of methods/eagle/ (drafting.py, dynamic_tree.py): fuse (pairs of a
feature and the next token -> layer inputs [n, 2H]), run / hidden (inputs -> features o [n, H]), logits, head_logits,
top_ids, vocab_ids (the draft vocabulary as target ids).
"""

from __future__ import annotations

import copy

import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding

from ...core.batch.decoder import DraftModule
from ...core.batch.forward import with_cache
from ..sd.drafter import causal_mask


def drafter_config(hidden: int, heads: int, kv_heads: int, intermediate: int, eps: float, rope_theta: float,
                   max_positions: int, vocab: int, head_dim: int | None = None,
                   rope_scaling: dict | None = None) -> LlamaConfig:
    """The Llama configuration of the drafter's one layer (EAGLE-3's layer is Llama's, whatever the target)."""
    cfg = LlamaConfig(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      intermediate_size=intermediate, rms_norm_eps=eps, max_position_embeddings=max_positions,
                      vocab_size=vocab, num_hidden_layers=1, head_dim=head_dim or hidden // heads,
                      rope_theta=rope_theta, rope_scaling=rope_scaling)
    cfg._attn_implementation = "sdpa"
    return cfg


def config_from_target(target_config) -> LlamaConfig:
    """A drafter layer of the target's own shape (specbench's trained drafter)."""
    c = target_config
    rope = getattr(c, "rope_parameters", None) or {}
    return drafter_config(c.hidden_size, c.num_attention_heads, getattr(c, "num_key_value_heads", None)
                          or c.num_attention_heads, c.intermediate_size, getattr(c, "rms_norm_eps", 1e-6),
                          getattr(c, "rope_theta", None) or rope.get("rope_theta", 10000.0),
                          c.max_position_embeddings, c.vocab_size, getattr(c, "head_dim", None))


class Eagle3Layer(torch.nn.Module):
    """EAGLE-3's decoder layer: attention over [input_layernorm(e) ; hidden_norm(a)] [2H], residual a, then the MLP."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        h = config.hidden_size
        self.hidden_size = h
        self.self_attn = LlamaAttention(config, 0)
        d = config.head_dim
        for name, heads in (("q_proj", config.num_attention_heads), ("k_proj", config.num_key_value_heads),
                            ("v_proj", config.num_key_value_heads)):  # the projections read 2H
            setattr(self.self_attn, name, torch.nn.Linear(2 * h, heads * d, bias=False))
        self.mlp = LlamaMLP(config)
        self.hidden_norm = LlamaRMSNorm(h, config.rms_norm_eps)
        self.input_layernorm = LlamaRMSNorm(h, config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(h, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, attention_mask=None, position_embeddings=None, cache=None,
                **attention_kwargs) -> torch.Tensor:
        """x [B, n, 2H] = [e ; a] (raw) -> o [B, n, H]."""
        e, a = x.split(self.hidden_size, -1)
        joint = torch.cat([self.input_layernorm(e), self.hidden_norm(a)], -1)
        attended, _ = self.self_attn(joint, position_embeddings=position_embeddings, attention_mask=attention_mask,
                                     **with_cache(cache), **attention_kwargs)
        h = a + attended
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Drafter(DraftModule):
    """fc, one Eagle3Layer (`midlayer`), the final norm and a head over K draft tokens (module docstring)."""

    def __init__(self, config: LlamaConfig, target_hidden: int, draft_ids: torch.Tensor,
                 embeddings: torch.nn.Module):
        super().__init__()
        self.config = copy.deepcopy(config)
        h, k = config.hidden_size, draft_ids.shape[0]
        self.fc = torch.nn.Linear(3 * target_hidden, h, bias=False)
        self.midlayer = Eagle3Layer(self.config)
        self.norm = LlamaRMSNorm(h, config.rms_norm_eps)
        self.lm_head = torch.nn.Linear(h, k, bias=False)
        draft_ids = draft_ids.long()
        self.register_buffer("d2t", draft_ids - torch.arange(k))
        t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
        t2d[draft_ids] = True
        self.register_buffer("t2d", t2d)
        self.register_buffer("vocab_ids", draft_ids.clone(), persistent=False)  # draft id -> target id [K]
        self.rotary_emb = LlamaRotaryEmbedding(self.config)
        self._shared = (embeddings,)  # a reference: not a submodule, neither trained nor saved
        self.masks = torch.nn.Parameter(torch.zeros(0, h), requires_grad=False)  # no [MASK] inputs (eagle's k = 0)

    # ---------------------------------------------------------------- what the feature drafting reads

    @property
    def layers(self) -> list[torch.nn.Module]:
        """Its one decoder layer (what core/batch/decoder.decoder_layers finds: placement counts it)."""
        return [self.midlayer]

    @property
    def input_width(self) -> int:
        """Its inputs' width, 2H (what a compiled warm-up feeds it)."""
        return 2 * self.config.hidden_size

    @property
    def mask_tokens(self) -> int:
        return 0

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def target_hidden(self) -> int:
        return self.fc.in_features // 3

    def get_input_embeddings(self):
        return self._shared[0]

    def get_output_embeddings(self):
        return self.lm_head  # its own head over the draft vocabulary

    def fuse(self, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """features [n, 3H_t] (the target's fused states g_i) or [n, H] (the drafter's own o), tokens [n] (the token
        after each) -> the layer's inputs [n, 2H] = [e ; a] (a = fc(g) for the target's)."""
        weight = self.fc.weight
        a = features.to(weight.dtype)
        if a.shape[-1] == self.fc.in_features:
            a = self.fc(a)
        e = self._shared[0](tokens.to(self._shared[0].weight.device)).to(weight.device, weight.dtype)
        return torch.cat([e, a], -1)

    def features(self, x: torch.Tensor, position_ids: torch.Tensor, cache=None, mask: torch.Tensor | None = None,
                 **attention_kwargs) -> torch.Tensor:
        """x [B, n, 2H] at position_ids [B, n] -> o [B, n, H]; mask additive [B, 1, n, kv] (default causal)."""
        if mask is None and "ragged" not in attention_kwargs:
            past = cache.get_seq_length() if cache is not None else 0
            mask = causal_mask(past, x.shape[1], x.shape[0], x.dtype, x.device)
        pos_emb = self.rotary_emb(x, position_ids=position_ids)
        return self.midlayer(x, attention_mask=mask, position_embeddings=pos_emb, cache=cache,
                             position_ids=position_ids, **attention_kwargs)

    def run(self, x: torch.Tensor, position_ids: torch.Tensor, cache=None, mask: torch.Tensor | None = None,
            **attention_kwargs) -> torch.Tensor:
        """x [1, n, 2H] -> o [n, H]."""
        return self.features(x, position_ids, cache, mask, **attention_kwargs)[0]

    def hidden(self, input_ids, position_ids, cache=None, attention_mask=None, *, inputs_embeds=None,
               **attention_kwargs) -> torch.Tensor:
        """What the batch engines run: inputs_embeds [B, n, 2H] (fused pairs) -> o [B, n, H]. Token embeddings
        alone [B, n, H] (a compiled warm-up's plain-token shape; drafting never feeds them) pair with a zero
        feature."""
        x = inputs_embeds if inputs_embeds is not None else self._shared[0](input_ids)
        if x.shape[-1] != self.input_width:
            x = torch.cat([x, torch.zeros_like(x)], -1)
        return self.features(x, position_ids, cache, attention_mask, **attention_kwargs)

    def head_logits(self, o: torch.Tensor) -> torch.Tensor:
        """o [..., H] -> logits over the draft vocabulary [..., K]."""
        return self.lm_head(self.norm(o))

    def logits(self, o: torch.Tensor) -> torch.Tensor:
        """o [..., H] -> float logits over the target's vocabulary [..., V] (-inf outside the draft vocabulary)."""
        small = self.head_logits(o).float()
        full = small.new_full((*small.shape[:-1], self.vocab_size), float("-inf"))
        full[..., self.vocab_ids] = small
        return full

    def top_ids(self, o: torch.Tensor, k: int) -> torch.Tensor:
        """o [n, H] -> target ids [n, k] of the k best draft tokens."""
        return self.vocab_ids[self.head_logits(o).float().topk(k, -1).indices]

    def place(self, device, dtype) -> "Eagle3Drafter":
        """Move to the device and dtype; the rotary frequencies stay float32 (as transformers' models keep them)."""
        self.to(device=device, dtype=dtype)
        self.rotary_emb = LlamaRotaryEmbedding(self.config).to(device)
        return self

    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def own_state(self) -> dict[str, torch.Tensor]:
        """The published layout's tensors (masks and the derived vocab_ids left out)."""
        return {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items() if k != "masks"}


def initial(target_model: torch.nn.Module, draft_ids: torch.Tensor) -> Eagle3Drafter:
    """An untrained drafter for `target_model`: the layer starts as the target's last layer reading the sum of both
    halves (its q, k, v projections twice, both norms its input norm), fc passes the high-layer state through, and
    the head is the target's LM head rows of the draft vocabulary."""
    from ...core.model.placement import materialized, resident, weight_of

    base = target_model.base_model
    last = base.layers[-1]
    cfg = config_from_target(target_model.config)
    weight = weight_of(target_model.get_output_embeddings())  # a real copy where the head is offloaded
    drafter = Eagle3Drafter(cfg, cfg.hidden_size, draft_ids.cpu(), resident(target_model.get_input_embeddings()))
    h = cfg.hidden_size
    with torch.no_grad(), materialized(last), materialized(base.norm):  # offloaded layers' weights, real inside
        for name in ("q_proj", "k_proj", "v_proj"):
            w = getattr(last.self_attn, name).weight.detach().float().cpu()
            getattr(drafter.midlayer.self_attn, name).weight.copy_(torch.cat([w, w], 1))
        drafter.midlayer.self_attn.o_proj.weight.copy_(last.self_attn.o_proj.weight.detach().float().cpu())
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(drafter.midlayer.mlp, name).weight.copy_(getattr(last.mlp, name).weight.detach().float().cpu())
        gamma = last.input_layernorm.weight.detach().float().cpu()
        drafter.midlayer.input_layernorm.weight.copy_(gamma)
        drafter.midlayer.hidden_norm.weight.copy_(gamma)
        drafter.midlayer.post_attention_layernorm.weight.copy_(last.post_attention_layernorm.weight.detach().float())
        drafter.norm.weight.copy_(base.norm.weight.detach().float().cpu())
        drafter.fc.weight.zero_()
        drafter.fc.weight[:, 2 * h:].copy_(torch.eye(h))
        drafter.lm_head.weight.copy_(weight.detach()[draft_ids.to(weight.device)].float().cpu())
    return drafter.place(weight.device, weight.dtype)


