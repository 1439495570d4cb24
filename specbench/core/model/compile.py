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

import itertools
import math
import os
import time
import types
import warnings
from pathlib import Path
import weakref

import torch

from ..batch.cache import sliding_windows
from ..batch.static import StaticKV, step
from ..model.placement import input_device
from . import grouped_attention, linear_kernels

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
        # per layer: its sliding window (None: full attention), applied by the static step's masks
        self.windows = tuple(sliding_windows(model)) if hasattr(model, "config") else ()
        self.kv = StaticKV(_round(capacity), self.windows)
        self.settings = settings(self.device)
        self.name = type(model).__name__  # what the compile lines say (the target's class, the drafter's)
        self.fn = compile_step(self.device, f"{self.name}_{id(model):x}")
        self.chain: list[int] = [1]  # the declared buckets (powers of two) of every unmasked kind of input
        # kind of input (embeds, masked, hidden) -> its buckets: the chain's for an unmasked kind, else the exact
        # widths warm-up met (a tree's)
        self.buckets: dict[tuple[bool, bool, bool], list[int]] = {}
        self.trees: list[set[int]] = []  # each tree method's declared widths (every state of every tree it lays out)
        self.frozen = False
        self.shapes: dict[tuple, float] = {}  # (width, embeds, masked, hidden) -> seconds of its first call
        self.eager_steps = 0  # decode forwards run uncompiled after warm-up (a width no bucket holds)
        self.compiled_steps = 0  # decode forwards run through the compiled step after warm-up
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

    def declare_tree(self, widths: set[int]) -> None:
        """A tree method verifies at these exact widths (one per tree state it lays out): when warm-up meets one of
        them at a kind of input, all of them become that kind's buckets, so a state the warm-up prompt never reached
        is compiled too."""
        if widths:
            self.trees.append(set(widths))

    def widest(self) -> int:
        """The widest forward the run declared (chain or tree): the cache's room beyond the longest context."""
        return max([*self.chain, *(w for t in self.trees for w in t)])

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
        grown = {width}.union(*(t for t in self.trees if width in t)) if kind[1] else {width}
        sizes[:] = sorted(set(sizes) | grown)
        return width

    def make_room(self, need: int) -> None:
        """Entries the next forward writes up to (exclusive); beyond the capacity the cache is reallocated at twice
        the size (new addresses: every shape compiles again, so capacity is sized up front: `capacity_for`)."""
        if need <= self.kv.capacity:
            return
        old = self.kv
        self.kv = StaticKV(_round(max(need, 2 * old.capacity)), self.windows)
        for layer, (k, v) in enumerate(zip(old.keys, old.values)):
            self.kv.allocate(layer, k, v)
            self.kv.keys[layer][:, :, :old.capacity] = k
            self.kv.values[layer][:, :, :old.capacity] = v
        self.kv.length = old.length
        if self.frozen:  # every compiled shape again at the new capacity, now: the rest of the run stays compiled
            from ...progress import console
            from ..batch.static import _Hooks

            self.grown.append(self.kv.capacity)
            t0 = time.perf_counter()
            with _Hooks(self.model).stripped(), torch.inference_mode():  # the runner's counters see no dummy forward
                for key in sorted(self.shapes):
                    self._dummy(*key, start=self.kv.capacity - key[0])
            console.print(f"[yellow]warning[/] --compile: a context longer than the static cache's {old.capacity} "
                          f"entries; grown to {self.kv.capacity}, its {len(self.shapes)} shapes compiled again in "
                          f"{time.perf_counter() - t0:.1f} s inside a timed turn (run.yaml: grown_to)")

    def call(self, inputs, positions, write_at, allowed, embeds: bool, hidden: bool, compiled: bool) -> torch.Tensor:
        """The static step, compiled or eager; a compiled shape's first call is timed as its compile time."""
        if not compiled:
            return step(self.model, self.kv, inputs, positions, write_at, allowed, embeds, hidden)
        key = (inputs.shape[1], embeds, allowed is not None, hidden)
        first = key not in self.shapes
        if first:
            if not self.shapes:  # the first compile of this model: say how long the wait may be
                _say_start(self.name, self.device)
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
            self.compiled_steps += 1
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
        # plain tokens to logits (every chain's verify, sd's drafts): the declared chain, met in warm-up or not
        self.buckets.setdefault((False, False, False), list(self.chain))
        for (embeds, masked, hidden), sizes in sorted(self.buckets.items()):
            for width in sizes:
                if (width, embeds, masked, hidden) not in self.shapes:
                    self._dummy(width, embeds, masked, hidden, start=0)
        self.kv.length = 0
        self.frozen = True

    def _dummy(self, width: int, embeds: bool, masked: bool, hidden: bool, start: int) -> None:
        """One forward of a shape on zeros, written to cache rows start..start+width-1 (stale rows: the next
        prefill starts afresh, or beyond the live length after a growth)."""
        embedding = self.model.get_input_embeddings().weight
        inputs = (torch.zeros(1, width, embedding.shape[1], dtype=embedding.dtype, device=self.device) if embeds
                  else torch.zeros(1, width, dtype=torch.long, device=self.device))
        at = torch.arange(start, start + width, device=self.device)
        allowed = (torch.arange(self.kv.capacity, device=self.device)[None, :] <= at[:, None]) if masked else None
        frozen, self.frozen = self.frozen, False
        try:
            self.call(inputs, at[None], at, allowed, embeds, hidden, compiled=True)
        finally:
            self.frozen = frozen

    def report(self) -> dict:
        """run.yaml's `compile:` block: the settings, the cache, every compiled shape's seconds, what ran eagerly."""
        return {**self.settings, "device": str(self.device),
                "capacity": self.kv.capacity, "buckets": sorted({b for s in self.buckets.values() for b in s}),
                "shapes": [{"width": w, "inputs": "embeddings" if e else "tokens", "mask": "tree" if m else "causal",
                            "output": "hidden" if h else "logits", "seconds": round(s, 3)}
                           for (w, e, m, h), s in sorted(self.shapes.items())],
                "seconds": round(sum(self.shapes.values()), 3), "compiled_steps": self.compiled_steps,
                "eager_steps": self.eager_steps,
                **({"grown_to": self.grown} if self.grown else {})}


