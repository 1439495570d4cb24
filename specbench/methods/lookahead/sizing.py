"""Lookahead decoding's W, N and G sized to the hardware: the shape with the highest predicted speedup

    speedup(W, N, G) = E[tokens per step](W, N, G) / (L(width) / L(1)),

L read from this machine's latency profile as the trees read it (planning/batch_choice.py), width the step's forward:
the window's W (N - 1) inputs and the trie's nodes. E comes from a measurement on validation prompts where one is
filed (`specbench estimate --method lookahead`: each shape of a grid decoded greedily, its tokens per step and mean
forward width; shapes.py; priced as plan and recommend price them, planning/shape_pricing.py), else from a stated
model: each of the G verified n-grams is right for its first d tokens with probability p^d, independently of the
others (the independent-guesses model the paper relates lookahead decoding to speculative decoding with), so

    E = 1 + sum over d = 1 .. N - 1 of (1 - (1 - p^d)^G),

p fitted to the measured grid where one is filed (a shape given off the grid), else ACCURACY, an assumption; with W = G (the paper's configurations tie them; the model has no term for W) and the widest forward, (W + G)(N - 1).
The paper's configuration for 7B models on an A100 (its evaluation scripts: W = 15, N = 5, G = 15) is the ceiling of
the grid, `--lookahead-shape paper` takes it as is, and without a profile it is used, with a note naming the command
that measures one."""

from __future__ import annotations

from ...planning.shape_pricing import ShapeCandidate as Candidate
from ...planning.shape_pricing import fitted_accuracy, independent_tokens_per_step, measured

PAPER_WINDOW, PAPER_NGRAM, PAPER_GUESSES = 15, 5, 15
SIDES = (1, 2, 3, 4, 6, 8, 11, 15)  # W and G tried (each at most the paper's 15)
NGRAMS = (3, 4, 5)  # N tried (at most the paper's 5)
ACCURACY = 0.08  # the stated model's chance that one guessed token is right, given the ones before it, where no
# measured grid gives one (planning/shape_pricing.fitted_accuracy)


def stated_tokens_per_step(ngram: int, guesses: int, accuracy: float = ACCURACY) -> float:
    """The stated model's E for G guesses of N - 1 tokens each."""
    return independent_tokens_per_step(ngram, guesses, accuracy)


def stated(window: int | None, ngram: int | None, guesses: int | None,
           accuracy: float = ACCURACY) -> list[Candidate]:
    """Every grid shape agreeing with the given values, priced by the stated model: W = G where neither is given;
    W given: G from the grid; G given: W = G (the model has no term for W, which would otherwise always be 1)."""
    out = []
    for n in ([ngram] if ngram else NGRAMS):
        for side in SIDES:
            if window:
                w, g = window, guesses or side
            else:
                w = g = guesses or side
            out.append(Candidate(w, n, g, stated_tokens_per_step(n, g, accuracy), float((w + g) * (n - 1))))
    return list(dict.fromkeys(out))


def widest(window: int | None, ngram: int | None, guesses: int | None) -> int:
    """The widest forward any shape `choose` considers can hold: the costs must reach it."""
    w, g = max(window or 0, PAPER_WINDOW, *SIDES), max(guesses or 0, PAPER_GUESSES, *SIDES)
    return (w + g) * (max(ngram or 0, PAPER_NGRAM, *NGRAMS) - 1)


def choose(costs: list[float] | None, window: int | None, ngram: int | None, guesses: int | None,
           rows: list[dict] | None = None, rows_from: str = "", curve: str = "L(w)") -> tuple[Candidate, str]:
    """(the shape, why) from relative costs (None: no profile) and measured rows (None: none filed)."""
    if window and ngram and guesses:
        return Candidate(window, ngram, guesses, 0.0, float((window + guesses) * (ngram - 1))), "given"
    if costs is None:
        n, w, g = ngram or PAPER_NGRAM, window or PAPER_WINDOW, guesses or PAPER_GUESSES
        return (Candidate(w, n, g, 0.0, float((w + g) * (n - 1))),
                "the paper's configuration (no latency profile of this hardware; `specbench profile` measures one)")
    found = measured(rows or [], window, ngram, guesses)
    fitted = None if found else fitted_accuracy(rows or [])
    if found:
        model = f"tokens per step measured on validation prompts ({rows_from})"
    elif fitted is not None:
        model = (f"tokens per step from the stated model, its guess accuracy {fitted:g} a token fitted to the shapes "
                 f"measured on validation prompts ({rows_from}), none of which has the values given")
    else:
        model = (f"tokens per step from the stated model (an assumed guess accuracy {ACCURACY:g} a token; `specbench "
                 "estimate --method lookahead` measures them)")
    pool = found or stated(window, ngram, guesses, ACCURACY if fitted is None else fitted)
    best = max(pool, key=lambda c: (round(c.speedup(costs), 6), -c.width))
    return best, (f"predicted speedup {best.speedup(costs):.2f}x: {best.tokens_per_step:.2f} tokens per step / "
                  f"{curve} at width {best.width:.0f} relative to one token's; {model}")


def paper(window: int | None, ngram: int | None, guesses: int | None) -> tuple[Candidate, str]:
    """`--lookahead-shape paper`: the paper's configuration where a value is not given."""
    n, w, g = ngram or PAPER_NGRAM, window or PAPER_WINDOW, guesses or PAPER_GUESSES
    return Candidate(w, n, g, 0.0, float((w + g) * (n - 1))), "the paper's configuration (--lookahead-shape paper)"
