"""Running the drafter and the target at the same time (PEARL §3.4 "Parallelism", App. F/G deployment), and
measuring what really overlaps on this hardware.

Modes (`--pearl-exec`):
  sequential  the draft job, then the target job, in the calling thread: the algorithm without overlap
  threads     the draft job in a worker thread, the target job in the caller, CPU cores split between them
              (torch's intra-op thread count is per calling thread: the worker sets its own)
  streams     as threads, each job on its own CUDA stream of one GPU
  devices     as threads, with the drafter on another device (--draft-device: a second GPU, or the CPU)
  auto        the fastest of the modes this machine supports, by timing PEARL-shaped steps of the same gamma
              (not a guess; choose_mode)

A job's busy span is stamped with perf_counter after synchronising the job's device, so it covers device work.
"""

from __future__ import annotations

import copy
import statistics
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from rich.markup import escape

from ...errors import SpecbenchError
from ...progress import console
from ...core.batch.cache import crop_to, new_cache
from ...core.batch.forward import forward
from ...core.machine.forward_cost import measure_forward_times
from ...core.machine.timing import now, since
from ..timeline import Span

MODES = ("sequential", "threads", "streams", "devices")


class Executor:
    """Runs (draft job, target job) pairs in one mode and stamps their busy spans (perf_counter seconds)."""

    def __init__(self, mode: str, target_device: torch.device, draft_device: torch.device):
        if mode not in MODES:
            raise SpecbenchError(f"--pearl-exec {mode!r}: use one of {', '.join(MODES)} or auto")
        self.mode, self.target_device, self.draft_device = mode, target_device, draft_device
        total = torch.get_num_threads()
        cpu_split = mode == "threads" and target_device.type == "cpu"
        # on CPU the drafter (a few small layers) gets one core, the target the rest
        self.draft_threads = 1 if cpu_split else (1 if draft_device.type == "cpu" and mode == "devices" else total)
        self.target_threads = max(1, total - 1) if cpu_split else total
        self._pool = None
        self._streams = None
        if mode == "streams":
            if target_device.type != "cuda":
                raise SpecbenchError("--pearl-exec streams needs a CUDA device (--device cuda)")
            self._streams = (torch.cuda.Stream(target_device), torch.cuda.Stream(target_device))

    @contextmanager
    def session(self):
        """Around one generation: the worker thread exists, the caller's thread count is the target's share."""
        if self.mode != "sequential" and self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="specbench-draft",
                                            initializer=torch.set_num_threads, initargs=(self.draft_threads,))
        before = torch.get_num_threads()
        torch.set_num_threads(self.target_threads)
        try:
            yield self
        finally:
            torch.set_num_threads(before)

    def _timed(self, job, device: torch.device, stream):
        with torch.inference_mode():
            if stream is None:
                start = now(device)
                result = job()
                return result, Span(start, now(device))
            with torch.cuda.stream(stream):
                start = now()
                result = job()
                stream.synchronize()
                return result, Span(start, now())

    def both(self, draft_job, target_job):
        """Run both jobs (concurrently unless sequential); returns (draft result, target result, spans)."""
        d_stream, t_stream = (self._streams[1], self._streams[0]) if self._streams else (None, None)
        if self.mode == "sequential":
            d_res, d_span = self._timed(draft_job, self.draft_device, None)
            t_res, t_span = self._timed(target_job, self.target_device, None)
            return d_res, t_res, d_span, t_span
        future = self._pool.submit(self._timed, draft_job, self.draft_device, d_stream)
        t_res, t_span = self._timed(target_job, self.target_device, t_stream)
        d_res, d_span = future.result()
        return d_res, t_res, d_span, t_span

    def draft_only(self, job):
        stream = self._streams[1] if self._streams else None
        if self.mode == "sequential":
            return self._timed(job, self.draft_device, None)
        return self._pool.submit(self._timed, job, self.draft_device, stream).result()

    def target_only(self, job):
        return self._timed(job, self.target_device, self._streams[0] if self._streams else None)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def unsupported_modes(target_device: torch.device, draft_device: torch.device | None) -> dict[str, str]:
    """Mode -> why this machine cannot run it (the modes it can run are left out)."""
    why = {}
    if target_device.type != "cpu":
        why["threads"] = "a GPU target overlaps on CUDA streams (streams), not CPU threads"
    elif torch.get_num_threads() < 2:
        why["threads"] = "needs 2+ CPU threads"
    if target_device.type != "cuda":
        why["streams"] = "needs a CUDA target (--device cuda)"
    if draft_device is None or draft_device == target_device:
        why["devices"] = "needs a --draft-device other than the target's"
    return why


