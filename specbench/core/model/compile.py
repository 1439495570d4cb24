"""`--compile`: a model's batch-1 forwards through torch.compile at static shapes, compiled in warm-up.

A Compiled state is attached to a model (`enable`); from then on the batch-1 engine of that model is the static
engine (core/batch/static.py), which runs every decode forward through one compiled function at a bucketed query
width over a preallocated KV cache. On CUDA the function is compiled with mode="reduce-overhead": each shape is
recorded once as a CUDA graph and replayed (one launch a forward instead of hundreds); on a CPU, inductor's C++
kernels (there are no graphs to replay).

Buckets (query widths): powers of two up to the longest chain the run drafts (pld's --pld-draft-tokens + 1, sd's
gamma + 1: `declare`), and, as warm-up meets them, the exact widths no bucket holds (a tree's verify width is fixed
by its tree: the tree sizes the run uses). A width runs at the smallest bucket that holds it.

When compiling happens: the run's warm-up (run/runner.warm_up) meets the shapes its methods use and compiles them;
`finish_warm_up` then compiles every bucket (and every kind of input the warm-up met) it has not met yet, and
freezes the state: from then on nothing compiles. A timed turn that meets a width no bucket holds runs that forward
eagerly (uncompiled) and counts it (`eager_steps` in run.yaml's `compile:` block). Compile time is the time of each
shape's first call (compile, plus one forward), reported per shape in run.yaml and never inside a timed turn.
"""

from __future__ import annotations

import math
import os
import time
import types
import warnings
import weakref

import torch

from ..batch.static import StaticKV, step
from ..model.placement import input_device
from . import grouped_attention

# model -> its Compiled state (core/batch/engine.py asks state_of): kept beside the model, never on its module object
_STATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
ROUND = 128  # the cache's capacity is a multiple of this
CPP_WRAPPER = "SPECBENCH_COMPILE_CPP_WRAPPER"  # 0: inductor's Python wrapper on CPU (faster compile, slower calls)


def settings(device: torch.device) -> dict:
    """How the step compiles on this device (run.yaml's compile block reports it): CUDA graphs on CUDA (gpt-fast's
    "reduce-overhead"), inductor's C++ kernels elsewhere, called from a C++ wrapper (`cpp_wrapper`: the per-kernel
    Python calls of a many-layer forward are a visible share of a CPU decode step, benchmarks/RESULTS-cpu.md; it
    costs a slower first compile, and later runs read inductor's cache;
    $SPECBENCH_COMPILE_CPP_WRAPPER=0 leaves it out). Shapes are static (dynamic=False): one graph per bucket, never a symbolic one."""
    cuda = device.type == "cuda"
    wrapper = not cuda and os.environ.get(CPP_WRAPPER, "1").strip() != "0"
    return {"backend": "inductor", "mode": "reduce-overhead" if cuda else "default", "dynamic": False,
            "fullgraph": True, "cpp_wrapper": wrapper, "guards": "module attributes skipped"}


def compile_step(device: torch.device, name: str):
    """torch.compile of a copy of `step` of this state's own (its own code object: dynamo keeps a function's compiled
    graphs on its code object, so the target's and the drafter's graphs would share one list, every call checking
    both). Guards on nn.Module attributes are skipped (torch.compiler.skip_guard_on_all_nn_modules_unsafe): with one
    model's weights and buffers as graph inputs dynamo's guard check grows with the layers and costs a share of
    every call (benchmarks/RESULTS-cpu.md), and
    nothing here changes a module's attributes between calls (the runner's hooks are taken off for the call:
    static._Hooks); the step's own arguments (inputs, cache tensors, flags) stay guarded, and the weights are graph
    inputs read from the model at every call, never baked into a graph."""
    said = settings(device)
    options = dict(torch._inductor.list_mode_options(said["mode"]))  # reduce-overhead: {"triton.cudagraphs": True}
    options["guard_filter_fn"] = torch.compiler.skip_guard_on_all_nn_modules_unsafe
    if said["cpp_wrapper"]:
        options["cpp_wrapper"] = True
    code = step.__code__.replace(co_name=f"step_{name}")
    own = types.FunctionType(code, step.__globals__, code.co_name, step.__defaults__, step.__closure__)
    return torch.compile(own, backend=said["backend"], dynamic=said["dynamic"], fullgraph=said["fullgraph"],
                         options=options)


