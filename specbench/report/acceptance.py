"""Acceptance in report.md, one definition: the accepted length per step (tau: tokens per target forward) both
token-weighted (every step of every request pooled: total tokens / total forwards, the headline, the number a
serving engine's counters give) and request-weighted (the mean of each request's own tau, which weights a short
request as much as a long one: the two differ only by averaging); per draft position, conditional (given the
previous position accepted) and marginal (the first i drafts all accepted), from records.csv's
`accepted_per_position`. A speculative method that never drafted is an error, not a 1.00x row. A run under
--synthetic-acceptance says so in its first lines, with the stated rates' expected tau beside the measured one."""

from __future__ import annotations

import pandas as pd

from .markdown import markdown_table

HEADLINE = ("Headline: **token-weighted** tau (all steps of all requests pooled: total tokens / total target "
            "forwards, the prefill's first token included). `tau per request` is the mean of each request's own tau; "
            "they differ only by averaging (a short request weighs as much as a long one in the second). Per "
            "position: `conditional` = P(draft i accepted | draft i - 1 accepted), over the steps that drafted "
            "position i; `marginal` = P(drafts 1..i all accepted) = the product of the conditionals to i (a chain "
            "that always drafts i). Each speculative method's rates are also written as "
            "speculation_profiles/<method>.json (Model Optimizer's speculation_profile.json): `plan --acceptance "
            "speculation_profiles` and `run --synthetic-acceptance speculation_profiles/<method>.json` read them.")


def synthetic_lines(meta: dict) -> list[str]:
    """report.md's first lines for a --synthetic-acceptance run ([] otherwise)."""
    block = meta.get("synthetic_acceptance")
    if not block:
        return []
    rates = ", ".join(f"{x:g}" for x in block.get("conditional") or [])
    if block.get("per_method"):  # a folder: each method its own file
        rates = "; ".join(f"{key}: " + ", ".join(f"{x:g}" for x in (one.get("conditional") or [])[:6])
                          for key, one in block["per_method"].items())
    checks = block.get("checks") or {}
    failed = [label for label, c in checks.items() if not c.get("agrees", True)]
    check = (f" The check FAILED for {', '.join(failed)}: its accepted drafts are not the stated rates' (see "
             "run.yaml's synthetic_acceptance.checks)." if failed else
             " Every method's accepted drafts agree with the stated rates within sampling error." if checks else "")
    return [f"> **Synthetic acceptance** ({block.get('source')}; conditional rates per position: {rates}): every "
            "method drafted and verified for real, but which drafts were kept was drawn, seeded, from these rates, "
            "not decided by the model. Step costs are real; tau and speedups are those of a model with this "
            "acceptance; the output is not the model's, so the lossless check is not applicable." + check, ""]


def _positions(text) -> list[tuple[int, int]]:
    if not isinstance(text, str) or not text.strip():
        return []
    return [tuple(int(x) for x in part.split("/")) for part in text.split()]


def per_position(records: pd.DataFrame) -> tuple[list[float], list[float]]:
    """(conditional, marginal) per draft position, pooled over the records' steps (core/acceptance_profile.rates:
    the records hold accepted and drafted counts per position, so a position's reached steps are bounded by the
    previous position's accepted ones)."""
    accepted: list[int] = []
    drafted: list[int] = []
    for text in records.get("accepted_per_position", pd.Series(dtype=object)):
        for i, (a, d) in enumerate(_positions(text)):
            if i >= len(accepted):
                accepted.append(0)
                drafted.append(0)
            accepted[i] += a
            drafted[i] += d
    from ..core.acceptance_profile import rates

    return rates(accepted, drafted)


def table(records: pd.DataFrame) -> pd.DataFrame:
    """Per method: token- and request-weighted tau and accepted drafts per step, and the first positions' rates."""
    rows = []
    for method, r in records.groupby("method", sort=False):
        steps = (r.target_forwards - 1).clip(lower=0)  # the prefill's forward is not a drafting step
        conditional, marginal = per_position(r)
        rows.append({
            "method": method,
            "tau (token-weighted)": round(r.new_tokens.sum() / max(r.target_forwards.sum(), 1), 3),
            "tau per request": round(pd.to_numeric(r.tau, errors="coerce").mean(), 3),  # empty for a server
            "accepted/step (token-weighted)": round(r.accepted_drafts.sum() / max(steps.sum(), 1), 3),
            "accepted/step per request": round((r.accepted_drafts / steps.clip(lower=1)).mean(), 3),
            "conditional by position": " ".join(f"{x:.2f}" for x in conditional[:8]) or "-",
            "marginal by position": " ".join(f"{x:.2f}" for x in marginal[:8]) or "-",
        })
    return pd.DataFrame(rows)


