"""Pricing a method whose step is a shape rather than a chain of k drafts: lookahead decoding's (W, N, G), a Jacobi
window of W columns and N - 1 levels beside up to G verified n-grams, all in one forward. A chain's draft length
fixes its forward's width (k + 1); a shape's forward holds the window's W (N - 1) inputs whatever it accepts, and
its tokens per step come from the n-grams the window made earlier, so neither follows from an acceptance per
position. Priced instead from a grid of shapes measured on validation prompts (`specbench estimate --method
lookahead` files `shapes` rows: window, ngram, guesses, tokens_per_step, mean_width):

    speedup(W, N, G) = tokens_per_step(W, N, G) / (L(mean_width) / L(1)),

L read from a latency curve at a KV length (made non-decreasing in width; a fractional width read between its two
neighbours). Off the grid, the independent-guesses model (each of the G n-grams right for its first d tokens with
probability p^d, independently of the others) gives

    tokens_per_step = 1 + sum over d = 1 .. N - 1 of (1 - (1 - p^d)^G),

with p fitted to the measured grid where there is one (`fitted_accuracy`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SpecbenchError

ROW_FIELDS = ("window", "ngram", "guesses", "tokens_per_step", "mean_width")


@dataclass(frozen=True)
class ShapeCandidate:
    """A shape, the tokens a step emits with it and the inputs its forward holds (on average or at most)."""

    window: int
    ngram: int
    guesses: int
    tokens_per_step: float
    width: float

    def speedup(self, costs: list[float]) -> float:
        """Predicted speedup over one-token decoding on a curve of relative costs (costs[w - 1] = L(w) / L(1))."""
        w = max(self.width, 1.0)
        lo = min(int(w), len(costs))
        hi = min(lo + 1, len(costs))
        cost = costs[lo - 1] + (costs[hi - 1] - costs[lo - 1]) * (w - lo) if w < len(costs) else costs[-1]
        return self.tokens_per_step / cost

    @property
    def label(self) -> str:
        return f"W {self.window}, N {self.ngram}, G {self.guesses}"


def check_rows(rows, where: str) -> list[dict]:
    """`shapes` rows as filed, or a clear error naming the fields and the command that writes them."""
    if not isinstance(rows, list) or not rows or not all(
            isinstance(r, dict) and set(ROW_FIELDS) <= set(r) for r in rows):
        raise SpecbenchError(f"{where}: `shapes` must be a list of rows with {', '.join(sorted(ROW_FIELDS))} (write "
                             "it again with `specbench estimate --method lookahead`)")
    return rows


def measured(rows: list[dict], window: int | None = None, ngram: int | None = None,
             guesses: int | None = None) -> list[ShapeCandidate]:
    """The measured shapes (an acceptance file's `shapes` rows) agreeing with the given values."""
    out = []
    for r in rows:
        c = ShapeCandidate(int(r["window"]), int(r["ngram"]), int(r["guesses"]), float(r["tokens_per_step"]),
                           float(r["mean_width"]))
        if (window or c.window) == c.window and (ngram or c.ngram) == c.ngram and (guesses or c.guesses) == c.guesses:
            out.append(c)
    return out


def independent_tokens_per_step(ngram: int, guesses: int, accuracy: float) -> float:
    """The independent-guesses model's tokens per step for G guesses of N - 1 tokens, each token right with
    probability `accuracy` given the ones before it."""
    return 1.0 + sum(1.0 - (1.0 - accuracy ** d) ** guesses for d in range(1, ngram))


def fitted_accuracy(rows: list[dict]) -> float | None:
    """The per-token accuracy p whose independent-guesses model comes closest (least squares on tokens per step) to
    the measured rows, to three decimals; None without rows."""
    shapes = measured(rows) if rows else []
    if not shapes:
        return None

    def error(p: float) -> float:
        return sum((independent_tokens_per_step(s.ngram, s.guesses, p) - s.tokens_per_step) ** 2 for s in shapes)

    return min((i / 1000 for i in range(1, 1000)), key=error)  # error is smooth in p: a fine grid is enough


def relative_costs(profile, most: int, kv_length: int, padded: bool = False) -> list[float]:
    """[L(w) / L(1) for w = 1 .. most] at `kv_length`, made non-decreasing in w (a narrower input can be padded to
    a wider one, so a measured dip is noise). `padded`: a width between two measured ones costs the wider one's L
    (a compiled run pads a forward to its bucket, the profile's widths; beyond the widest, extrapolated), where
    without it L is interpolated between them (an eager forward runs at its own width)."""
    def at(w: int) -> float:
        held = [x for x in profile.widths if x >= w] if padded else []
        return profile.latency_ms(held[0] if held else w, kv_length)

    costs = [at(w) for w in range(1, most + 1)]
    for w in range(len(costs) - 2, -1, -1):
        costs[w] = min(costs[w], costs[w + 1])
    return [c / costs[0] for c in costs]


def best_measured(rows: list[dict], profile, kv_length: int) -> tuple[ShapeCandidate, float]:
    """(the measured shape with the highest predicted speedup on `profile` at `kv_length`, that speedup); the
    narrower shape on a tie."""
    shapes = measured(rows)
    costs = relative_costs(profile, max(int(s.width) + 1 for s in shapes), kv_length)
    best = max(shapes, key=lambda s: (round(s.speedup(costs), 6), -s.width))
    return best, best.speedup(costs)