class Compiled:
    """One model's static cache, its compiled step, its buckets and what compiling them cost."""

    def __init__(self, model, capacity: int):
        self._model = weakref.ref(model)  # weak: the state table's value must not keep its key alive
        self.device = input_device(model)
        self.kv = StaticKV(_round(capacity))
        self.settings = settings(self.device)
        self.name = type(model).__name__  # what the compile lines say (the target's class, the drafter's)
        self.fn = compile_step(self.device, f"{self.name}_{id(model):x}")
        self.chain: list[int] = [1]  # the declared buckets (powers of two) of every unmasked kind of input
        # kind of input (embeds, masked, hidden) -> its buckets: the chain's for an unmasked kind, else the exact
        # widths warm-up met (a tree's)
        self.buckets: dict[tuple[bool, bool, bool], list[int]] = {}
        self.frozen = False
        self.shapes: dict[tuple, float] = {}  # (width, embeds, masked, hidden) -> seconds of its first call
        self.eager_steps = 0  # decode forwards run uncompiled after warm-up (a width no bucket holds)
        self.grown: list[int] = []  # capacities the cache grew to after warm-up (each a recompile)


    @property
    def model(self):
        return self._model()

    def declare(self, width: int) -> None:
        """A method drafts chains up to `width` tokens (with the last emitted one): every power of two up to the
        first one holding it is a bucket."""
        top = 1 << max(0, math.ceil(math.log2(max(1, width))))
        self.chain = sorted(set(self.chain) | {1 << i for i in range(top.bit_length())})
        for kind, sizes in self.buckets.items():
            if not kind[1]:
                self.buckets[kind] = sorted(set(sizes) | set(self.chain))

    def bucket(self, width: int, kind: tuple[bool, bool, bool]) -> int | None:
        """The query width a segment of `width` tokens of `kind` (embeds, masked, hidden) runs at: the smallest of
        the kind's buckets >= width; in warm-up a width none holds becomes one (a tree's width); after warm-up,
        None (run eagerly)."""
        sizes = self.buckets.get(kind)
        if sizes is None:
            if self.frozen:  # a kind of input warm-up never met: nothing compiled for it
                self.eager_steps += 1
                return None
            sizes = self.buckets[kind] = [] if kind[1] else list(self.chain)
        fits = [b for b in sizes if b >= width]
        if fits:
            return fits[0]
        if self.frozen:
            self.eager_steps += 1
            return None
        sizes.append(width)
        sizes.sort()
        return width

    def make_room(self, need: int) -> None:
        """Entries the next forward writes up to (exclusive); beyond the capacity the cache is reallocated at twice
        the size (new addresses: every shape compiles again, so capacity is sized up front: `capacity_for`)."""
        if need <= self.kv.capacity:
            return
        old = self.kv
        self.kv = StaticKV(_round(max(need, 2 * old.capacity)))
        for layer, (k, v) in enumerate(zip(old.keys, old.values)):
            self.kv.allocate(layer, k, v)
            self.kv.keys[layer][:, :, :old.capacity] = k
            self.kv.values[layer][:, :, :old.capacity] = v
        self.kv.length = old.length
        if self.frozen:
            self.grown.append(self.kv.capacity)
            from ...progress import console

            console.print(f"[yellow]warning[/] --compile: a context longer than the static cache's {old.capacity} "
                          f"entries; grown to {self.kv.capacity} (its shapes compile again, inside a timed turn)")

    def call(self, inputs, positions, write_at, allowed, embeds: bool, hidden: bool, compiled: bool) -> torch.Tensor:
        """The static step, compiled or eager; a compiled shape's first call is timed as its compile time."""
        if not compiled:
            return step(self.model, self.kv, inputs, positions, write_at, allowed, embeds, hidden)
        key = (inputs.shape[1], embeds, allowed is not None, hidden)
        first = key not in self.shapes
        if first:
            _sync(self.device)
            t0 = time.perf_counter()
        if self.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()  # the previous replay's outputs were consumed (cloned)
        if self.frozen:  # nothing compiles after warm-up: a shape that would recompile runs eagerly, counted
            try:
                with torch._dynamo.config.patch(error_on_recompile=True):
                    out = self.fn(self.model, self.kv, inputs, positions, write_at, allowed, embeds, hidden)
            except torch._dynamo.exc.RecompileError:
                self.eager_steps += 1
                return step(self.model, self.kv, inputs, positions, write_at, allowed, embeds, hidden)
        else:
            with warnings.catch_warnings():  # torch's compiler stack warns of its own deprecated internals
                if first:
                    warnings.simplefilter("ignore", DeprecationWarning)
                    warnings.simplefilter("ignore", FutureWarning)
                out = self.fn(self.model, self.kv, inputs, positions, write_at, allowed, embeds, hidden)
        if first:
            _sync(self.device)
            self.shapes[key] = time.perf_counter() - t0
            _said(self.name, key, self.shapes[key])
        return out

    @torch.inference_mode()  # as every decode runs: a graph compiled outside it would compile again inside
    def finish_warm_up(self) -> None:
        """Compile every bucket at every kind of input the warm-up met that it has not compiled yet (a dummy forward
        each, into the cache's stale rows: the next sample's prefill starts it afresh), then freeze."""
        if not self.kv.keys:  # nothing ran (no warm-up): the cache's layers are unknown; shapes compile at first use
            self.frozen = True
            return
        hidden_size = self.model.get_input_embeddings().weight.shape[1]
        dtype = self.model.get_input_embeddings().weight.dtype
        for (embeds, masked, hidden), sizes in sorted(self.buckets.items()):
            for width in sizes:
                if (width, embeds, masked, hidden) in self.shapes:
                    continue
                inputs = (torch.zeros(1, width, hidden_size, dtype=dtype, device=self.device) if embeds
                          else torch.zeros(1, width, dtype=torch.long, device=self.device))
                at = torch.arange(width, device=self.device)
                allowed = (at[None, :].new_ones(width, self.kv.capacity, dtype=torch.bool).tril()
                           if masked else None)
                self.call(inputs, at[None], at, allowed, embeds, hidden, compiled=True)
        self.kv.length = 0
        self.frozen = True

    def report(self) -> dict:
        """run.yaml's `compile:` block: the settings, the cache, every compiled shape's seconds, what ran eagerly."""
        return {**self.settings, "device": str(self.device),
                "capacity": self.kv.capacity, "buckets": sorted({b for s in self.buckets.values() for b in s}),
                "shapes": [{"width": w, "inputs": "embeddings" if e else "tokens", "mask": "tree" if m else "causal",
                            "output": "hidden" if h else "logits", "seconds": round(s, 3)}
                           for (w, e, m, h), s in sorted(self.shapes.items())],
                "seconds": round(sum(self.shapes.values()), 3), "eager_steps": self.eager_steps,
                **({"grown_to": self.grown} if self.grown else {})}


