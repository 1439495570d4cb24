"""What a command will ask of memory, part by part, before anything is allocated: weights in the run's dtype, the KV
cache at the run's context and batch, the widest forward's activations, a drafter or heads, the training state
(optimiser, gradients, cached features) and the process's own working memory. fit.py compares the sum with what
the machine has free and refuses with these numbers; `Need.said` is how they read.

A command states its workload (`stated_workload`) around the load_model call; the fit check inside the loaders reads it.
Without one, a check counts KV_HEADROOM_TOKENS tokens of one sequence and no wide forward (the load only).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from ... import families

GIB = 2**30
RUNTIME_HEADROOM = 512 * 2**20  # the process itself (python, torch, transformers, tokenizer) and allocator slack
KV_HEADROOM_TOKENS = 4096  # the KV cache a check counts on without a workload: a long prompt and reply
# A forward's peak passes weights + KV + activations + working memory by a share of the weights (the model build's
# transients, the KV fill's kernels; measured by `profile`: benchmarks/RESULTS-cpu.md). A check that runs forwards
# counts this share of the weights on top, a little above the measured one, so it errs high, not low.
FORWARD_SLACK = 0.12


@dataclass(frozen=True)
class Workload:
    """What the command does with the model. tokens: KV positions per sequence (prompt + reply + the widest
    verify); batch: sequences decoded at once, each with its own KV; width: tokens of the widest forward per
    sequence (a verify tree, a profile width; 0: count no activations); logits: rows of that forward whose logits
    are kept (None: all `width`); extra: named bytes beyond the target (a drafter, heads, training state)."""

    tokens: int = KV_HEADROOM_TOKENS
    batch: int = 1
    width: int = 0
    logits: int | None = None
    extra: tuple[tuple[str, int], ...] = ()
    what: str = ""  # how the command's shape reads in a refusal, e.g. "KV 1152 tokens x batch 4"
    compiled: bool = False  # --compile: on a CPU the compiled step's packed copies of the weights (compile_pack_bytes)
    # b -> the same command's workload at a largest batch size of b (a refusal's smaller --batch-size), where it is
    # not this one with `batch` replaced (every batch size's caches held at once: profile --compile)
    at_batch: Callable[[int], Workload] | None = field(default=None, compare=False, repr=False)


_STATED: contextvars.ContextVar[Workload | None] = contextvars.ContextVar("specbench_workload", default=None)


@contextmanager
def stated_workload(workload: Workload):
    """The workload every fit check inside this block counts (around a command's load_model)."""
    token = _STATED.set(workload)
    try:
        yield workload
    finally:
        _STATED.reset(token)


def current() -> Workload:
    return _STATED.get() or Workload()


@dataclass
class Need:
    """Bytes per part (weights, KV cache, activations, drafter..., working memory) of one model's workload."""

    what: str
    dtype: torch.dtype
    params: int
    parts: dict[str, int] = field(default_factory=dict)
    workload: Workload = field(default_factory=Workload)

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def said(self) -> str:
        """need 141.3 GiB = weights 131.4 (70.55B parameters in bfloat16) + KV cache 1.25 (...) + ..."""
        dt = str(self.dtype).removeprefix("torch.")
        notes = {"weights": f"{self.params / 1e9:.2f}B parameters in {dt}",
                 "KV cache": self.workload.what or f"{self.workload.tokens} tokens x batch {self.workload.batch}"}
        terms = [f"{name} {size / GIB:.2f}" + (f" ({notes[name]})" if name in notes else "")
                 for name, size in self.parts.items() if size]
        return f"needs about {self.total / GIB:.1f} GiB = " + " + ".join(terms) + " GiB"


def text_shape(config) -> tuple[int, int, int, int, int, int]:
    """(layers, KV heads, head dim, hidden, intermediate, vocab) of a causal LM's text config."""
    text = config.get_text_config(decoder=True)
    heads = getattr(text, "num_attention_heads", 1) or 1
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    inter = getattr(text, "intermediate_size", None) or 4 * text.hidden_size
    return text.num_hidden_layers, kv_heads, head_dim, text.hidden_size, inter, text.vocab_size


def count_parameters(config) -> tuple[int, int]:
    """(parameters, parameters of plain Linear layers) of the model `config` builds, counted on the meta device
    (nothing allocated; a 70B model counts in about a second)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    linear = sum(m.weight.numel() for m in meta.modules() if type(m) is torch.nn.Linear)
    return meta.num_parameters(), linear


def element_size(dtype: torch.dtype) -> int:
    return torch.tensor([], dtype=dtype).element_size()


def kv_bytes(config, dtype: torch.dtype, tokens: int, batch: int = 1) -> int:
    """layers x 2 (K and V) x KV heads x head dim x bytes x tokens x batch."""
    layers, kv_heads, head_dim, *_ = text_shape(config)
    return layers * 2 * kv_heads * head_dim * element_size(dtype) * tokens * batch


def activation_bytes(config, dtype: torch.dtype, width: int, batch: int = 1, logits: int | None = None,
                     tokens: int = 0) -> int:
    """The widest forward's live tensors, one layer at a time (a frozen model keeps no activations between layers):
    the residual stream and its normed copy, the MLP's gate, up and product [B, width, intermediate], the attention
    scores of an explicit mask [B, heads, width, tokens] in float32, and the kept logits [B, logits, vocab] in the
    dtype plus the float32 copy the methods take of them."""
    if width <= 0:
        return 0
    _, _, head_dim, hidden, inter, vocab = text_shape(config)
    text = config.get_text_config(decoder=True)
    heads = getattr(text, "num_attention_heads", 1) or 1
    size = element_size(dtype)
    rows = batch * width
    per_layer = rows * (4 * hidden + 3 * inter) * size + batch * heads * width * max(tokens, width) * 4
    kept = batch * (width if logits is None else logits)
    return per_layer + kept * vocab * (size + 4)


def prepack_bytes(device: torch.device, dtype: torch.dtype, params: int, linear: int) -> int:
    """The packed oneDNN copy of float32 (or native bfloat16) CPU linear weights (cpu_kernels.prepack; small models
    only)."""
    from .cpu_kernels import MAX_PREPACK_PARAMS, backend, packable

    packed = device.type == "cpu" and packable(dtype) and params <= MAX_PREPACK_PARAMS and backend() == "onednn"
    return linear * element_size(dtype) if packed else 0


def compile_pack_bytes(config, device: torch.device, dtype: torch.dtype, params: int, linear: int) -> int:
    """A compiled CPU step's own packed copies (core/model/linear_kernels.py, fused_linears.py, panel_linear.py):
    every linear weight where prepack made no copy (bfloat16 of a model over cpu_kernels.MAX_PREPACK_PARAMS), the
    q / k / v and gate / up weights once more, fused, and in float32 and bfloat16 every linear weight once more in
    panels (models up to MAX_PREPACK_PARAMS)."""
    from .cpu_kernels import MAX_PREPACK_PARAMS, packable

    if device.type != "cpu":
        return 0
    size = element_size(dtype)
    layers, kv_heads, head_dim, hidden, inter, _ = text_shape(config)
    heads = config.get_text_config(decoder=True).num_attention_heads or 1
    grouped = layers * hidden * (heads * head_dim + 2 * kv_heads * head_dim + 2 * inter) * size
    small = params <= MAX_PREPACK_PARAMS
    own = linear * size if dtype == torch.bfloat16 and packable(dtype) and not small else 0
    panels = linear * size if dtype in (torch.float32, torch.bfloat16) else 0
    return own + (grouped + panels if small else 0)


def need(what: str, config, dtype: torch.dtype, device: torch.device, workload: Workload | None = None) -> Need:
    """The memory one model needs for `workload` (default: the stated one, else load + KV_HEADROOM_TOKENS)."""
    work = workload or current()
    params, linear = count_parameters(config)
    text = config.get_text_config(decoder=True)
    longest = int(getattr(text, "max_position_embeddings", 0) or work.tokens)
    tokens = work.tokens if work.what else min(work.tokens, longest)  # a stated workload is counted as stated
    parts = {"weights": params * element_size(dtype),
             "packed copy (oneDNN)": prepack_bytes(device, dtype, params, linear),
             "compiled step's packed copies": compile_pack_bytes(config, device, dtype, params, linear)
             if work.compiled else 0,
             "KV cache": kv_bytes(config, dtype, tokens, work.batch),
             "activations": activation_bytes(config, dtype, work.width, work.batch, work.logits, tokens)}
    parts.update(dict(work.extra))
    parts["working memory"] = RUNTIME_HEADROOM
    if work.width > 0:  # a command that runs forwards: the slack its peaks showed beyond the parts above
        parts["slack"] = int(parts["weights"] * FORWARD_SLACK)
    return Need(what, dtype, params, parts, work)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ------------------------------------------------------------------------------------ each command's workload

RUN_PROMPT_TOKENS = 2048  # a run's prompt as the check counts it (its prompts are tokenised only after the load)
WIDEST_VERIFY = 128  # the widest verify a tree method plans (a tree of 128 nodes; PPD's and EAGLE's stay below)


def profile_workload(widths: list[int], kv_lengths: list[int], repeats: int, batch_sizes: list[int]) -> Workload:
    """`specbench profile`: KV up to the longest length + a round per repeat + the widest width, on each of the
    largest batch's rows; the widest forward is the KV fill (its last logits kept)."""
    tokens = max(kv_lengths) + repeats + max(widths)
    batch = max(batch_sizes)
    return Workload(tokens, batch, max(max(kv_lengths), max(widths)), max(widths),
                    what=f"{tokens} tokens x batch {batch}: the longest --kv-length + repeats + the widest width")


def run_workload(max_new_tokens: int, batch_sizes: tuple[int, ...], prompt_tokens: int = RUN_PROMPT_TOKENS,
                 compiled: bool = False) -> Workload:
    """`specbench run`: a prompt of prompt_tokens, the reply and the widest verify in KV, on every sequence of the
    largest batch; the widest forward is the prompt's prefill (its last logits kept) or a verify of WIDEST_VERIFY."""
    tokens = prompt_tokens + max_new_tokens + WIDEST_VERIFY
    batch = max(batch_sizes)
    return Workload(tokens, batch, max(prompt_tokens, WIDEST_VERIFY), WIDEST_VERIFY, compiled=compiled,
                    what=f"{tokens} tokens x batch {batch}: a {prompt_tokens}-token prompt + --max-new-tokens "
                         f"{max_new_tokens} + a {WIDEST_VERIFY}-token verify")


TRAIN_PROMPT_TOKENS = 64  # a rendered chat prompt, as a self-distilled sequence starts
STATE_BYTES = 4 + 4 + 8  # a trained float32 parameter: its value, its gradient, AdamW's two moments


def train_workload(command: str, cfg, config, dtype: torch.dtype, sequences: int) -> Workload:
    """`specbench train COMMAND`: the frozen target's forward over a whole sequence (prompt + --max-new-tokens), the
    trained part's optimiser state (float32 value, gradient, AdamW moments: STATE_BYTES a parameter) and what the
    recipe caches for all `sequences` (each family's declaration says both: families/<family>.py train_memory);
    a family whose loss back-propagates through the target (backprop_target) keeps a sequence's activations."""
    layers, kv_heads, head_dim, hidden, inter, vocab = text_shape(config)
    seq = TRAIN_PROMPT_TOKENS + cfg.new_tokens
    heads = hidden // head_dim if head_dim else 1
    layer = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + 3 * hidden * inter
    family = families.find(command)  # the train command is the family's name or alias ("drafter": sd's)
    trained, cached = family.train_memory(cfg, hidden, layer, seq, sequences) \
        if family is not None and family.train_memory is not None else (0, 0)
    backward = layers * seq * (6 * hidden + 3 * inter) * element_size(dtype) \
        if family is not None and family.backprop_target else 0
    extra = (("training state", trained * STATE_BYTES), ("cached features", cached),
             ("kept for backward", backward))
    return Workload(seq, 1, seq, seq, extra, what=f"{seq} tokens: a {TRAIN_PROMPT_TOKENS}-token prompt + "
                                                  f"--max-new-tokens {cfg.new_tokens}")
