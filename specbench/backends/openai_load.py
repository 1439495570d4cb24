"""Load generation against a server: a closed loop (N conversations in flight, the next one starts when one ends)
and an open loop (requests arrive at seeded Poisson times, whatever is in flight). A conversation is one prompt's
turns, sent one after the other (a later turn carries the server's earlier answers), so every row of a multi-turn
prompt sees the same conversation as specbench's own runs. A request is one turn: under a request rate R, a
two-turn prompt is two of the Poisson arrivals (request_arrivals), its second sent at its own arrival or when its
first is answered, whichever is later.

Both loops run `job(item)` on threads (the work is waiting on sockets, not Python) and return, in the items' order,
what each job returned, plus the phase's wall time from its first send to its last answer.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def poisson_arrivals(count: int, rate: float, seed: int) -> list[float]:
    """Arrival times (seconds from the phase's start) of `count` requests at `rate` per second: exponential gaps with
    mean 1/rate from a generator seeded with `seed`, the first request at 0 (so a phase starts when it starts)."""
    if rate <= 0:
        raise ValueError(f"request rate must be positive (got {rate})")
    rng = random.Random(seed)
    times, now = [], 0.0
    for i in range(count):
        if i:
            now += rng.expovariate(rate)
        times.append(now)
    return times


def request_arrivals(turns: Sequence[int], rate: float, seed: int) -> list[list[float]]:
    """Per conversation, the arrival time of each of its turns: `sum(turns)` seeded Poisson arrivals at `rate`
    requests per second, dealt to the conversations' turns in order (conversation 0's turns first), so the rate
    counts requests, not conversations."""
    times = poisson_arrivals(sum(turns), rate, seed)
    out, at = [], 0
    for n in turns:
        out.append(times[at:at + n])
        at += n
    return out


def closed_loop(items: Sequence[T], concurrency: int, job: Callable[[T], R]) -> tuple[list[R], float]:
    """Run `job` over `items` with `concurrency` in flight (a new one starts as soon as one finishes), in the items'
    order of start; returns the results in the items' order and the wall seconds of the whole phase."""
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        results = list(pool.map(job, items))
    return results, time.perf_counter() - start


def open_loop(items: Sequence[T], arrivals: Sequence[float], job: Callable[[T], R]) -> tuple[list[R], float]:
    """Start `job(items[i])` at `arrivals[i]` seconds from now, however many are still in flight (an open loop: a
    slow server builds a queue instead of slowing the arrivals); results in the items' order, and the phase's wall
    seconds (from the first arrival to the last answer)."""
    results: list = [None] * len(items)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = job(items[i])
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller below
            errors.append(exc)

    start = time.perf_counter()
    threads = []
    for i, at in enumerate(arrivals):
        delay = start + at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        thread = threading.Thread(target=run, args=(i,), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results, time.perf_counter() - start
