"""Greedy continuations of many prompts at once, for self-distillation data and estimate's references.

`ragged_greedy` (the default) decodes on the unpadded batch engine (core/batch/ragged.py, EMS-SD's unpad KV cache and
unpad input tokens): `slots` samples side by side, each with its own KV length, no padding token in any linear layer;
a sample that finishes (stop token or cap) leaves at once and its slot takes the next waiting prompt at the next step
(continuous batching: no slot idles while the longest reply of a group finishes, as it does in a padded batch).
Exactly greedy: every token is the argmax of the target's logits for that sample's own sequence, which equals
batch-1 greedy decoding (in float32 up to float rounding of the packed matmuls; tests/test_greedy.py checks the
tokens on a random model).

`padded_greedy` is the former route, transformers' `generate` over left-padded groups of `slots` prompts sorted by
length; kept as a fallback for models the ragged engine cannot run (layers other than full or sliding-window
attention: core/batch/attention.check_batchable) and as the baseline of benchmarks/selfdistill_throughput.py.
"""

from __future__ import annotations

import heapq
from collections import deque

import torch

from ..core.batch.ragged import RaggedCache, Segment, ragged_forward
from ..core.machine.timing import now, since
from ..progress import progress_bar

PREFILL_TOKENS = 4096  # prompt tokens per prefill forward: the attention of a packed prefill is [S, heads, w, w]


@torch.inference_mode()
def ragged_greedy(model, prompts: list[list[int]], new_tokens: int, stop_ids, slots: int = 32,
                  label: str = "self-distilling") -> list[list[int]]:
    """Greedy continuation of each prompt (token ids), up to and including a stop token, at most new_tokens."""
    stop = set(stop_ids)
    slots = max(1, min(slots, len(prompts)))
    cache = RaggedCache(slots)
    # shortest prompts first: the active samples have similar lengths (attention reads every slot up to the longest
    # one) and the cache, which grows to the longest sample and stays, reaches a long prompt's size only at the end
    waiting = deque(sorted(range(len(prompts)), key=lambda i: len(prompts[i])))
    free = list(range(slots))  # a heap: the lowest free slot first, so active slots stay a prefix 0..S-1 (the
    # ragged attention then reads the cache as a view instead of gathering it)
    pending: dict[int, tuple[int, int]] = {}  # slot -> (prompt index, its last token, not yet in the cache)
    out: dict[int, list[int]] = {}
    made, t0 = 0, now()
    with progress_bar() as bar:
        task = bar.add_task(label, total=len(prompts), info="")

        def emit(slot: int, index: int, token: int) -> None:
            """Append a sample's token; finish it (free its slot) at a stop token or the cap."""
            nonlocal made
            out[index].append(token)
            made += 1
            if token in stop or len(out[index]) >= new_tokens:
                del pending[slot]
                heapq.heappush(free, slot)
                bar.update(task, advance=1)
            else:
                pending[slot] = (index, token)

        while waiting or pending:
            # 1. refill: every free slot takes the next waiting prompt; their prompts are prefilled in packed
            # forwards of at most PREFILL_TOKENS tokens (a longer prompt goes alone), each keeping its last logits
            joining = []
            while free and waiting:
                slot, index = heapq.heappop(free), waiting.popleft()
                cache.lengths[slot] = 0  # a reused slot's old entries are beyond its length: never read
                joining.append(Segment(slot, prompts[index], keep=1))
                out[index] = []
                pending[slot] = (index, -1)
            for group in _prefill_groups(joining):
                for seg, logits in zip(group, ragged_forward(model, cache, group)):  # logits [1, V] each
                    emit(seg.slot, pending[seg.slot][0], int(logits[-1].argmax()))
            # 2. decode: every active sample's last token, one packed forward [1, S], in slot order
            if pending:
                order = sorted(pending)
                logits = ragged_forward(model, cache, [Segment(s, [pending[s][1]]) for s in order])  # [1, V] each
                for slot, lg in zip(order, logits):
                    emit(slot, pending[slot][0], int(lg[-1].argmax()))
            bar.update(task, info=f"{made / max(since(t0), 1e-9):.0f} tok/s, {len(pending)} active")
    return [out[i] for i in range(len(prompts))]


def _prefill_groups(joining: list[Segment]) -> list[list[Segment]]:
    """Newcomers in slot order, cut into packed prefills of at most PREFILL_TOKENS tokens."""
    groups: list[list[Segment]] = []
    size = 0
    for seg in sorted(joining, key=lambda s: s.slot):
        if not groups or size + seg.width > PREFILL_TOKENS:
            groups.append([])
            size = 0
        groups[-1].append(seg)
        size += seg.width
    return groups


@torch.inference_mode()
def padded_greedy(model, prompts: list[list[int]], new_tokens: int, stop_ids, slots: int = 32,
                  label: str = "self-distilling") -> list[list[int]]:
    """The same with transformers' generate on left-padded groups of `slots` prompts of similar lengths."""
    stop = list(stop_ids)
    pad = stop[0] if stop else 0
    device = model.get_input_embeddings().weight.device
    out: dict[int, list[int]] = {}
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths batch together
    made, t0 = 0, now()
    with progress_bar() as bar:
        task = bar.add_task(label, total=len(prompts), info="")
        for start in range(0, len(prompts), slots):
            group = [prompts[i] for i in order[start:start + slots]]
            width = max(len(p) for p in group)
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in group], device=device)  # [B, W]
            attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group], device=device)
            gen = model.generate(ids, attention_mask=attn, max_new_tokens=new_tokens, do_sample=False,
                                 eos_token_id=stop or None, pad_token_id=pad)[:, width:]  # [B, new]
            for i, row in zip(order[start:start + slots], gen.tolist()):
                cut = next((k + 1 for k, t in enumerate(row) if t in stop), len(row))
                out[i] = row[:cut]
                made += cut
            bar.update(task, advance=len(group), info=f"{made / max(since(t0), 1e-9):.0f} tok/s")
    return [out[i] for i in range(len(prompts))]
