"""The host work of a decode step in the price: what a step pays outside the target's forwards and the drafting
(building the tree's inputs, masks and positions, the acceptance's argmax or sampling over the tree's rows, the
cache compacted to the accepted path, Python), which a profile's L(w) cannot see.

A tree's prediction (buildtree.predict, size_curve, candidate_curve) prices a step at L(w) + drafting, and ar's at
L(1). Both measured steps pay host work on top: a compiled float32 run (benchmarks/RESULTS-cpu.md, stop 68) paid
ppd 1.79 ms a step and ar 0.49 beside a 25 ms forward, and the host work grows with the tree (an eager run here: ppd
0.94 / 1.07 / 4.16 ms a step at sizes 2 / 8 / 32). Unpriced, a large tree looks cheaper than it runs, and
every tree's step cost misses by the difference.

Where the figures come from: the runs on this machine. After a batch-1 greedy run, each tree method's and ar's host
ms a decode step (summary.csv: host_overhead x wall_s over the decode steps, report/prediction_split.parts) is
divided by the same run's ar forward ms a decode step (its step less its host work): a point in units of ar's
forward, (verify width, ratio). The prediction multiplies the ratio by the profile's L(1), so a point carries to
another sitting as the profile's own curve does (the machine's clock moves both). Points are kept in the user cache
(host_work.json), per hardware key, model, dtype, eager or compiled, and method family (ppd, medusa, ...; ar's
own); a run folder filed again (a resumed run) replaces its own points.

The law read from the points: the median ratio at each verify width measured, read linearly between them, flat
below the narrowest and along the last slope beyond the widest (never falling). Host work is not linear in the
width: a compiled float32 run's ppd paid 0.065 / 0.080 / 0.298 of ar's forward at widths 6 / 12 / 36. Without
points the price has no host part, as before, and report.md says so.
$SPECBENCH_HOST_WORK=0 neither reads nor records (the test suite's default: a test's prediction must not depend on
what an earlier test ran).
"""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

FILE = "host_work.json"  # in the user cache
KEPT = 32  # recent points per key
AR = "ar"  # ar's key: its host work is ar's step's, beside L(1)


def enabled() -> bool:
    return os.environ.get("SPECBENCH_HOST_WORK", "1") not in ("0", "off", "no")


def key(hardware: str, model: str, dtype: str, compiled: bool, method: str) -> str:
    return f"{hardware}/{model}/{dtype}/{'compiled' if compiled else 'eager'}/{method}"


@dataclass(frozen=True)
class HostLaw:
    """ratio(w): host ms a step per ms of ar's forward at verify width w, read linearly between `knots` (width,
    the median ratio of the figures at that width), flat below the narrowest, along the last two knots' slope
    beyond the widest (never falling); `points`: how many run figures it was read from."""

    knots: tuple[tuple[float, float], ...]
    points: int

    def ratio(self, width: float) -> float:
        ks = self.knots
        if width <= ks[0][0] or len(ks) == 1:  # one width measured: the same at every width
            return ks[0][1]
        for (w0, r0), (w1, r1) in zip(ks, ks[1:]):
            if width <= w1:
                return r0 + (r1 - r0) * (width - w0) / (w1 - w0)
        (w0, r0), (w1, r1) = ks[-2], ks[-1]
        return r1 + max((r1 - r0) / (w1 - w0), 0.0) * (width - w1)

    @property
    def widths(self) -> tuple[float, ...]:
        return tuple(w for w, _ in self.knots)

    @staticmethod
    def fit(points: list[tuple[float, float]]) -> HostLaw | None:
        """The law through (width, ratio) points (widths within half a token are one); None without any."""
        points = sorted((float(w), float(r)) for w, r in points if math.isfinite(w) and math.isfinite(r) and r >= 0)
        if not points:
            return None
        groups: list[list[tuple[float, float]]] = []
        for w, r in points:
            if groups and w - groups[-1][0][0] < 0.5:
                groups[-1].append((w, r))
            else:
                groups.append([(w, r)])
        knots = tuple((statistics.median(w for w, _ in g), statistics.median(r for _, r in g)) for g in groups)
        return HostLaw(knots, len(points))


