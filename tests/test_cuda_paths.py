"""CUDA-only branches run on the CPU with fake CUDA objects: PEARL's streams exec mode, CUDA-event timing, device
synchronisation, NVML facts. They check the control flow (which stream, thread, device, NVML call), not CUDA."""

from __future__ import annotations

import sys
import threading
import time
import types
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch

from specbench.core.batch.cache import new_cache
from specbench.core.machine.timing import now
from specbench.methods.pearl.scheduler import Executor
from specbench.core.batch.forward import forward, timed_forward
from specbench.core.machine.hardware import device_name, gpu_facts
from specbench.core.machine.timing import wall
from specbench.core.verify import Sampling
from specbench.methods.sd.drafter import layer_drafter
from specbench.methods import get_method

from .conftest import prompt_ids

GPU = torch.device("cuda", 0)


class FakeStream:
    def __init__(self, device=None):
        self.device, self.synchronized = device, 0

    def synchronize(self):
        self.synchronized += 1


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda.Stream / stream() / synchronize replaced by recorders; log.current.stream is this thread's."""
    log = SimpleNamespace(entered=[], synchronized=[], current=threading.local())

    @contextmanager
    def stream(s):
        log.entered.append((s, threading.current_thread().name))
        log.current.stream = s
        try:
            yield
        finally:
            log.current.stream = None

    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "stream", stream)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.synchronized.append(device))
    return log


def test_streams_mode_runs_each_job_on_its_own_stream_at_the_same_time(fake_cuda):
    ex = Executor("streams", GPU, GPU)
    target_stream, draft_stream = ex._streams
    assert target_stream is not draft_stream and target_stream.device == draft_stream.device == GPU

    # each job of `both` waits for the other to start (a sequential executor would break the barrier), then sleeps:
    # the overlap holds however late a busy machine schedules either thread
    together = threading.Barrier(2)

    def job(meet: bool = True):
        if meet:
            together.wait(timeout=30)
        time.sleep(0.05)
        return getattr(fake_cuda.current, "stream", None), threading.current_thread().name

    with ex.session():
        d, t, d_span, t_span = ex.both(job, job)
        alone_d, alone_t = ex.draft_only(lambda: job(False))[0], ex.target_only(lambda: job(False))[0]
    ex.close()
    main = threading.current_thread().name
    assert d[0] is draft_stream and d[1].startswith("specbench-draft") and t == (target_stream, main)
    assert alone_d[0] is draft_stream and alone_d[1] != main and alone_t == (target_stream, main)
    assert draft_stream.synchronized == target_stream.synchronized == 2  # each span ends after its stream's work
    assert min(d_span.end, t_span.end) - max(d_span.start, t_span.start) > 0.045  # both slept after meeting
    assert d_span.end - d_span.start >= 0.05 and t_span.end - t_span.start >= 0.05


def test_pearl_in_streams_mode_emits_the_ar_tokens(tiny, fake_cuda):
    """PEARL's loop with a streams executor (fake streams; the models stay on the CPU): the drafter's jobs run on
    the draft stream in the worker thread, the target's on the target stream, and greedy output is ar's."""
    pearl = get_method("pearl")(tiny, {"gamma": 3, "pearl_exec": "sequential"}, layer_drafter(tiny, [0]))
    pearl.executor = Executor("streams", GPU, GPU)
    target_stream, draft_stream = pearl.executor._streams
    ids = prompt_ids(2)
    gen = pearl.generate(ids, 24, Sampling(), None)
    pearl.executor.close()
    assert gen.tokens == get_method("ar")(tiny, {}).generate(ids, 24, Sampling(), None).tokens
    on_draft = [name for s, name in fake_cuda.entered if s is draft_stream]
    on_target = [name for s, name in fake_cuda.entered if s is target_stream]
    assert len(on_draft) == sum(s["draft"] is not None for s in gen.timeline) > 0
    assert len(on_target) == sum(s["target"] is not None for s in gen.timeline) > 0
    assert all(n.startswith("specbench-draft") for n in on_draft)
    assert set(on_target) == {threading.current_thread().name}


