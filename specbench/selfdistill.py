"""The model's own greedy continuations of dataset prompts (self-distillation data for `specbench train ppd`, and
the reference `specbench estimate` scores guesses against). Batched with left padding for speed on CPU."""

from __future__ import annotations

import torch

from . import datasets as ds
from .models import LoadedModel
from .progress import progress_bar


def render(target: LoadedModel, prompt: ds.Prompt) -> list[int]:
    """The first turn of a dataset prompt as chat token ids (where the assistant's reply starts)."""
    msgs = [{"role": "system", "content": prompt.system}] if prompt.system else []
    return target.tokenizer.render(msgs + [{"role": "user", "content": prompt.turns[0]}])


@torch.inference_mode()
def greedy_continuations(target: LoadedModel, prompts: list[list[int]], new_tokens: int, batch: int = 32,
                         label: str = "self-distilling") -> list[list[int]]:
    """Greedy continuation of each prompt (token ids), up to and including a stop token, at most new_tokens."""
    model, stop = target.model, target.tokenizer.stop_ids
    pad = stop[0] if stop else 0
    out: dict[int, list[int]] = {}
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths batch together
    with progress_bar() as bar:
        task = bar.add_task(label, total=len(prompts), info="")
        for start in range(0, len(prompts), batch):
            group = [prompts[i] for i in order[start:start + batch]]
            width = max(len(p) for p in group)
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in group], device=target.device)  # [B, W]
            attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group], device=target.device)
            gen = model.generate(ids, attention_mask=attn, max_new_tokens=new_tokens, do_sample=False,
                                 eos_token_id=list(stop) or None, pad_token_id=pad)[:, width:]  # [B, new]
            for i, row in zip(order[start:start + batch], gen.tolist()):
                cut = next((k + 1 for k, t in enumerate(row) if t in stop), len(row))
                out[i] = row[:cut]
            bar.update(task, advance=len(group))
    return [out[i] for i in range(len(prompts))]


def training_sequences(target: LoadedModel, data: str, held_out: int, prompts: int, new_tokens: int,
                       data_file: str | None = None, min_reply: int = 1) -> list[tuple[list[int], int]]:
    """(prompt + greedy continuation, prompt length) pairs of prompts held_out..held_out+prompts-1 of `data`.

    Shared by `train ppd` and `train drafter` and cached in <cache>/selfdistill/ (keyed by the model's weights
    and these settings): generating them is the slow part of training on a CPU.
    """
    from .errors import SpecbenchError
    from .models import cache_dir
    from .prompt_tokens import model_key

    source = data_file or data
    key = {"format": 2, "model_key": model_key(target), "data": source, "prompts": prompts, "held_out": held_out,
           "new_tokens": new_tokens}
    name = "-".join(str(v) for v in key.values()).replace("/", "_")
    path = cache_dir() / "selfdistill" / f"{name}.pt"
    if path.exists():
        saved = torch.load(path)
        if saved["key"] == key:
            return [(s, n) for s, n in saved["sequences"] if len(s) - n >= min_reply]
    _, loaded = ds.load_prompts(data, held_out + prompts, data_file)
    loaded = loaded[held_out:]
    if not loaded:
        raise SpecbenchError(f"{source} has no prompts after the {held_out} held out for estimates; lower "
                             "--held-out or use a larger set")
    rendered = [render(target, p) for p in loaded]
    conts = greedy_continuations(target, rendered, new_tokens)
    seqs = [(p + c, len(p)) for p, c in zip(rendered, conts)]
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"key": key, "sequences": seqs}, path)
    return [(s, n) for s, n in seqs if len(s) - n >= min_reply]
