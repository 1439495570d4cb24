"""Engines in reports: which engine decoded a run, its lossless result said plainly, and the cross-engine
table of a comparison (`specbench report RUN_A RUN_B ...` with runs of different engines: summary.md's "Across
engines" section and engines.csv).

A speedup is always within one engine (each run's summary compares its methods with its own `ar`); across engines
only tok/s on the same prompt turns compare directly, beside the agreement of every row's tokens with specbench's
own `ar` (same prompt turn, first divergence).

Shape of the cross-engine table (engines.csv):
    engine | run | method | turns | tokens_per_s | vs_specbench_ar | speedup | tau | lossless | same_as_specbench_ar |
    first_divergence | same_prompt_length
  tokens_per_s     sum new_tokens / sum wall_s over the prompt turns every run's ar finished
  vs_specbench_ar  tokens_per_s / specbench ar's tokens_per_s on those turns
  speedup          tokens_per_s / the same run's ar tokens_per_s (within one engine)
  lossless         turns whose tokens equal the same run's ar ("k/n"; ar itself: "-")
  same_as_specbench_ar  turns whose tokens equal specbench ar's, token for token ("k/n")
  first_divergence median index of the first differing token against specbench ar, over the turns that differ
  same_prompt_length   turns whose prompt has as many tokens as specbench's (engines tokenize the same text)
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ..run.records import compare
from ..run.results import read_meta, read_tokens, with_batch_columns
from .markdown import markdown_table
from .summary import read_records

SPECBENCH = "specbench"
TURN = ["dataset", "prompt_id", "turn"]


def backend_of(meta: dict, records: pd.DataFrame | None = None) -> str:
    """The engine that decoded a run: run.yaml's engine block, else the records' engine column, else specbench."""
    block = meta.get("engine")
    if isinstance(block, dict) and block.get("name"):
        return str(block["name"])
    if records is not None and "engine" in records and len(records):
        values = [str(v) for v in records.engine.unique() if str(v) not in ("", "nan")]
        if values:
            return values[0]
    return SPECBENCH


def _index(text: str) -> int:
    return int(str(text).split("@")[1])


def lossless_lines(records: pd.DataFrame, engine: str) -> list[str]:
    """One plain sentence per checked method: 'pld matched llama.cpp `ar` on 1 of 6 prompt turns; first divergence
    at token 17 (gsm8k 1: near-tie, gap 0.0047), ...'."""
    out = []
    lossless = records["lossless"].astype(str) if "lossless" in records else pd.Series("", index=records.index)
    for method in dict.fromkeys(records.method):
        if method == "ar":
            continue
        g = records[(records.method == method) & (lossless != "") & (lossless != "nan")]
        if g.empty:
            continue
        said = g.lossless.astype(str)
        matched = int((said == "match").sum())
        line = f"- `{method}` matched {engine} `ar` on {matched} of {len(g)} prompt turns"
        differ = g[said.str.startswith("mismatch")]
        if len(differ):
            verdicts = differ.get("mismatch_explained", pd.Series("", index=differ.index)).astype(str)
            ties = int((verdicts == "near-tie").sum())
            firsts = []
            for r in differ.head(3).itertuples(index=False):
                gap = pd.to_numeric(getattr(r, "mismatch_logit_gap", math.nan), errors="coerce")
                why = str(getattr(r, "mismatch_explained", "") or "no verdict")
                firsts.append(f"token {_index(r.lossless)} ({r.dataset} {r.prompt_id}: {why}"
                              + (f", gap {gap:.3g})" if pd.notna(gap) else ")"))
            more = f" and {len(differ) - 3} more" if len(differ) > 3 else ""
            tied = ("all of them near-ties (rounding can flip them)" if ties == len(differ) else
                    "none a near-tie: rounding does not explain them" if ties == 0 else
                    f"{ties} of {len(differ)} near-ties (rounding can flip them), the others not")
            line += f"; first divergence at {', '.join(firsts)}{more}: {tied}"
        out.append(line + ".")
    return out


def backend_section(records: pd.DataFrame, meta: dict) -> list[str]:
    """report.md's section for a run another engine decoded: what it was, and its lossless result plainly; [] for
    specbench's own runs."""
    engine = backend_of(meta, records)
    if engine == SPECBENCH:
        return []
    block = meta.get("engine") if isinstance(meta.get("engine"), dict) else {}
    build = block.get("build") if isinstance(block.get("build"), dict) else {}
    facts = [f"{block.get('package', engine)} {block.get('version', '?')}".strip()]
    facts += [f"{k} {build[k]}" for k in ("weights", "threads") if k in build]
    facts += [f"extra weight buffers {'on' if build['extra_buffers'] else 'off'}"] if "extra_buffers" in build else []
    md = [f"## Engine: {engine}", "",
          f"Decoded by {engine} ({', '.join(facts)}; run.yaml's `engine` block has its build). Every speedup here is "
          f"against {engine}'s own `ar`; the lossless check compares each method's greedy tokens with {engine}'s "
          "`ar` tokens on the same prompt turn.", ""]
    lines = lossless_lines(records, engine)
    md += (lines or ["- no method was checked against `ar` (sampling, or `ar` alone)."]) + [""]
    return md


def _turns(records: pd.DataFrame, method: str) -> set[tuple]:
    g = records[records.method == method]
    return {(str(d), str(p), int(t)) for d, p, t in zip(g.dataset, g.prompt_id, g.turn)}


