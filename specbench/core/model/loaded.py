"""A loaded model as every method sees it (LoadedModel: weights, tokenizer, device, dtype, fingerprint) and the finishing steps every loader shares."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import torch
from rich.markup import escape

from ...progress import console
from .cpu_kernels import packable, prepack, room_for_copies


class ByteTokenizer:
    """Byte-level tokenizer for random-weight test models: ids 0..255 are bytes, then BOS, EOS, PAD, spare."""

    vocab_size = 260
    bos_token_id, eos_token_id, pad_token_id = 256, 257, 258
    chat_template = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


@dataclass
class Tokenizer:
    """The tokenizer interface the runner needs: chat rendering, encode, decode, stop tokens."""

    backend: object
    stop_ids: tuple[int, ...]
    model_name: str = ""  # for the one-time plain-text note
    _noted_plain: bool = field(default=False, repr=False, compare=False)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.backend, "chat_template", None))

    @property
    def prompt_format(self) -> str:
        """How prompts are rendered: "chat template" or "plain text" (no template: turns joined, no reply marker)."""
        return "chat template" if self.has_chat_template else "plain text"

    def render(self, messages: list[dict]) -> list[int]:
        """Token ids of a conversation, ending where the assistant's next reply starts (with a chat template;
        without one, the turns as plain text, said once per loaded model)."""
        if self.has_chat_template:
            text = self.backend.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            return list(self.backend(text, add_special_tokens=False)["input_ids"])
        if not self._noted_plain:
            self._noted_plain = True
            console.print(f"[yellow]note[/]: {escape(self.model_name or 'this model')} has no chat template: prompts "
                          "go in as plain text with no reply marker, so a base model continues the text rather "
                          "than answering it (run.yaml records rendering: plain text).")
        text = "\n\n".join(m["content"] for m in messages)
        if isinstance(self.backend, ByteTokenizer):
            return [ByteTokenizer.bos_token_id] + self.backend.encode(text)
        return list(self.backend(text)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode(ids, skip_special_tokens=True)


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: Tokenizer
    spec: str
    name: str
    device: torch.device
    dtype: torch.dtype
    context_length: int
    source: str = ""
    extras: dict = field(default_factory=dict)
    placement: str = ""  # core/model/placement.label: "single:cpu", "map:0:16,1:14,disk:2", "tp2"

    @property
    def input_device(self) -> torch.device:
        """Where the token embedding computes (input ids, prompt tokens go there); `device` is this device."""
        from .placement import input_device

        return input_device(self.model)

    @property
    def output_device(self) -> torch.device:
        """Where the LM head computes: final hidden states and logits come back on this device."""
        from .placement import output_device

        return output_device(self.model)

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    @property
    def prompt_format(self) -> str:
        """"chat template" or "plain text": how this model's prompts are rendered (run.yaml records it)."""
        return self.tokenizer.prompt_format

    def fingerprint(self) -> str:
        """Short hash of architecture and a slice of the embeddings: artefacts trained for one model are refused
        by another. The embeddings are hashed at bfloat16 precision, so the same model loaded in float32 or
        bfloat16 has one fingerprint (a drafter trained in float32 serves a bf16 target)."""
        cfg = self.model.config.to_dict()
        keys = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size")
        h = hashlib.sha256(json.dumps({k: cfg.get(k) for k in keys}, sort_keys=True).encode())
        from .placement import weight_of

        emb = weight_of(self.model.get_input_embeddings())[:4, :16].detach().cpu().to(torch.bfloat16).float().numpy()
        h.update(emb.tobytes())
        return h.hexdigest()[:12]


def _stop_ids(backend, model) -> tuple[int, ...]:
    ids: set[int] = set()
    for source in (getattr(backend, "eos_token_id", None), getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(i) for i in source)
    if hasattr(backend, "convert_tokens_to_ids"):
        unk = getattr(backend, "unk_token_id", None)
        for tok in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>"):
            tid = backend.convert_tokens_to_ids(tok)
            if isinstance(tid, int) and tid != unk and tid >= 0:
                ids.add(tid)
    return tuple(sorted(ids))


def _finish(model, backend, spec, name, device, dtype, source) -> LoadedModel:
    from .placement import input_device, is_dispatched, label, tp_degree

    spread = is_dispatched(model) or tp_degree(model) > 1
    if spread:  # accelerate / tensor parallelism placed every module: moving it would undo that
        model.eval()
        device = input_device(model)
    else:
        model.to(device=device, dtype=dtype).eval()
    model.requires_grad_(False)
    # packed oneDNN weights replace Linear.forward, which would bypass accelerate's offload hooks: single device only
    if not spread and device.type == "cpu" and packable(dtype) and room_for_copies(model):
        prepack(model)  # oneDNN with packed weights: flat cost over small widths (cpu_kernels.py says why)
    from ..batch.decoder import check_final_logits

    check_final_logits(model, name, device)  # refuse a logit processing the steps would not reproduce
    ctx = int(getattr(model.config, "max_position_embeddings", 2048) or 2048)
    tok = Tokenizer(backend, _stop_ids(backend, model), name)
    return LoadedModel(model, tok, spec, name, device, dtype, ctx, source, placement=label(model))


def _with_attention(build, what: str):
    """build(attn_implementation) with SDPA, or eager attention for an architecture without SDPA support in this
    transformers (such as Gemma 2); the custom masks methods pass are additive floats, right for both."""
    try:
        return build("sdpa")
    except ValueError as exc:
        if "attention implementation" not in str(exc) and "sdpa" not in str(exc).lower():
            raise
        console.print(f"[dim]{escape(what)}: no SDPA attention for this architecture here; using eager attention[/]")
        return build("eager")