def never_drafted(records: pd.DataFrame) -> list[str]:
    """Speculative methods (not `ar`, and not a server's baseline) whose every row drafted nothing."""
    from ..methods import REGISTRY

    out = []
    for method, r in records.groupby("method", sort=False):
        cls = REGISTRY.get(str(method).split("@")[0])
        if cls is None or cls.kind == "baseline":
            continue
        if int(r.drafted.fillna(0).sum()) == 0:
            out.append(str(method))
    return out


def never_drafted_lines(records: pd.DataFrame) -> list[str]:
    bad = never_drafted(records)
    if not bad:
        return []
    return [f"**ERROR: {', '.join(bad)} never drafted** (0 draft tokens over the whole run): its speed is `ar`'s "
            "plus overhead and says nothing about the method. Check its artefact, options and data (pld finds no "
            "n-gram to copy on short prompts).", ""]


def section(records: pd.DataFrame, meta: dict) -> list[str]:
    """## Acceptance: the table above per method (batch 1 and batched rows pooled per label)."""
    if records.empty or "accepted_per_position" not in records:
        return []
    md = ["## Acceptance", "", markdown_table(table(records)), "", HEADLINE, ""]
    checks = (meta.get("synthetic_acceptance") or {}).get("checks") or {}
    if checks:
        rows = [{"method": label, "accepted drafts": c["accepted_drafts"],
                 "expected (stated rates)": c["expected_accepted_drafts"], "sd": c["sd"], "tau": c["tau"],
                 "agrees": "yes" if c["agrees"] else "NO"} for label, c in checks.items()]
        md += ["Synthetic acceptance check (accepted drafts against the stated rates' expectation, 5 sd):", "",
               markdown_table(pd.DataFrame(rows)), ""]
    return md


def _decode_mean(r: pd.DataFrame) -> float:
    """Tokens per decode step (the prefill's forward and its first token left out), over every step pooled."""
    steps = (r.target_forwards - 1).clip(lower=0).sum()
    return float((r.new_tokens - 1).clip(lower=0).sum() / steps) if steps else 1.0


def write_profiles(records: pd.DataFrame, run_dir, meta: dict) -> list:
    """speculation_profiles/<method>.json: each speculative method's measured acceptance in Model Optimizer's
    speculation_profile.json shape (conditional and marginal rates per position, the per-step and per-request
    means, per category), so `plan` and `run --synthetic-acceptance` can read it here or elsewhere. None for a
    synthetic run (its acceptance is the stated one, not a measurement)."""
    from pathlib import Path

    from ..core.acceptance_profile import speculation_profile, write_speculation_profile

    if meta.get("synthetic_acceptance") or records.empty or "accepted_per_position" not in records:
        return []
    model = str((meta.get("model") or {}).get("spec") or records.model.iloc[0])
    settings = meta.get("settings") or {}
    written = []
    for method, r in records.groupby("method", sort=False):
        conditional, _ = per_position(r)
        while conditional and conditional[-1] == 0:
            conditional.pop()
        if not conditional:  # ar, or a method that never drafted
            continue
        cats = {}
        if "category" in r and r.category.nunique() > 1:
            for cat, c in r.groupby("category"):
                cond, _ = per_position(c)
                cats[str(cat)] = {"conditional": cond, "mean_per_step": _decode_mean(c),
                                  "mean_per_request": float(((c.new_tokens - 1).clip(lower=0)
                                                             / (c.target_forwards - 1).clip(lower=1)).mean())}
        payload = speculation_profile(
            conditional, str(method), model, _decode_mean(r),
            float(((r.new_tokens - 1).clip(lower=0) / (r.target_forwards - 1).clip(lower=1)).mean()), cats or None,
            {"tool": "specbench run", "datasets": sorted(map(str, r.dataset.unique())), "turns": int(len(r)),
             "temperature": settings.get("temperature"), "dtype": str(r.dtype.iloc[0]) if "dtype" in r else None,
             "note": "rates per draft position over the steps that drafted it; a tree method's are its accepted "
                     "path's depth rates"})
        path = Path(run_dir) / "speculation_profiles" / f"{str(method).replace('/', '_')}.json"
        write_speculation_profile(payload, path)
        written.append(path)
    return written