def available_modes(target_device: torch.device, draft_device: torch.device | None) -> list[str]:
    """The modes this machine can run: threads needs 2+ cores, streams a GPU, devices a second device."""
    return [m for m in MODES if m not in unsupported_modes(target_device, draft_device)]


def drafter_on(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """A copy of the drafter on another device (with its own copy of any shared embedding and head)."""
    if hasattr(model, "on_device"):
        return model.on_device(device)
    return copy.deepcopy(model).to(device)


def _pearl_step_cost(executor: Executor, target, drafter_model, gamma: int, reps: int = 3) -> float:
    """Median seconds of a PEARL-shaped step in this mode: gamma drafter forwards || one gamma-wide target forward."""

    vocab = target.model.get_input_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(1)
    ctx = torch.randint(0, vocab, (1, 64), generator=g)
    t_cache, d_cache = new_cache(target.model), new_cache(drafter_model)
    t_dev, d_dev = executor.target_device, executor.draft_device

    def draft_job():
        for _ in range(gamma):
            forward(drafter_model, ctx[:, :1].to(d_dev), d_cache)
        crop_to(d_cache, 64)

    def target_job():
        forward(target.model, ctx[:, :gamma].to(t_dev), t_cache)
        crop_to(t_cache, 64)

    times = []
    with executor.session():
        executor.both(lambda: forward(drafter_model, ctx.to(d_dev), d_cache),
                      lambda: forward(target.model, ctx.to(t_dev), t_cache))
        for _ in range(reps + 1):
            start = now()
            executor.both(draft_job, target_job)
            times.append(since(start))
    return statistics.median(times[1:])


@dataclass
class Calibration:
    mode: str
    reason: str  # why this mode: the flag, or what `auto` compared
    gamma: int  # the run's window: --gamma, else round(c) (PEARL §4.4.1)
    c: float  # target forward time / drafter forward time (1 token each), measured as the chosen mode runs them
    step_s: dict  # mode -> {gamma: seconds of a PEARL-shaped step}
    c_by_mode: dict
    skipped: dict  # mode -> why `auto` did not compare it


def choose_mode(step_s: dict[str, dict[int, float]], gamma_by_mode: dict[str, int]) -> tuple[str, str]:
    """The mode `auto` runs and why, from PEARL step seconds measured per mode at every gamma in gamma_by_mode.

    A mode runs at its own gamma (--gamma, else round(c) as that mode runs the models), so modes are compared on
    steps of the same shape: a mode that is fastest at every such gamma wins (always the case with --gamma).
    Otherwise the ranking depends on the gamma, and each mode is scored at its own gamma per drafted token (a
    post-verify step of window gamma emits up to gamma tokens).
    """
    gammas = sorted(set(gamma_by_mode.values()))
    fastest = {min(step_s, key=lambda m: step_s[m][g]) for g in gammas}
    at = f"gamma {gammas[0]}" if len(gammas) == 1 else f"each of gammas {', '.join(map(str, gammas))}"
    if len(fastest) == 1:
        return fastest.pop(), f"fastest measured step at {at} (every mode timed at the same gamma)"
    per_token = {m: step_s[m][gamma_by_mode[m]] / gamma_by_mode[m] for m in step_s}
    best = min(per_token, key=per_token.get)
    own = ", ".join(f"{m} {g}" for m, g in gamma_by_mode.items())
    return best, f"fastest step per drafted token at each mode's own gamma ({own}); no mode was fastest at {at}"


LITTLE_OVERLAP = 0.10  # a concurrent step saving less than this share of the sequential one: PEARL's premise fails


def overlap_note(cal: Calibration) -> str | None:
    """What to tell a user when drafting and verifying hardly ran at once here: the chosen mode's PEARL step at the
    run's gamma saved under LITTLE_OVERLAP of the sequential step (both measured by calibrate). Under CUDA streams
    both models' kernels are still launched by one Python thread, so a window of drafts can cost what it would in
    sd and PEARL can run slower than ar (benchmarks/RESULTS-gpu.md). None when there was no sequential step to
    compare or the overlap was real."""
    seq = cal.step_s.get("sequential", {}).get(cal.gamma)
    if seq is None or len(cal.step_s) < 2:
        return None
    if cal.mode == "sequential":
        others = ", ".join(f"{m} {by[cal.gamma] * 1e3:.1f} ms" for m, by in cal.step_s.items() if m != "sequential")
        said = f"no concurrent mode beat sequential here ({others} against {seq * 1e3:.1f} ms a step)"
    else:
        saved = 1 - cal.step_s[cal.mode][cal.gamma] / seq
        if saved >= LITTLE_OVERLAP:
            return None
        ms = cal.step_s[cal.mode][cal.gamma] * 1e3
        said = (f"drafting and verifying hardly overlapped here ({cal.mode} {ms:.1f} ms against {seq * 1e3:.1f} ms "
                f"sequential a step, {saved:.0%} saved)")
    return (f"pearl: {said} at gamma {cal.gamma}: PEARL's gain rests on the drafter running beside the target, so "
            "expect about sd's speed or less; a second device for the drafter (--draft-device, --pearl-exec devices) "
            "is what PEARL is built for")


def _measure_c(executor: Executor, target, drafter_model) -> float:
    """c = target forward time / drafter forward time (1 token each), as this mode runs the two models."""
    with executor.session():
        t1 = measure_forward_times(target.model, target.device)[1]
        d1 = executor.draft_only(lambda: measure_forward_times(drafter_model, executor.draft_device)[1])[0]
    return t1 / d1


def calibrate(target, model_for, requested: str, draft_device: torch.device | None,
              gamma: int | None, drafter_spec: str = "") -> Calibration:
    """Pick the exec mode (auto: choose_mode over the modes this machine runs), measure the speed ratio c and set the
    window gamma (memoised per pair).

    model_for(mode) gives the drafter module as that mode runs it (a copy on --draft-device for `devices`).
    """
    key = ("pearl_calibration", drafter_spec, requested, str(draft_device), gamma)
    if key in target.extras:
        return target.extras[key]
    unsupported = unsupported_modes(target.device, draft_device)
    if requested != "auto" and (requested not in MODES or requested in unsupported):
        raise SpecbenchError(f"--pearl-exec {requested} is not available here "
                             f"({unsupported.get(requested, 'unknown mode')}; available: "
                             f"{', '.join(available_modes(target.device, draft_device))})")
    modes = [m for m in MODES if m not in unsupported] if requested == "auto" else [requested]
    executors = {m: Executor(m, target.device, draft_device if m == "devices" else target.device) for m in modes}
    try:
        # 1. c as each mode runs the models: the gamma that mode would run at
        c_by_mode = {m: _measure_c(executors[m], target, model_for(m)) for m in modes}
        gamma_by_mode = {m: gamma or max(1, round(c_by_mode[m])) for m in modes}
        # 2. every mode timed at every gamma a mode would run at: steps of the same shape
        gammas = sorted(set(gamma_by_mode.values()))
        step_s = {m: {g: _pearl_step_cost(executors[m], target, model_for(m), g) for g in gammas} for m in modes}
    finally:
        for executor in executors.values():
            executor.close()
    best, reason = choose_mode(step_s, gamma_by_mode) if requested == "auto" else (requested, "--pearl-exec")
    skipped = unsupported if requested == "auto" else {}
    result = Calibration(best, reason, gamma_by_mode[best], c_by_mode[best], step_s, c_by_mode, skipped)
    target.extras[key] = result
    if note := overlap_note(result):  # said once, as the calibration is measured once per pair
        console.print(f"[yellow]note[/] {escape(note)}")
    return result
