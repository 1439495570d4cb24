"""Whether two runs emitted the same tokens: per method, how many of the prompt turns both runs hold are equal
(e.g. a sharded run against the unsharded one, or an offloaded target against the resident one).

Usage: python benchmarks/same_tokens.py RUN_A RUN_B   (exit 1 when any turn differs)
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

from specbench.run.results import read_tokens


def compare(a: Path, b: Path) -> dict[str, tuple[int, int]]:
    """method -> (turns equal, turns both runs hold)."""
    left, right = read_tokens(a), read_tokens(b)
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for key in left.keys() & right.keys():
        out[key[0]][0] += left[key] == right[key]
        out[key[0]][1] += 1
    return {method: (equal, both) for method, (equal, both) in sorted(out.items())}


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    counts = compare(Path(sys.argv[1]), Path(sys.argv[2]))
    for method, (equal, both) in counts.items():
        print(f"{method}: {equal} of {both} turns equal")
    if not counts or any(equal != both for equal, both in counts.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
