"""Lookahead decoding (Fu et al. 2024, ICML): the step (method.py), its window, pool and one-forward layout
(window.py), and W and G sized to this hardware's latency curve (sizing.py)."""
