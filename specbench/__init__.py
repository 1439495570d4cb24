"""specbench: benchmark speculative and parallel decoding methods on your own hardware."""

from pathlib import Path

__version__ = "0.1.0"

# The checkout this package runs from: shipped data (artifacts/, trees/, profiles/, datasets/) lives beside it.
REPO_ROOT = Path(__file__).resolve().parent.parent