@dataclass(frozen=True)
class HostPrice:
    """A method's host work and ar's, priced on a profile's clock: `step_ms(w, L1)` is the tree's host ms a step at
    verify width w, `ar_ms(L1)` ar's, both where L1 is the profile's L(1) at the context priced."""

    method: HostLaw
    ar: HostLaw

    def step_ms(self, width: float, l1: float) -> float:
        return self.method.ratio(width) * l1

    def ar_ms(self, l1: float) -> float:
        return self.ar.ratio(1.0) * l1

    def said(self) -> str:
        """One line for report.md and the tree file: where the host price comes from."""
        at = ", ".join(f"{w:g}: {r:.3f}" for w, r in self.method.knots)
        return (f"{self.method.points} figure(s), host ms a step / ar's forward by verify width {at}; "
                f"ar's {self.ar.ratio(1.0):.3f}")


def where() -> Path:
    """The file the points are kept in."""
    from ..core.store import user_cache

    return user_cache() / FILE


def _read() -> dict:
    from ..core.store import read_cached_json

    return read_cached_json(FILE)


def law(k: str, data: dict | None = None) -> HostLaw | None:
    rows = (data if data is not None else _read()).get(k) or []
    return HostLaw.fit([(p.get("width", math.nan), p.get("ratio", math.nan)) for p in rows if isinstance(p, dict)])


@dataclass(frozen=True)
class Filed:
    """One family's filed host work (`specbench list host-work`): its key's parts, its law, its latest figure's
    time and run."""

    dtype: str
    decoding: str  # eager | compiled
    method: str
    law: HostLaw
    latest: str
    run: str


def filed(hardware: str, model: str) -> list[Filed]:
    """Every family's host work filed for this hardware key and model, ar first, then by dtype and decoding."""
    out = []
    for k, rows in _read().items():
        parts = k.split("/")
        if len(parts) != 5 or parts[:2] != [hardware, model] or not isinstance(rows, list):
            continue
        fitted = law(k)
        if fitted is None:
            continue
        last = max((p for p in rows if isinstance(p, dict)), key=lambda p: str(p.get("when", "")))
        out.append(Filed(parts[2], parts[3], parts[4], fitted, str(last.get("when", "")), str(last.get("run", ""))))
    return sorted(out, key=lambda f: (f.dtype, f.decoding, f.method != AR, f.method))


def price(hardware: str, model: str, dtype: str, compiled: bool, method: str) -> HostPrice | None:
    """The host price of `method` here (None: off, or no run here has measured both it and ar)."""
    if not enabled():
        return None
    data = _read()
    mine = law(key(hardware, model, dtype, compiled, method), data)
    ar = law(key(hardware, model, dtype, compiled, AR), data)
    return HostPrice(mine, ar) if mine is not None and ar is not None else None


def for_profile(profile, method: str) -> HostPrice | None:
    """The host price for a prediction on `profile` (batch 1 only: the points are batch 1's), of this machine."""
    if profile is None or (profile.meta or {}).get("batch_size", 1) != 1 or profile.source != "measured":
        return None
    return price(profile.hardware, profile.model, profile.dtype, profile.compiled, method)


def remember(run_dir: Path, new: dict[str, list[dict]]) -> int:
    """File a finished run's points (key -> [{width, ratio, ...}]: report/prediction_split.host_points), replacing
    the run's own earlier ones; the points filed (best effort: an unwritable cache records nothing)."""
    if not enabled() or not new:
        return 0
    run = str(Path(run_dir).resolve())
    data = _read()
    for k, points in new.items():
        kept = [p for p in data.get(k, []) if isinstance(p, dict) and p.get("run") != run]
        data[k] = (kept + [{**p, "run": run} for p in points])[-KEPT:]
    from ..core.store import write_cached_json

    return sum(len(p) for p in new.values()) if write_cached_json(FILE, data, indent=1) else 0