def cross_backend_table(run_dirs: list[Path]) -> tuple[pd.DataFrame, int]:
    """The cross-engine table (module docstring) over the prompt turns every run's ar finished, and their count."""
    runs = []
    for d in run_dirs:
        records = with_batch_columns(read_records(Path(d)))
        records = records[records.batch_size == 1]
        runs.append((Path(d), backend_of(read_meta(Path(d)), records), records, read_tokens(Path(d))))
    shared = set.intersection(*[_turns(r, "ar") for _, _, r, _ in runs]) if runs else set()
    reference = next(((rec, tok) for _, e, rec, tok in runs if e == SPECBENCH), None)

    def rate(g: pd.DataFrame) -> float:
        return g.new_tokens.sum() / g.wall_s.sum() if len(g) and g.wall_s.sum() > 0 else math.nan

    def on_shared(g: pd.DataFrame) -> pd.DataFrame:
        keys = [(str(d), str(p), int(t)) in shared for d, p, t in zip(g.dataset, g.prompt_id, g.turn)]
        return g[keys]

    ref_ar = on_shared(reference[0][reference[0].method == "ar"]) if reference else None
    ref_rate = rate(ref_ar) if ref_ar is not None else math.nan
    ref_prompt = ({(str(d), str(p), int(t)): n for d, p, t, n in zip(ref_ar.dataset, ref_ar.prompt_id, ref_ar.turn,
                                                                      ref_ar.prompt_tokens)} if ref_ar is not None
                  else {})
    rows = []
    for folder, engine, records, tokens in runs:
        ar_rate = rate(on_shared(records[records.method == "ar"]))
        for method in dict.fromkeys(records.method):
            g = on_shared(records[records.method == method])
            if g.empty:
                continue
            own = g.lossless.astype(str) if "lossless" in g else pd.Series("", index=g.index)
            checked = own[(own != "") & (own != "nan")]
            row = {"engine": engine, "run": folder.name, "method": method, "turns": len(g),
                   "tokens_per_s": round(rate(g), 2),
                   "vs_specbench_ar": round(rate(g) / ref_rate, 3) if ref_rate and ref_rate > 0 else math.nan,
                   "speedup": round(rate(g) / ar_rate, 3) if ar_rate and ar_rate > 0 else math.nan,
                   "tau": (round(g.new_tokens.sum() / g.target_forwards.sum(), 3) if g.target_forwards.sum() > 0
                           else math.nan),
                   "lossless": "-" if method == "ar" else (f"{int((checked == 'match').sum())}/{len(checked)}"
                                                           if len(checked) else ""),
                   "same_as_specbench_ar": "", "first_divergence": math.nan, "same_prompt_length": ""}
            if reference is not None:
                same, firsts, lengths = 0, [], 0
                for r in g.itertuples(index=False):
                    key = (str(r.dataset), str(r.prompt_id), int(r.turn))
                    mine, ref = tokens.get((method, *key)), reference[1].get(("ar", *key))
                    if mine is None or ref is None:
                        continue
                    verdict = compare(mine, ref)
                    same += verdict == "match"
                    firsts += [] if verdict == "match" else [_index(verdict)]
                    lengths += int(ref_prompt.get(key, -1) == int(r.prompt_tokens))
                row.update(same_as_specbench_ar=f"{same}/{len(g)}",
                           first_divergence=float(pd.Series(firsts).median()) if firsts else math.nan,
                           same_prompt_length=f"{lengths}/{len(g)}")
            rows.append(row)
    return pd.DataFrame(rows), len(shared)


def cross_backend_section(run_dirs: list[Path], out: Path) -> list[str]:
    """summary.md's "Across engines" section and engines.csv in `out`, when the runs compared were decoded by more
    than one engine; [] otherwise."""
    engines = {backend_of(read_meta(Path(d)), read_records(Path(d))) for d in run_dirs}
    if len(engines) < 2:
        return []
    table, shared = cross_backend_table(run_dirs)
    table.to_csv(Path(out) / "engines.csv", index=False)
    md = ["## Across engines", "",
          f"Every engine's methods on the {shared} prompt turn(s) every run's `ar` finished. A speedup is within one "
          "engine (against that run's own `ar`); tok/s compare engines directly (each with its own weights and "
          "arithmetic: a GGUF engine runs the quantised weights, specbench the de-quantised ones). "
          "`same_as_specbench_ar`: turns whose tokens equal specbench `ar`'s; `first_divergence`: the median first "
          "differing token where they differ; `same_prompt_length`: turns whose prompt tokenized to as many tokens "
          "(each engine tokenizes the same rendered text). Columns: report/backends.py; the table is engines.csv.", ""]
    if table.empty:
        return md + ["No prompt turn was finished by every run's `ar`: nothing to put side by side.", ""]
    md += [markdown_table(table), ""]
    ar = table[table.method == "ar"]
    for r in ar[ar.engine != SPECBENCH].itertuples(index=False):
        if r.same_as_specbench_ar:
            md.append(f"- {r.engine} `ar` ({r.run}) ran {r.vs_specbench_ar:.2f}x specbench `ar`'s tok/s; its tokens "
                      f"equal specbench `ar`'s on {r.same_as_specbench_ar.replace('/', ' of ')} prompt turns"
                      + (f" (first divergence at token {r.first_divergence:.0f}, median)"
                         if not math.isnan(r.first_divergence) else "")
                      + f"; prompts of equal token length on {r.same_prompt_length.replace('/', ' of ')}.")
    if SPECBENCH not in set(table.engine):
        md.append("- No specbench run among them: agreement with specbench `ar` is not measured.")
    return md + [""]
