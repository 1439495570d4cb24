"""Peak memory per generation (core/machine/memory.py, OwnMethods.run_method): one generation's peak never leaks into the next."""

from __future__ import annotations

import resource

import pytest
import torch

from specbench.run.config import RunConfig
from specbench.run.own_methods import OwnMethods
from specbench.core.machine import memory
from specbench.methods.base import Generation

BIG_MB = 256


class Allocates:
    """A stand-in method whose generation holds `mb` MiB for a moment."""

    def __init__(self, mb: int):
        self.mb = mb

    def generate(self, input_ids, max_new_tokens, sampling, generator):
        block = torch.ones(self.mb * 2**18)  # [mb MiB of float32], every page written
        assert float(block.sum()) == self.mb * 2**18
        return Generation()


def test_a_big_allocation_counts_only_in_its_own_generation(tiny):
    if not memory.cpu_reset_works():
        pytest.skip("this kernel cannot reset the peak RSS (/proc/self/clear_refs)")
    runner = OwnMethods(RunConfig(methods=("ar",), max_new_tokens=4), tiny, None)
    ids = torch.tensor([[1, 2, 3]])  # [1, T]
    peaks = [runner.run_method(Allocates(mb), ids, seed=0)[2] for mb in (BIG_MB, 0, BIG_MB, 0)]
    assert peaks[0] - peaks[1] > BIG_MB * 0.8 and peaks[2] - peaks[3] > BIG_MB * 0.8
    assert abs(peaks[0] - peaks[2]) < BIG_MB * 0.2  # the same generation measures the same, whatever ran before
    assert "during the generation" in memory.peak_label(torch.device("cpu"))


def test_without_the_reset_the_process_peak_is_reported_and_labelled(monkeypatch):
    monkeypatch.setattr(memory, "cpu_reset_works", lambda: False)
    monkeypatch.setattr(memory, "_clear_hwm", lambda: pytest.fail("reset attempted where it does not work"))
    cpu = torch.device("cpu")
    memory.reset_peak(cpu)
    assert memory.peak_mb(cpu) == pytest.approx(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, rel=0.05)
    assert "whole process" in memory.peak_label(cpu)


def test_cuda_peak_is_reset_and_read_on_the_generations_device(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: calls.append(("reset", device)))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: calls.append(("max", device)) or 3 * 2**20)
    gpu = torch.device("cuda", 1)
    memory.reset_peak(gpu)
    assert memory.peak_mb(gpu) == 3.0
    assert calls == [("reset", gpu), ("max", gpu)]
    assert "max_memory_allocated" in memory.peak_label(gpu)