def test_cuda_event_timing_records_on_the_measured_devices_stream(tiny, fake_cuda, monkeypatch):
    """A forward on cuda:1 is queued on cuda:1's current stream: both events must be recorded there."""
    streams: dict = {}

    class Event:
        made: list = []

        def __init__(self, enable_timing=False):
            self.enable_timing, self.stream = enable_timing, "never recorded"
            Event.made.append(self)

        def record(self, stream=None):
            self.stream = stream

        def elapsed_time(self, end):
            return 12.5

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: streams.setdefault(device, FakeStream()))
    monkeypatch.setattr(torch.cuda, "Event", Event)
    cache = new_cache(tiny.model)
    forward(tiny.model, prompt_ids(0), cache)
    before = cache.get_seq_length()
    gpu1 = torch.device("cuda", 1)
    assert timed_forward(tiny.model, torch.tensor([[5, 6]]), cache, gpu1) == 12.5
    start, end = Event.made
    assert start.enable_timing and end.enable_timing
    assert start.stream is end.stream is streams[gpu1]
    assert fake_cuda.synchronized == [gpu1]  # elapsed_time is read after the device finished
    assert cache.get_seq_length() == before  # the timed tokens are dropped again


def test_wall_and_now_synchronise_the_cuda_device_and_not_the_cpu(fake_cuda):
    gpu1 = torch.device("cuda", 1)
    timed: dict = {}
    with wall(gpu1, timed):
        assert fake_cuda.synchronized == [gpu1]
    assert fake_cuda.synchronized == [gpu1, gpu1] and timed["s"] >= 0
    now(gpu1)
    with wall("cpu", {}):
        now(torch.device("cpu"))
    assert fake_cuda.synchronized == [gpu1] * 3


def fake_pynvml(name) -> tuple[types.ModuleType, list]:
    """A pynvml module answering for one H100, and the calls made to it."""
    calls: list = []
    nvml = types.ModuleType("pynvml")
    nvml.NVML_CLOCK_SM, nvml.NVML_CLOCK_MEM = 1, 2
    nvml.nvmlInit = lambda: calls.append("init")
    nvml.nvmlShutdown = lambda: calls.append("shutdown")
    nvml.nvmlDeviceGetHandleByIndex = lambda index: calls.append(("handle", index)) or f"handle{index}"
    nvml.nvmlDeviceGetName = lambda handle: name
    nvml.nvmlDeviceGetMemoryInfo = lambda handle: SimpleNamespace(total=85_520_809_984, free=0, used=0)
    nvml.nvmlSystemGetDriverVersion = lambda: b"550.54.15"
    nvml.nvmlDeviceGetMaxClockInfo = lambda handle, kind: {1: 1980, 2: 2619}[kind]
    return nvml, calls


@pytest.mark.parametrize("name", [b"NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"])
def test_nvml_facts_are_parsed_from_bytes_or_str(monkeypatch, name):
    nvml, calls = fake_pynvml(name)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    assert gpu_facts(1) == {"name": "NVIDIA H100 80GB HBM3", "memory_gib": 79.6, "driver": "550.54.15",
                            "sm_clock_max_mhz": 1980, "mem_clock_max_mhz": 2619}
    assert calls == ["init", ("handle", 1), "shutdown"]
    assert device_name(torch.device("cuda", 1)) == "NVIDIA H100 80GB HBM3"


def test_without_nvml_there_are_no_facts_and_the_name_comes_from_torch(monkeypatch):
    nvml, _ = fake_pynvml(b"unused")

    def no_library():
        raise RuntimeError("NVML Shared Library Not Found")

    nvml.nvmlInit = no_library
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "from torch")
    assert gpu_facts(0) == {}
    assert device_name(GPU) == "from torch"


def test_nvml_finds_torchs_gpu_by_pci_bus_id_and_keeps_facts_a_gpu_supports(monkeypatch):
    """CUDA_VISIBLE_DEVICES=1 makes torch's GPU 0 NVML's GPU 1: look it up by bus id, not by index; a clock query
    that MIG refuses drops only the clocks."""
    nvml, calls = fake_pynvml(b"NVIDIA H100 80GB HBM3")
    nvml.nvmlDeviceGetHandleByPciBusId = lambda bus: calls.append(("bus", bus)) or "by-bus"

    def refused(handle, kind):
        raise RuntimeError("Not Supported")

    nvml.nvmlDeviceGetMaxClockInfo = refused
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    props = SimpleNamespace(pci_domain_id=0, pci_bus_id=0x19, pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    facts = gpu_facts(0)
    assert facts == {"name": "NVIDIA H100 80GB HBM3", "memory_gib": 79.6, "driver": "550.54.15"}
    assert ("bus", b"00000000:19:00.0") in calls and calls[-1] == "shutdown"
