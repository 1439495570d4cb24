"""`specbench estimate --method pld|sd|pearl`: a chain method's acceptance profile from validation prompts, as the
tree methods' per-rank tables are (planning/acceptance.py): the method decodes each prompt greedily and its
verifications are counted per draft position. Written as acceptance/<model>/<method>.yaml (`conditional` and
`marginal` per position, and `per_rank` rows with the conditional rate as rank 0's, the form every reader takes) and
its speculation_profile.json beside it (<method>.json), so `plan`, `recommend` and `run --synthetic-acceptance` price
the method like any other."""

from __future__ import annotations

from pathlib import Path

import torch

from ..core.acceptance_profile import rates, speculation_profile, write_speculation_profile
from ..core.machine.timing import now, since
from ..core.model.load import LoadedModel, dtype_name
from ..core.verify import Sampling
from ..data import datasets as ds
from ..data.trainsets import refuse_as_benchmark
from ..errors import SpecbenchError
from ..methods import get_method
from ..progress import progress_bar
from ..train.selfdistill import render


def chain_methods() -> tuple[str, ...]:
    """The methods this estimate covers: every registered speculative method that is not a tree method."""
    from ..methods import REGISTRY

    return tuple(n for n, c in REGISTRY.items() if c.kind in ("draft-free", "draft-model"))


def _add(into: list[int], counts: list[int]) -> None:
    into.extend([0] * (len(counts) - len(into)))
    for i, c in enumerate(counts):
        into[i] += c


def estimate(target: LoadedModel, method: str, data: str, limit: int | None, new_tokens: int,
             data_file: str | None, drafter: LoadedModel | None = None) -> dict:
    """The method's acceptance per draft position on the first `limit` prompts of `data` (greedy)."""
    if method not in chain_methods():
        raise SpecbenchError(f"--method {method}: not a chain method ({', '.join(chain_methods())})")
    t0 = now()
    refuse_as_benchmark(data)
    _, prompts = ds.load_prompts(data, limit, data_file)
    decoder = get_method(method)(target, {}, drafter)
    accepted: list[int] = []
    drafted: list[int] = []
    reached: list[int] = []
    by_category: dict[str, tuple[list[int], list[int], list[int], list[float]]] = {}
    tokens = forwards = 0
    per_request = []
    rendered = []
    with progress_bar() as bar:
        task = bar.add_task(f"decoding with {method}", total=len(prompts), info="")
        for i, p in enumerate(prompts):
            ids = torch.tensor([render(target, p)], device=target.device)
            rendered.append(ids)
            gen = decoder.generate(ids, new_tokens, Sampling(), torch.Generator(device=target.device).manual_seed(i))
            _add(accepted, gen.accepted_per_position)
            _add(drafted, gen.drafted_per_position)
            _add(reached, gen.reached_per_position)
            cat = by_category.setdefault(p.category or "", ([], [], [], []))
            _add(cat[0], gen.accepted_per_position)
            _add(cat[1], gen.drafted_per_position)
            _add(cat[2], gen.reached_per_position)
            steps = max(gen.target_forwards - 1, 0)  # the prefill's forward is not a decode step
            tokens, forwards = tokens + max(len(gen.tokens) - 1, 0), forwards + steps
            if steps:
                per_request.append((len(gen.tokens) - 1) / steps)
                cat[3].append(per_request[-1])
            bar.update(task, advance=1)
    if not any(drafted):
        raise SpecbenchError(f"{method} drafted nothing on {len(prompts)} {data} prompts: no acceptance to estimate "
                             "(raise --max-new-tokens or --limit, or use prompts it can draft for)")
    conditional, marginal = rates(accepted, drafted, reached)
    while conditional and conditional[-1] == 0:
        conditional.pop()
    categories = {name: {"conditional": rates(a, d, h)[0], "mean_per_request": sum(r) / len(r) if r else None}
                  for name, (a, d, h, r) in by_category.items() if name and any(d)}
    share = {}
    if decoder.drafter is not None:  # the drafter's weights read per forward over the target's (plan prices it)
        own = sum(p.numel() for p in decoder.drafter.model.parameters())
        share = {"drafter": decoder.drafter.spec,
                 "drafter_share": round(own / max(sum(p.numel() for p in target.model.parameters()), 1), 5)}
    return {
        "method": method, "model": target.spec, **share, "dtype": dtype_name(target.dtype), "data": data,
        "prompts": len(prompts), "new_tokens": new_tokens, "seconds": round(since(t0), 1),
        "accepted_per_position": accepted, "drafted_per_position": drafted, "reached_per_position": reached,
        "conditional": [round(x, 5) for x in conditional], "marginal": [round(x, 5) for x in marginal[:len(conditional)]],
        "per_rank": [[round(x, 5)] for x in conditional],
        "mean_per_step": round(tokens / forwards, 5) if forwards else 1.0,
        "mean_per_request": round(sum(per_request) / len(per_request), 5) if per_request else 1.0,
        "per_category": categories or None,
        **decoder.estimate_more(rendered, new_tokens),
    }


def write_profile(result: dict, yaml_path: Path) -> Path:
    """The speculation_profile.json beside the acceptance YAML (<method>.json)."""
    cats = {name: {"conditional": c["conditional"], "mean_per_request": c["mean_per_request"]}
            for name, c in (result.get("per_category") or {}).items()}
    payload = speculation_profile(result["conditional"], result["method"], result["model"], result["mean_per_step"],
                                  result["mean_per_request"], cats or None,
                                  {"tool": "specbench estimate", "dataset": result["data"],
                                   "num_samples": result["prompts"], "osl": result["new_tokens"],
                                   "dtype": result["dtype"], "temperature": 0.0})
    path = yaml_path.with_suffix(".json")
    write_speculation_profile(payload, path)
    return path
