"""An acceptance profile: per draft position (depth) and rank, the probability that the guess is the true token given
that its parent was accepted. What `--synthetic-acceptance` draws from, what `plan` prices with, and what travels
between tools as NVIDIA Model Optimizer's `speculation_profile.json` (conditional and marginal per-position rates,
optionally per category).

Sources, one parser (`read`):
- rates given on the command line: `0.8,0.6,0.4` (position 1, 2, 3, conditional on the previous position accepted);
  a position may list per-rank rates `0.6/0.1/0.05` (rank 1, 2, 3 at that depth: a tree's siblings);
- a specbench acceptance file (`specbench estimate`'s output, acceptance/published/...): its `per_rank` rows, or a
  chain method's `conditional` list;
- a speculation_profile.json: its `conditional_accept_rates` (the top-level ones, or one category's with
  `FILE#category`).

Conventions: row d of `per_rank` is depth d + 1; the chain rate at a depth is rank 0's; beyond the last row nothing is
accepted. The expected accepted drafts of a chain of k drafts is sum_{i<=k} prod_{j<=i} c_j (marginal_i = prod c_j).
Torch-free: planning, the CLI's option parsing and the report read it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..errors import SpecbenchError

SCHEMA_VERSION = "1.0"  # the speculation_profile.json schema this module writes and reads


@dataclass(frozen=True)
class AcceptanceProfile:
    """per_rank[d][r]: P(the rank-r guess at depth d + 1 is the true token | its parent accepted), each row summing to
    at most 1 (a depth's ranks are exclusive). `source` says where it came from, in words for run.yaml and report.md."""

    per_rank: tuple[tuple[float, ...], ...]
    source: str
    categories: dict = field(default_factory=dict, compare=False)  # category -> its own AcceptanceProfile

    @property
    def conditional(self) -> list[float]:
        """The chain's rate per position (rank 0 at each depth)."""
        return [row[0] if row else 0.0 for row in self.per_rank]

    @property
    def marginal(self) -> list[float]:
        """P(the first i + 1 drafts of a chain all accepted), per position."""
        out, run = [], 1.0
        for c in self.conditional:
            run *= c
            out.append(run)
        return out

    def rate(self, depth: int, rank: int = 0) -> float:
        """depth >= 1; 0 beyond the profile's positions and ranks."""
        if depth < 1 or depth > len(self.per_rank):
            return 0.0
        row = self.per_rank[depth - 1]
        return row[rank] if 0 <= rank < len(row) else 0.0

    def chain_expectation(self, k: int) -> tuple[float, float]:
        """(mean, variance) of the accepted drafts of one chain step of k drafts."""
        marginal = self.marginal[:k] + [0.0] * max(0, k - len(self.per_rank))
        mean = sum(marginal)
        # E[n^2] = sum_i (2i - 1) P(n >= i)
        second = sum((2 * i + 1) * m for i, m in enumerate(marginal))
        return mean, max(second - mean * mean, 0.0)

    def tree_expectation(self, paths: list[tuple[int, ...]]) -> tuple[float, float]:
        """(mean, variance) of the accepted depth of one tree step over candidate paths (ranks from the root): a
        node is reached with the product of its path's rates (the ranks at a depth are exclusive)."""
        reach = {(): 1.0}
        for p in sorted(paths, key=len):
            reach[tuple(p)] = reach.get(tuple(p[:-1]), 0.0) * self.rate(len(p), p[-1])
        depth_at_least: dict[int, float] = {}
        for p, r in reach.items():
            if p:
                depth_at_least[len(p)] = depth_at_least.get(len(p), 0.0) + r
        mean = sum(depth_at_least.values())
        second = sum((2 * d - 1) * m for d, m in depth_at_least.items())
        return mean, max(second - mean * mean, 0.0)

    def per_rank_rows(self, rows: int, ranks: int = 10) -> list[list[float]]:
        """`rows` per-rank rows of `ranks` entries (zeros beyond the profile), as planning's tree search reads them."""
        return [[self.rate(d, r) for r in range(ranks)] for d in range(1, rows + 1)]


def rates(accepted: list[int], drafted: list[int], reached: list[int] | None = None
          ) -> tuple[list[float], list[float]]:
    """Measured counts per draft position -> (conditional, marginal). accepted_i: steps that kept draft i; drafted_i:
    steps that drafted it; reached_i: steps that drafted it after keeping draft i - 1 (Generation counts it; without
    it min(accepted_{i-1}, drafted_i) bounds it, exact when every step drafts the same length). conditional_i =
    accepted_i / reached_i; marginal_i = the product of the conditionals to i (a chain that always drafts i)."""
    if reached is None:
        reached = [min(d, accepted[i - 1]) if i else d for i, d in enumerate(drafted)]
    conditional = [min(a / r, 1.0) if r else 0.0 for a, r in zip(accepted, reached)]
    marginal, run = [], 1.0
    for c in conditional:
        run *= c
        marginal.append(run)
    return conditional, marginal


def _checked(rows: list[list[float]], what: str) -> tuple[tuple[float, ...], ...]:
    if not rows or not all(rows):
        raise SpecbenchError(f"{what}: no rates (give one per draft position, e.g. 0.8,0.6,0.4)")
    for d, row in enumerate(rows, 1):
        for x in row:
            if not isinstance(x, (int, float)) or isinstance(x, bool) or math.isnan(x) or not 0 < x <= 1:
                raise SpecbenchError(f"{what}: rate {x!r} at position {d} is outside (0, 1]; each rate is the "
                                     "probability that the draft is accepted given the previous position was")
        if sum(row) > 1 + 1e-6:
            raise SpecbenchError(f"{what}: the ranks at position {d} sum to {sum(row):.3f} > 1 (one of them at most "
                                 "can be the true token)")
    return tuple(tuple(float(x) for x in row) for row in rows)


def parse_rates(text: str) -> AcceptanceProfile:
    """`0.8,0.6,0.4` or `0.6/0.1,0.5/0.1`: per position (and rank) conditional rates."""
    rows = []
    for part in text.split(","):
        try:
            rows.append([float(x) for x in part.strip().split("/")])
        except ValueError:
            raise SpecbenchError(f"acceptance rates {text!r}: {part.strip()!r} is not a number (give rates in (0, 1] "
                                 "separated by commas, ranks at one position by /, or an acceptance file)") from None
    return AcceptanceProfile(_checked(rows, f"acceptance rates {text!r}"), f"stated rates {text}")


def _trimmed(rows: list[list[float]]) -> list[list[float]]:
    """Drop zero ranks at the end of each row and zero rows at the end (a file's padding, not a stated rate)."""
    out = []
    for row in rows:
        row = list(row)
        while row and row[-1] == 0:
            row.pop()
        out.append(row)
    while out and not out[-1]:
        out.pop()
    if any(not row for row in out):
        cut = next(i for i, row in enumerate(out) if not row)
        out = out[:cut]  # a position that is never accepted ends the profile there
    return out


def _from_speculation_profile(data: dict, path: str, category: str | None) -> AcceptanceProfile:
    cats = data.get("per_category") or {}
    if category is not None:
        if not isinstance(cats, dict) or category not in cats:
            raise SpecbenchError(f"{path}: no category {category!r} (it has: {', '.join(cats) or 'none'})")
        data = cats[category]
    rates = data.get("conditional_accept_rates")
    if rates is None and isinstance(data.get("marginal_accept_rates"), list):  # conditional_i = m_i / m_{i-1}
        m = data["marginal_accept_rates"]
        rates = [m[i] / (m[i - 1] if i else 1.0) if (m[i - 1] if i else 1.0) > 0 else 0.0 for i in range(len(m))]
    if not isinstance(rates, list) or not all(isinstance(x, (int, float)) for x in rates):
        raise SpecbenchError(f"{path}: not a speculation profile (needs a list `conditional_accept_rates` or "
                             "`marginal_accept_rates`)")
    rows = _trimmed([[float(x)] for x in rates])
    label = f"{path}#{category}" if category else path
    profile = AcceptanceProfile(_checked(rows, path), f"speculation profile {label}")
    if category is None and isinstance(cats, dict):
        subs = {}
        for name, sub in cats.items():
            if isinstance(sub, dict) and ("conditional_accept_rates" in sub or "marginal_accept_rates" in sub):
                subs[name] = _from_speculation_profile(data, path, name)
        object.__setattr__(profile, "categories", subs)
    return profile


def read(spec: str) -> AcceptanceProfile:
    """Rates (`0.8,0.6,0.4`) or a file: a speculation_profile.json (`FILE#category` for one category), a specbench
    acceptance file (`per_rank` rows or a chain's `conditional` list)."""
    path, _, category = spec.partition("#")
    if not Path(path).exists():
        if re.fullmatch(r"[0-9.,/eE+\- ]+", spec):
            return parse_rates(spec)
        raise SpecbenchError(f"acceptance {spec!r}: no such file, and not rates (e.g. 0.8,0.6,0.4)")
    try:
        text = Path(path).read_text()
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise SpecbenchError(f"{path}: cannot read it as an acceptance file ({exc})") from None
    if not isinstance(data, dict):
        raise SpecbenchError(f"{path}: not an acceptance file (a mapping with per_rank, conditional or "
                             "conditional_accept_rates)")
    if "conditional_accept_rates" in data or "marginal_accept_rates" in data or category:
        return _from_speculation_profile(data, path, category or None)
    table = data.get("per_rank", data.get("conditional"))
    if isinstance(table, list) and table and not isinstance(table[0], list):
        table = [[x] for x in table]  # a chain's conditional rates
    if not (isinstance(table, list) and all(isinstance(r, list) for r in table)):
        raise SpecbenchError(f"{path}: needs `per_rank` (rows of per-rank rates per depth, as `specbench estimate` "
                             "writes) or `conditional` (a chain's rates per position)")
    if not all(isinstance(x, (int, float)) and 0 <= x <= 1 for r in table for x in r):
        raise SpecbenchError(f"{path}: every rate must be a probability in [0, 1]")
    return AcceptanceProfile(_checked(_trimmed(table), path), str(path))


# ------------------------------------------------------------------------------------- speculation_profile.json

def speculation_profile(conditional: list[float], method: str, target: str, mean_per_step: float | None = None,
                        mean_per_request: float | None = None, per_category: dict | None = None,
                        conditions: dict | None = None, measured: bool = True) -> dict:
    """A speculation_profile.json payload (Model Optimizer's schema: both conventions, named, and the per-step mean
    checked against 1 + sum(marginals)). `per_category`: {category: {"conditional": [...], "mean_per_step": x,
    "mean_per_request": y}}."""
    marginal, run = [], 1.0
    for c in conditional:
        run *= c
        marginal.append(run)
    implied = 1.0 + sum(marginal)
    mean = implied if mean_per_step is None else mean_per_step
    cats = None
    if per_category:
        cats = {name: {k: v for k, v in speculation_profile(c["conditional"], method, target, c.get("mean_per_step"),
                                                             c.get("mean_per_request")).items()
                       if k in ("conditional_accept_rates", "marginal_accept_rates", "mean_accept_length",
                                "mean_accept_length_per_request")}
                for name, c in per_category.items()}
    return {
        "schema_version": SCHEMA_VERSION, "measured": measured, "method": method, "draft_checkpoint": None,
        "target_model": {"name": target}, "num_speculative_tokens": len(conditional),
        "max_supported_k": len(conditional), "verification_method": "longest_prefix",
        "conditional_accept_rates": [round(x, 6) for x in conditional],
        "marginal_accept_rates": [round(x, 6) for x in marginal],
        "mean_accept_length": round(mean, 6),
        "mean_accept_length_per_request": None if mean_per_request is None else round(mean_per_request, 6),
        "accept_length_model": "chain_analytic", "per_category": cats, "measurement_conditions": conditions,
        "validation": {"mean_consistency": {"implied_mean_accept_length": round(implied, 6),
                                            "reported_mean_accept_length": round(mean, 6),
                                            "abs_delta": round(abs(implied - mean), 6)}},
    }


def write_speculation_profile(payload: dict, path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=2) + "\n")
    except OSError as exc:
        raise SpecbenchError(f"cannot write {path}: {exc.strerror or exc}") from exc
