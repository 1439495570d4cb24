"""The model's own greedy continuations of dataset prompts (self-distillation data for `specbench train ppd`, and
the reference `specbench estimate` scores guesses against). Batched with left padding for speed on CPU."""

from __future__ import annotations

from pathlib import Path

import torch

from ..core import store
from ..core.models import LoadedModel
from ..data import datasets as ds
from ..data import trainsets
from ..errors import SpecbenchError
from ..progress import progress_bar


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


def source_names(data: str) -> list[str]:
    """`--data a,b,c` -> [a, b, c] (a dataset, a trainsets source or a file each)."""
    parts = [part.strip() for part in data.split(",") if part.strip()]
    if not parts:
        raise SpecbenchError("--data names no dataset; give one or more, comma-separated")
    return parts


def check_sources(data: str) -> list[str]:
    """The names in `--data`, each checked before any slow work: a training source, a dataset or a file."""
    names = source_names(data)
    for name in names:
        if name in trainsets.SOURCES or name in ds.dataset_names():
            continue
        if ds.looks_like_path(name):
            if not Path(name).is_file():
                raise SpecbenchError(f"--data {name}: no such file")
            continue
        raise SpecbenchError(f"--data: unknown source {name!r}; use a dataset ({', '.join(ds.dataset_names())}), "
                             f"a training-only source ({', '.join(trainsets.SOURCES)}) or a .jsonl file "
                             "(see `specbench list datasets`)")
    return names


def load_source(name: str, limit: int, data_file: str | None = None) -> list[ds.Prompt]:
    """The first `limit` prompts of a training source (trainsets) or a dataset / file (datasets)."""
    if name in trainsets.SOURCES:
        return trainsets.load(name, limit)
    return ds.load_prompts(name, limit, data_file)[1]


def training_sequences(target: LoadedModel, data: str, held_out: int, prompts: int, new_tokens: int,
                       data_file: str | None = None, min_reply: int = 1) -> list[tuple[list[int], int]]:
    """(prompt + greedy continuation, prompt length) pairs of prompts held_out..held_out+prompts-1 of each source
    in `data` (comma-separated: a mix takes `prompts` from each).

    Shared by `train ppd` and `train drafter` and cached per source in <cache>/selfdistill/ (keyed by the model's
    weights and these settings): generating them is the slow part of training on a CPU.
    """
    names = check_sources(data)
    if data_file and len(names) > 1:
        raise SpecbenchError("--data-file replaces one named dataset's file, so it needs a single --data; to "
                             "train on your own file, put its path in --data (it may join a mix: a.jsonl,stdlib-code)")
    return [seq for name in names
            for seq in _source_sequences(target, name, held_out, prompts, new_tokens, data_file, min_reply)]


def _cached(target: LoadedModel, source: str, held_out: int, prompts: int, new_tokens: int,
            data_file: str | None) -> tuple[dict, Path, list | None]:
    """(cache key, cache file, the cached sequences or None) of one source's self-distilled data."""
    from ..artifacts.prompt_tokens import model_key

    key = {"format": 2, "model_key": model_key(target), "data": data_file or trainsets.cache_tag(source),
           "prompts": prompts, "held_out": held_out, "new_tokens": new_tokens}
    name = "-".join(str(v) for v in key.values()).replace("/", "_")
    path = store.user_cache() / "selfdistill" / f"{name}.pt"
    if path.exists():
        saved = torch.load(path)
        if saved["key"] == key:
            return key, path, saved["sequences"]
    return key, path, None


def _rendered(target: LoadedModel, source: str, held_out: int, prompts: int,
              data_file: str | None) -> list[list[int]]:
    loaded = load_source(source, held_out + prompts, data_file)[held_out:]
    if not loaded:
        raise SpecbenchError(f"{data_file or source} has no prompts after the {held_out} held out for estimates; "
                             "lower --held-out or use a larger set")
    return [render(target, p) for p in loaded]


def pending_prompts(target: LoadedModel, data: str, held_out: int, prompts: int, new_tokens: int,
                    data_file: str | None = None) -> list[list[int]]:
    """The rendered prompts training_sequences still has to self-distil (sources not in the cache yet): what its
    time depends on, known before the slow part starts."""
    return [ids for name in check_sources(data)
            if _cached(target, name, held_out, prompts, new_tokens, data_file)[2] is None
            for ids in _rendered(target, name, held_out, prompts, data_file)]


def forward_costs(target: LoadedModel) -> tuple[float, float]:
    """(seconds per forward call, seconds per token) of this model here, from forwards of 1 and 129 tokens timed as
    the methods time theirs (core.concurrency.measure_forward_times), for estimates made before slow work starts."""
    from ..core.concurrency import measure_forward_times

    t = measure_forward_times(target.model, target.device, widths=(1, 129), rounds=2)
    per_token = max(t[129] - t[1], 0.0) / 128
    return max(t[1] - per_token, 0.0), per_token


def generation_seconds(target: LoadedModel, prompts: list[list[int]], new_tokens: int, batch: int = 32,
                       costs: tuple[float, float] | None = None) -> float:
    """Estimated time of greedy_continuations(prompts) from forward_costs: per batch of B prompts padded to W, one
    prefill of B x W tokens and new_tokens steps of B tokens (an upper bound: replies that stop early are cheaper)."""
    if not prompts:
        return 0.0
    call, per_token = costs or forward_costs(target)
    by_length = sorted(len(p) for p in prompts)
    total = 0.0
    for start in range(0, len(by_length), batch):
        group = by_length[start:start + batch]
        total += call + len(group) * group[-1] * per_token + new_tokens * (call + len(group) * per_token)
    return total


def _source_sequences(target: LoadedModel, source: str, held_out: int, prompts: int, new_tokens: int,
                      data_file: str | None, min_reply: int) -> list[tuple[list[int], int]]:
    key, path, cached = _cached(target, source, held_out, prompts, new_tokens, data_file)
    if cached is not None:
        return [(s, n) for s, n in cached if len(s) - n >= min_reply]
    rendered = _rendered(target, source, held_out, prompts, data_file)
    conts = greedy_continuations(target, rendered, new_tokens, label=f"self-distilling {source}")
    seqs = [(p + c, len(p)) for p, c in zip(rendered, conts)]
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"key": key, "sequences": seqs}, path)
    return [(s, n) for s, n in seqs if len(s) - n >= min_reply]
