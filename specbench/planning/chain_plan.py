"""`plan` for the chain methods (pld, sd, pearl): the draft length k that a latency curve and an acceptance profile
(`specbench estimate --method pld|sd|pearl`, or a speculation_profile.json from elsewhere) make fastest.

  tau(k)     = 1 + sum_{i<=k} marginal_i                      (a chain that drafts k, its stated acceptance)
  step(k)    = L(k + 1) + drafting(k)                         (sd: the drafter's k forwards follow each other)
             = max(L(k + 1), drafting(k))                     (pearl: drafter and target run at the same time)
  drafting   = k x a drafter forward                          (draft-free methods such as pld: 0, host work)
  host       = this machine's host work a step at width k + 1 where its runs filed it (host_work.py), added to
             step(k), and ar's to L(1) (recommend, here only)
  a drafter forward = L(1) x drafter share on a measured profile; on a GPU preset its own fixed cost plus its share
             of the target's reading time (latency_estimate.drafting_forward_ms)
  speedup(k) = tau(k) L(1) / step(k)

The drafter share is its weights read per forward over the target's (`drafter_share` in the acceptance file, which
`estimate` writes from the drafter it ran), on the same curve, as plan.py argues for the tree methods' drafters.

A family whose step is a shape, not a chain (lookahead decoding's W, N, G: `Family.shaped`), is priced from the
measured grid of shapes its acceptance file holds (`shapes`; shape_pricing.py): tokens per step over L(mean forward
width) / L(1), never from its acceptance per position, which would price its window's inputs as free.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import families
from ..core.acceptance_profile import read
from ..errors import SpecbenchError
from . import host_work
from .latency_estimate import drafting_forward_ms
from .profile import LatencyProfile
from .shape_pricing import best_measured, check_rows

MAX_DRAFT = 16  # the longest chain searched
PARALLEL = ("pearl",)  # methods whose drafter runs beside the target's verification


@dataclass(frozen=True)
class ChainPlan:
    k: int  # the draft length (a shape: its n-grams' length, N - 1)
    tau: float
    speedup: float
    draft_ms: float
    shape: str = ""  # a shaped family's shape ("W 2, N 3, G 2"), "" for a chain
    width: float = 0.0  # the verify forward's inputs (a shape: its mean measured width)

    @property
    def label(self) -> str:
        """What the method would run with, as recommend's and plan's tables say it."""
        return f"{self.shape} (forward width {self.width:.1f})" if self.shape else f"chain of {self.k}"

    @property
    def size(self) -> int:
        """The number the tables rank by size: a chain's k, a shape's forward width."""
        return max(1, round(self.width)) if self.shape else self.k


def plan_shape(method: str, path: Path, fields: dict, profile: LatencyProfile, kv_length: int) -> ChainPlan:
    """A shaped family's best measured shape on `profile` (shape_pricing.py), or why it cannot be priced."""
    rows = fields.get("shapes")
    if not rows:
        raise SpecbenchError(f"{path}: no `shapes` (tokens per step of each measured shape) to price {method}, whose "
                             f"step is a window beside its verified n-grams, not a chain; `specbench estimate --method "
                             f"{method}` measures them")
    best, speedup = best_measured(check_rows(rows, str(path)), profile, kv_length)
    return ChainPlan(best.ngram - 1, round(best.tokens_per_step, 3), round(speedup, 3), 0.0, best.label,
                     round(best.width, 3))


def plan_chain(method: str, path: Path, fields: dict, profile: LatencyProfile, kv_length: int,
               drafter_layers: float = 1.0, host: host_work.HostPrice | None = None) -> ChainPlan:
    """The fastest draft length for `method` on `profile` with the acceptance in `path` (`drafter_layers`: the
    drafter's size in target decoder layers, for its fixed cost per forward on a preset; `host`: this machine's
    host work a step at verify width k + 1, and ar's beside L(1): host_work.py)."""
    if families.get(method).shaped:
        return plan_shape(method, path, fields, profile, kv_length)
    marginal = read(str(path)).marginal
    share = 0.0
    if families.get(method).kind != "draft-free":  # a drafter model's forwards
        share = fields.get("drafter_share")
        if not isinstance(share, (int, float)) or share <= 0:
            raise SpecbenchError(f"{path}: no `drafter_share` (the drafter's weights per forward over the "
                                 f"target's) to price {method}'s drafting; `specbench estimate --method {method} "
                                 "--drafter D` writes it")
    l1 = profile.latency_ms(1, kv_length)
    one = l1 + (host.ar_ms(l1) if host else 0.0)
    forward = drafting_forward_ms(profile, kv_length, share, drafter_layers) if share else 0.0
    best = None
    for k in range(1, min(len(marginal), MAX_DRAFT) + 1):
        tau = 1.0 + sum(marginal[:k])
        draft = k * forward
        verify = profile.latency_ms(k + 1, kv_length)
        step = max(verify, draft) if method in PARALLEL else verify + draft
        step += host.step_ms(k + 1, l1) if host else 0.0
        plan = ChainPlan(k, round(tau, 3), round(tau * one / step, 3), round(draft, 3))
        if best is None or plan.speedup > best.speedup:
            best = plan
    if best is None:
        raise SpecbenchError(f"{path}: no acceptance per position to plan {method} with")
    return best


def predict_here(method: str, model_spec: str, hardware: str, dtype: str, kv_length: int = 512
                 ) -> tuple[ChainPlan | None, str]:
    """`recommend`'s prediction of a chain method on this hardware: (its plan, "") from this hardware's profile and
    the method's acceptance file (acceptance/<model>/<method>.yaml), else (None, what is missing and the command that
    makes it)."""
    from ..core import lookup, store
    from ..core.model.load import model_slug
    from .acceptance import read_fields
    from .profile import load_profile

    key = model_slug(model_spec)
    relative = store.acceptance_file(key, method)
    found = lookup.find(lookup.ACCEPTANCE, relative, f"{method} acceptance")
    if found is None:
        return None, (f"no {relative}: `specbench estimate --method {method} --model {model_spec}` measures its "
                      "acceptance per draft position")
    hit = lookup.find_profile(hardware, key, dtype)
    if hit is None:
        return None, f"no {key} {dtype} profile for {hardware}: `specbench profile --model {model_spec}`"
    try:
        profile = load_profile(hit.path)
        return plan_chain(method, found.path, read_fields(found.path), profile, kv_length,
                          host=host_work.for_profile(profile, method)), ""
    except SpecbenchError as exc:
        return None, str(exc)
