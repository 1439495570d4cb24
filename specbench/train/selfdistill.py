"""The model's own greedy continuations of prompts: self-distillation data for the trainers (held-out prompts too,
for their top-1 checks), and the references `specbench estimate` scores guesses against. Decoded many prompts at once
on the unpadded batch engine (greedy.ragged_greedy), cached per source in <cache>/selfdistill/."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..core import store
from ..core.model.load import LoadedModel
from ..core.batch.ragged import UnsupportedAttention
from ..data import datasets as ds
from ..data import disjoint, trainsets
from ..errors import SpecbenchError
from ..progress import console
from .greedy import padded_greedy, ragged_greedy

CACHE_FORMAT = 3  # 3: exact greedy on the unpadded engine (2: transformers' generate, left-padded)
SLOTS = 32  # samples decoded side by side

Sequences = list[tuple[list[int], int]]  # (prompt + greedy reply token ids, prompt length) per sequence


@dataclass(frozen=True)
class SourceData:
    """One source's share of the data: which prompts (first..last in the source's own order, less those dropped
    for holding a benchmark prompt), their texts, and the self-distilled sequences of those with a long enough
    reply."""

    name: str
    first: int
    last: int
    dropped: tuple[int, ...]  # prompt numbers left out: they equal or contain a benchmark prompt (data/disjoint.py)
    prompts: list[ds.Prompt]  # the prompts kept
    sequences: Sequences

    @property
    def span(self) -> str:
        return f"{self.first}..{self.last}"


def render(target: LoadedModel, prompt: ds.Prompt) -> list[int]:
    """The first turn of a dataset prompt as chat token ids (where the assistant's reply starts)."""
    msgs = [{"role": "system", "content": prompt.system}] if prompt.system else []
    return target.tokenizer.render(msgs + [{"role": "user", "content": prompt.turns[0]}])


def greedy_continuations(target: LoadedModel, prompts: list[list[int]], new_tokens: int, batch: int = SLOTS,
                         label: str = "self-distilling", engine: str = "ragged") -> list[list[int]]:
    """Greedy continuation of each prompt (token ids), up to and including a stop token, at most new_tokens:
    `batch` prompts side by side on the unpadded engine with refill (engine="padded": transformers' generate)."""
    if new_tokens < 1 or not prompts:
        return [[] for _ in prompts]
    stop = target.tokenizer.stop_ids
    if engine == "ragged":
        try:
            return ragged_greedy(target.model, prompts, new_tokens, stop, batch, label)
        except UnsupportedAttention as exc:
            console.print(f"[yellow]{exc}: self-distilling with transformers' generate (left-padded) instead[/]")
    return padded_greedy(target.model, prompts, new_tokens, stop, batch, label)


def source_names(data: str) -> list[str]:
    """`--dataset a,b,c` -> [a, b, c] (a dataset, a trainsets source or a file each)."""
    parts = [part.strip() for part in data.split(",") if part.strip()]
    if not parts:
        raise SpecbenchError("--dataset names no dataset; give one or more, comma-separated")
    return parts


def check_sources(data: str) -> list[str]:
    """The names in `--dataset`, each checked before any slow work: a training source, a dataset or a file."""
    names = source_names(data)
    for name in names:
        if name in trainsets.SOURCES or name in ds.dataset_names():
            continue
        if ds.looks_like_path(name):
            if not Path(name).is_file():
                raise SpecbenchError(f"--dataset {name}: no such file")
            continue
        raise SpecbenchError(f"--dataset: unknown source {name!r}; use a dataset ({', '.join(ds.dataset_names())}), "
                             f"a training-only source ({', '.join(trainsets.SOURCES)}) or a .jsonl file "
                             "(see `specbench list datasets`)")
    return names


def load_source(name: str, limit: int, data_file: str | None = None) -> list[ds.Prompt]:
    """The first `limit` prompts of a training source (trainsets) or a dataset / file (datasets); fewer when the
    source has fewer."""
    if name in trainsets.SOURCES:
        return trainsets.load(name, limit)
    return ds.load_prompts(name, limit, data_file)[1]


def training_data(target: LoadedModel, data: str, held_out: int, prompts: int, new_tokens: int,
                  data_file: str | None = None, min_reply: int = 1, training: bool = True) -> list[SourceData]:
    """Per source in `data` (comma-separated: a mix takes `prompts` from each): prompts held_out..held_out+prompts-1
    (or as many as it has) and the target's greedy replies to them, those of at least min_reply tokens kept.

    Cached per source in <cache>/selfdistill/ (keyed by the model's weights and these settings): generating them is
    the slow part of training on a CPU. Training data leaves out prompts that hold a benchmark prompt
    (without_benchmark_prompts); training=False reads prompts as they are (held_out = 0 and training=False: the
    held-out prompts themselves, for top-1 checks)."""
    names = check_sources(data)
    if data_file and len(names) > 1:
        raise SpecbenchError("--data-file replaces one named dataset's file, so it needs a single --dataset; "
                             "to train on your own file, put its path in --dataset (it may join a mix: "
                             "a.jsonl,stdlib-code)")
    return [_source_data(target, name, held_out, prompts, new_tokens, data_file, min_reply, training)
            for name in names]


def training_sequences(target: LoadedModel, data: str, held_out: int, prompts: int, new_tokens: int,
                       data_file: str | None = None, min_reply: int = 1) -> Sequences:
    """training_data's sequences, every source's in turn: (prompt + greedy continuation, prompt length) pairs."""
    return [seq for source in training_data(target, data, held_out, prompts, new_tokens, data_file, min_reply)
            for seq in source.sequences]


def _cached(target: LoadedModel, source: str, held_out: int, prompts: int, new_tokens: int,
            data_file: str | None, dropped: tuple[int, ...] = ()) -> tuple[dict, Path, list | None]:
    """(cache key, cache file, the cached sequences or None) of one source's self-distilled data (dropped: the
    prompts left out, which the file name does not show: a file with other ones is regenerated)."""
    from ..core.artifact_files import model_key

    key = {"format": CACHE_FORMAT, "model_key": model_key(target), "data": data_file or trainsets.cache_tag(source),
           "prompts": prompts, "held_out": held_out, "new_tokens": new_tokens}
    name = "-".join(str(v) for v in key.values()).replace("/", "_")
    key["dropped"] = list(dropped)
    path = store.user_cache() / "selfdistill" / f"{name}.pt"
    if path.exists():
        saved = torch.load(path)
        if saved["key"] == key:
            return key, path, saved["sequences"]
    return key, path, None


def _loaded(source: str, held_out: int, prompts: int, data_file: str | None) -> list[ds.Prompt]:
    loaded = load_source(source, held_out + prompts, data_file)[held_out:]
    if not loaded:
        raise SpecbenchError(f"{data_file or source} has no prompts after the {held_out} held out for estimates; "
                             "lower --held-out or use a larger set")
    return loaded


def pending_prompts(target: LoadedModel, data: str, held_out: int, prompts: int, new_tokens: int,
                    data_file: str | None = None) -> list[list[int]]:
    """The rendered prompts training_data still has to self-distil (sources not in the cache yet): what its
    time depends on, known before the slow part starts."""
    todo = []
    for name in check_sources(data):
        kept, dropped, _ = _kept(name, held_out, prompts, data_file)
        if _cached(target, name, held_out, prompts, new_tokens, data_file, dropped)[2] is None:
            todo += [render(target, p) for p in kept]
    return todo


def forward_costs(target: LoadedModel) -> tuple[float, float]:
    """(seconds per forward call, seconds per token) of this model here, from forwards of 1 and 129 tokens timed as
    the methods time theirs (core/machine/forward_cost.measure_forward_times), for estimates made before slow work starts."""
    from ..core.machine.forward_cost import measure_forward_times

    t = measure_forward_times(target.model, target.device, widths=(1, 129), rounds=2)
    per_token = max(t[129] - t[1], 0.0) / 128
    return max(t[1] - per_token, 0.0), per_token


def generation_seconds(target: LoadedModel, prompts: list[list[int]], new_tokens: int, batch: int = SLOTS,
                       costs: tuple[float, float] | None = None) -> float:
    """Estimated time of greedy_continuations(prompts) from forward_costs, an upper bound (replies that stop early
    are cheaper): every prompt token once (prefills of `batch` prompts per forward), then new_tokens tokens per
    prompt decoded `batch` at a time (refill keeps the slots full: steps = prompts x new_tokens / batch)."""
    if not prompts:
        return 0.0
    call, per_token = costs or forward_costs(target)
    prefill = -(-len(prompts) // batch) * call + sum(len(p) for p in prompts) * per_token
    decode = -(-len(prompts) * new_tokens // batch) * call + len(prompts) * new_tokens * per_token
    return prefill + decode


def without_benchmark_prompts(source: str, prompts: list[ds.Prompt], first: int
                              ) -> tuple[list[ds.Prompt], tuple[int, ...]]:
    """(the prompts that hold no benchmark prompt, the numbers of those that do) of a source whose prompt `first`
    is prompts[0]. A source that is itself a benchmark set keeps everything (its metadata says so instead)."""
    if source in disjoint.benchmark_sets():
        return prompts, ()
    bad = sorted({o.prompt for o in disjoint.check({source: prompts}).overlaps})
    if bad:
        console.print(f"[dim]{source}: left out prompt(s) {', '.join(str(first + i) for i in bad)}, which hold a "
                      "benchmark prompt[/]")
    return [p for i, p in enumerate(prompts) if i not in set(bad)], tuple(first + i for i in bad)


def _kept(source: str, held_out: int, prompts: int, data_file: str | None, training: bool = True
          ) -> tuple[list[ds.Prompt], tuple[int, ...], int]:
    """(prompts to self-distil, prompt numbers dropped, the last prompt number) of one source's range. Training
    data drops what holds a benchmark prompt; held-out prompts (training=False: read for top-1 checks, never
    trained on) are kept as they are."""
    loaded = _loaded(source, held_out, prompts, data_file)
    last = held_out + len(loaded) - 1
    if not training:
        return loaded, (), last
    kept, dropped = without_benchmark_prompts(source, loaded, held_out)
    return kept, dropped, last


def _source_data(target: LoadedModel, source: str, held_out: int, prompts: int, new_tokens: int,
                 data_file: str | None, min_reply: int, training: bool) -> SourceData:
    loaded, dropped, last = _kept(source, held_out, prompts, data_file, training)
    key, path, seqs = _cached(target, source, held_out, prompts, new_tokens, data_file, dropped)
    if seqs is None:
        rendered = [render(target, p) for p in loaded]
        conts = greedy_continuations(target, rendered, new_tokens, label=f"self-distilling {source}")
        seqs = [(p + c, len(p)) for p, c in zip(rendered, conts)]
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"key": key, "sequences": seqs}, path)
    return SourceData(source, held_out, last, dropped, loaded, [(s, n) for s, n in seqs if len(s) - n >= min_reply])
