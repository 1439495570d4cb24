"""specbench: benchmark speculative and parallel decoding methods on your own hardware."""

__version__ = "0.1.0"