def enable(model, capacity: int) -> Compiled:
    """Attach a Compiled state to `model` (its batch-1 engine becomes the static one); returns it."""
    # one graph per bucket and kind of input: more than dynamo's default of 8 recompilations a function
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
    torch._dynamo.config.accumulated_cache_size_limit = max(torch._dynamo.config.accumulated_cache_size_limit, 1024)
    state = attach(model, Compiled(model, capacity))
    chosen = linear_kernels.use(model, state.device)  # each bucket's CPU linear kernel, measured (linear_kernels.py)
    if chosen:
        state.settings["linear"] = chosen
    return state


def attach(model, state: Compiled) -> Compiled:
    """Make `state` the model's compile state, its attention the grouped one (no copy of the cache per query head)."""
    _STATES[model] = state
    grouped_attention.use(model)
    return state


def disable(model) -> None:
    _STATES.pop(model, None)
    grouped_attention.restore(model)
    linear_kernels.restore(model)


def state_of(model) -> Compiled | None:
    return _STATES.get(model)


def unsupported(config) -> str | None:
    """Why the static engine cannot decode a model of this config correctly, or None: it caches and masks full and
    sliding-window attention layers only (chunked attention, linear attention, state-space or convolution mixers
    would compute something else), with one window size (its masks carry one windowed variant beside the full one,
    as transformers' per-layer-kind masks do)."""
    from ..batch.attention import ATTENTION_LAYERS
    from ..batch.cache import read_windows

    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    name = getattr(text, "model_type", None) or type(config).__name__
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs

        kinds = set(get_layer_types_and_kwargs(text)[0])
    except Exception:  # a transformers release without the helper: the config's own field
        kinds = set(getattr(text, "layer_types", None) or ())
    odd = sorted(kinds - ATTENTION_LAYERS - {"dummy"})
    if odd:
        return (f"{name} has {', '.join(odd)} layers; the static engine caches and masks full and sliding-window "
                "attention only")
    sizes = sorted({w for w in read_windows(config) if w is not None})
    if len(sizes) > 1:
        return f"{name} has sliding windows of different sizes {sizes}; the static engine's masks carry one"
    return None


def declared_tree_widths(method) -> set[int]:
    """The verify widths of every tree state a tree method lays out at batch 1 (its plan's layouts: root, prompt
    inputs and candidates of each state); empty for a chain method or one off the static engine."""
    plan = (getattr(method, "plans", None) or {}).get(1)
    if plan is None or plan.dynamic is not None or not getattr(method, "static_engine", True):  # dynamic: per step
        return set()
    return {int(layout.visible.shape[0]) for layout in plan.layouts.values()}


def declared_width(method) -> int:
    """The longest chain a method verifies in one forward (its drafts + the last emitted token), where it says so:
    pld's draft tokens, sd's gamma; 1 otherwise (a tree method's width joins the buckets when warm-up meets it), and 1
    for a method that never decodes on the static engine (`static_engine = False`: PEARL's own caches)."""
    if not getattr(method, "static_engine", True):
        return 1
    options = getattr(method, "options", None)
    draft = getattr(options, "pld_draft_tokens", None) or getattr(method, "gamma", None) or 0
    return int(draft) + 1


CACHED_FILES = 50  # files in inductor's cache from which earlier builds are taken to be there (counted up to this)


def inductor_cache() -> tuple[Path | None, int]:
    """(inductor's on-disk cache folder, files in it): compiled kernels a later compile of the same shapes reads
    back instead of building them again. (None, 0) where torch does not say where it is."""
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        folder = Path(cache_dir())
    except (ImportError, AttributeError, OSError):
        return None, 0
    if not folder.is_dir():
        return folder, 0
    return folder, sum(1 for _ in itertools.islice((p for p in folder.rglob("*") if p.is_file()), CACHED_FILES))


def _say_start(name: str, device: torch.device) -> None:
    """Before the first shape compiles: the wait to expect, from whether inductor's cache holds earlier builds."""
    from ...progress import console

    folder, files = inductor_cache()
    if folder is None:
        return
    wait = ("seconds per shape: inductor's cache holds earlier builds" if files >= CACHED_FILES else
            "minutes per shape on a CPU (C++ kernels built from scratch; later runs read them back)"
            if device.type == "cpu" else "a minute or so per shape (Triton kernels built from scratch)")
    held = f"{files}+" if files >= CACHED_FILES else str(files)
    console.print(f"[dim]--compile {name}: compiling its first shape: expect {wait} ({folder}: {held} files)[/]")


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