def enable(model, capacity: int) -> Compiled:
    """Attach a Compiled state to `model` (its batch-1 engine becomes the static one); returns it."""
    # one graph per bucket and kind of input: more than dynamo's default of 8 recompilations a function
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
    torch._dynamo.config.accumulated_cache_size_limit = max(torch._dynamo.config.accumulated_cache_size_limit, 1024)
    return attach(model, Compiled(model, capacity))


def attach(model, state: Compiled) -> Compiled:
    """Make `state` the model's compile state, its attention the grouped one (no copy of the cache per query head)."""
    _STATES[model] = state
    grouped_attention.use(model)
    return state


def disable(model) -> None:
    _STATES.pop(model, None)
    grouped_attention.restore(model)


def state_of(model) -> Compiled | None:
    return _STATES.get(model)


def declared_width(method) -> int:
    """The longest chain a method verifies in one forward (its drafts + the last emitted token), where it says so:
    pld's draft tokens, sd's gamma; 1 otherwise (a tree method's width joins the buckets when warm-up meets it), and 1
    for a method that never decodes on the static engine (`static_engine = False`: PEARL's own caches)."""
    if not getattr(method, "static_engine", True):
        return 1
    options = getattr(method, "options", None)
    draft = getattr(options, "pld_draft_tokens", None) or getattr(method, "gamma", None) or 0
    return int(draft) + 1


def _said(name: str, key: tuple, seconds: float) -> None:
    """One line per compiled shape as warm-up meets it (minutes on a 2-core CPU: the user sees progress)."""
    from ...progress import console

    width, embeds, masked, hidden = key
    console.print(f"[dim]--compile {name}: width {width} ({'embeddings' if embeds else 'tokens'}, "
                  f"{'tree' if masked else 'causal'} mask, {'hidden' if hidden else 'logits'}) compiled in "
                  f"{seconds:.1f} s (not timed)[/]")


def _round(n: int) -> int:
    return max(ROUND, -(-n // ROUND) * ROUND)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)

