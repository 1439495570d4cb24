"""`--compile`: a model's decode forwards through torch.compile at static shapes, compiled in warm-up.

A Compiled state is attached to a model (`enable`); from then on the batch-1 engine of that model is the static
engine (core/batch/static.py), and its batch engine at B > 1 the static batch (core/batch/static_batch.py): each
runs every decode forward through one compiled function at a bucketed query width over a preallocated KV cache
(one per batch size, its slots side by side). On CUDA the function is compiled with mode="reduce-overhead": each
shape is recorded once as a CUDA graph and replayed (one launch a forward instead of hundreds); on a CPU,
inductor's C++ kernels (there are no graphs to replay).

Buckets (query widths): powers of two below the longest chain the run drafts and that chain's width itself (pld's
--pld-draft-tokens + 1, sd's gamma + 1: `declare`), powers of two up to the widest tree drafted afresh each step
(suffix decoding's), and, as warm-up meets them, the exact widths no bucket holds (a tree's verify width is fixed
by its tree: the tree sizes the run uses). A width runs at the smallest bucket that holds it.

When compiling happens: the run's warm-up (run/runner.warm_up) meets the shapes its methods use and compiles them;
`finish_warm_up` then compiles every bucket (and every kind of input the warm-up met) it has not met yet, and
freezes the state: from then on nothing compiles. A timed turn that meets a width no bucket holds runs that forward
eagerly (uncompiled) and counts it (`eager_steps` in run.yaml's `compile:` block). Compile time is the time of each
shape's first call (compile, plus one forward), reported per shape in run.yaml and never inside a timed turn; the
wait is said before it starts (compile_wait.py). A batch size compiles only the kinds of input its warm-up met.
"""

from __future__ import annotations

import math
import time
import warnings
import weakref

import torch

from ..batch.cache import sliding_windows
from ..batch.static import TAPS, StaticKV, step
from ..model.placement import input_device
from . import compile_graph, compile_report, compile_wait, grouped_attention, linear_kernels
from .compile_graph import CPP_WRAPPER, QUICK_BUILD, compile_step, settings, sync as _sync  # noqa: F401 (read here)
from .compile_wait import CACHED_FILES, inductor_cache, say_start as _say_start  # noqa: F401 (tests read them here)
from .compile_widths import declared_tree_widths, declared_varying_width, declared_width  # noqa: F401 (callers')

# model -> its Compiled state (core/batch/engine.py asks state_of): kept beside the model, never on its module object
_STATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
ROUND = 128  # the cache's capacity is a multiple of this


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
        self.linear_choice: dict[int, str] | None = None  # width bucket -> CPU linear kernel (enable measures it)
        self._graph = None  # the model the compiled step runs (compile_graph.py), built at its first use
        self.takes_edits = False  # whether its decoder layers take layer edits and taps yet (compile_graph.take_edits)
        self.tap_layers: tuple[int, ...] | None = None  # the layers a TAPS step reads the inputs of (taps_for)
        self.fn = compile_step(self.device, f"{self.name}_{id(model):x}")
        self.chain: list[int] = [1]  # the declared buckets (powers of two) of every unmasked kind of input
        # kind of input (embeds, masked, hidden) -> its buckets: the chain's for an unmasked kind, else the exact
        # widths warm-up met (a tree's)
        self.buckets: dict[tuple[bool, bool, bool], list[int]] = {}
        self.trees: list[set[int]] = []  # each tree method's declared widths (every state of every tree it lays out)
        self.batch_trees: dict[int, list[set[int]]] = {}  # the same per batch size > 1 (its own tree)
        self.batch_buckets: dict[int, dict] = {}  # slots -> kind of input -> its buckets, at batch sizes > 1
        self.tree_chain: list[int] = []  # power-of-two buckets of trees whose width varies a step (suffix decoding)
        self.declared_kinds: set = set()  # kinds of input compiled whether or not warm-up met them
        self.frozen = False
        self.shapes: dict[tuple, float] = {}  # (width, embeds, masked, hidden) -> seconds of its first call
        self.batch_shapes: dict[tuple, float] = {}  # (slots, width, embeds, masked, hidden) -> seconds, B > 1
        # ([slots,] width, embeds, masked, hidden, ((layer, rows) per layer edit)) -> seconds: shapes with layer edits
        self.edit_shapes: dict[tuple, float] = {}
        self.edited: set[tuple] = set()  # (slots, width, embeds, masked, hidden) warm-up met with layer edits
        self.edits_ahead: list[tuple] = []  # (width, kind, edits) of batch 1 compiled by finish_warm_up (declare_edits)
        self.read_back: dict[tuple, bool] = {}  # a key of any table -> inductor's cache served its first call
        self.batch_kv: dict[int, StaticKV] = {}  # slots -> the static batch's cache (core/batch/static_batch.py)
        self.met: dict[int, set] = {}  # slots -> the kinds of input its forwards met (what finish_warm_up compiles)
        self.expected = 0  # shapes this state is expected to compile (the progress lines' total)
        self.done = 0  # shapes it compiled so far (the progress lines' count)
        self.eager_steps = 0  # decode forwards run uncompiled after warm-up (a width no bucket holds)
        self.compiled_steps = 0  # decode forwards run through the compiled step after warm-up
        self.grown: list[int] = []  # capacities the cache grew to after warm-up (each a recompile)
        # a frozen call's "never recompile": one patch object, entered each call (building one costs a class a call)
        self._no_recompile = torch._dynamo.config.patch(error_on_recompile=True)


    @property
    def model(self):
        return self._model()

    @property
    def graph(self):
        """The model a compiled call traces and runs (compile_graph.graph_model: the model's twin with the linear
        kernels and layer edits); the eager step runs `model` itself."""
        if self._graph is None:
            self._graph = compile_graph.graph_model(self.model, self.linear_choice)
        return self._graph

    def declare(self, width: int) -> None:
        """A method drafts chains up to `width` tokens (with the last emitted one): every power of two below it, and
        `width` itself, are buckets. A full chain is its most frequent verify (pld's 10 drafts and the last token:
        11), and the next power of two would run it padded (16 rows of compute for 11)."""
        width = max(1, width)
        self.chain = sorted(set(self.chain) | {1 << i for i in range(width.bit_length()) if 1 << i < width} | {width})
        for table in (self.buckets, *self.batch_buckets.values()):
            for kind, sizes in table.items():
                if not kind[1]:
                    table[kind] = sorted(set(sizes) | set(self.chain))

    def declare_varying_tree(self, width: int, kind: tuple[bool, bool, bool] = (False, True, False)) -> None:
        """A method verifies trees of any width up to `width` (drafted afresh each step; tokens in, logits out by
        default): the masked kinds of input get power-of-two buckets up to the first one holding it (its trees are
        cut at any width), compiled even where warm-up drafted no tree (its prompt may find nothing to draft)."""
        top = 1 << max(0, math.ceil(math.log2(max(1, width))))
        self.tree_chain = sorted(set(self.tree_chain) | {1 << i for i in range(top.bit_length())})
        self.declared_kinds.add(kind)
        self.buckets.setdefault(kind, [])
        for table in (self.buckets, *self.batch_buckets.values()):
            for kind, sizes in table.items():
                if kind in self.declared_kinds:
                    table[kind] = sorted(set(sizes) | set(self.tree_chain))

    def declare_tree(self, widths: set[int], slots: int = 1) -> None:
        """A tree method verifies at these exact widths at batch size `slots` (one per tree state it lays out): when
        warm-up meets one of them at a kind of input, all of them become that kind's buckets, so a state the warm-up
        prompt never reached is compiled too."""
        if widths:
            (self.trees if slots == 1 else self.batch_trees.setdefault(slots, [])).append(set(widths))

    def take_edits(self) -> None:
        """Let the graph model's decoder layers take layer edits from here on (compile_graph.take_edits; before the
        first compile where a run has a method with edits: graphs traced before it would otherwise be checked again)."""
        if not self.takes_edits:
            compile_graph.take_edits(self.graph)
            self.takes_edits = True

    def declare_edits(self, width: int, kind: tuple[bool, bool, bool], edits: tuple) -> None:
        """A batch-1 forward of `width` inputs of `kind` with these layer edits (a tree state of Hidden Transfer's):
        compiled by finish_warm_up where warm-up did not meet it."""
        self.take_edits()
        self.edits_ahead.append((width, kind, edits))

    def taps_for(self, layers: tuple[int, ...] | None) -> tuple[int, ...] | None:
        """The layers a compiled call taps for a hook that offers to read `layers`' inputs from the step's output
        (core/batch/static.layer_taps: EAGLE-3's), or None: none offered, or a frozen state whose layers never took
        taps (the hook then runs around an eager forward). One set of layers per model."""
        if layers is None or not self.accepts_edits():
            return None
        if self.tap_layers is None:
            self.take_edits()
            self.tap_layers = tuple(layers)
        elif tuple(layers) != self.tap_layers:
            raise ValueError(f"{self.name}: taps at layers {tuple(layers)} where this run taps {self.tap_layers}")
        return self.tap_layers

    def accepts_edits(self) -> bool:
        """Whether a compiled call may bring layer edits: in warm-up, or once its layers take them (after warm-up
        nothing changes: a forward with edits then runs eagerly with the method's own hooks)."""
        return self.takes_edits or not self.frozen

    def widest(self) -> int:
        """The widest forward the run declared (chain or tree, any batch size): the cache's room beyond the longest
        context."""
        trees = [*self.trees, *(t for ts in self.batch_trees.values() for t in ts)]
        return max([*self.chain, *self.tree_chain, *(w for t in trees for w in t)])

    def batch_cache(self, slots: int) -> StaticKV:
        """The static cache of a batch of `slots` samples (one per batch size, allocated at its first forward)."""
        if slots not in self.batch_kv:
            self.batch_kv[slots] = StaticKV(self.kv.capacity, self.windows, batch=slots)
        return self.batch_kv[slots]

    def bucket(self, width: int, kind: tuple[bool, bool, bool], slots: int = 1) -> int | None:
        """The query width a segment of `width` tokens of `kind` (embeds, masked, hidden) runs at: the smallest of
        the kind's buckets >= width; in warm-up a width none holds becomes one (a tree's width); after warm-up,
        None (run eagerly)."""
        if not self.frozen:
            self.met.setdefault(slots, set()).add(kind)
        table = self.buckets if slots == 1 else self.batch_buckets.setdefault(slots, {})
        sizes = table.get(kind)
        if sizes is None:
            if self.frozen:  # a kind of input warm-up never met: nothing compiled for it
                self.eager_steps += 1
                return None
            sizes = table[kind] = (list(self.tree_chain) if kind in self.declared_kinds else []) if kind[1] \
                else list(self.chain)
        fits = [b for b in sizes if b >= width]
        if fits:
            return fits[0]
        if self.frozen:
            self.eager_steps += 1
            return None
        trees = self.trees if slots == 1 else self.batch_trees.get(slots, [])
        grown = {width}.union(*(t for t in trees if width in t)) if kind[1] else {width}
        sizes[:] = sorted(set(sizes) | grown)
        return width

    def make_room(self, need: int, kv: StaticKV | None = None) -> None:
        """Entries the next forward writes up to (exclusive), in `kv` (batch 1's by default); beyond the capacity
        the cache is reallocated at twice the size (new addresses: every shape of that batch size compiles again,
        so capacity is sized up front: run/compiled.capacity_for)."""
        old = kv or self.kv
        if need <= old.capacity:
            return
        new = StaticKV(_round(max(need, 2 * old.capacity)), self.windows, batch=old.batch)
        for layer, (k, v) in enumerate(zip(old.keys, old.values)):
            new.allocate(layer, k, v)
            new.keys[layer][:, :, :old.capacity] = k
            new.values[layer][:, :, :old.capacity] = v
        new.lengths = list(old.lengths)
        if old is self.kv:
            self.kv = new
        else:
            self.batch_kv[old.batch] = new
        if self.frozen:  # every compiled shape again at the new capacity, now: the rest of the run stays compiled
            from ...progress import console

            self.grown.append(new.capacity)
            t0 = time.perf_counter()
            keys = sorted(self.shapes) if new.batch == 1 else [k[1:] for k in sorted(self.batch_shapes)
                                                                if k[0] == new.batch]
            with torch.inference_mode():  # (the static step reads no clock: no counter sees a dummy forward)
                for key in keys:
                    self._dummy(*key, start=new.capacity - key[0], slots=new.batch)
            console.print(f"[yellow]warning[/] --compile: a context longer than the static cache's {old.capacity} "
                          f"entries; grown to {new.capacity}, its {len(keys)} shapes compiled again in "
                          f"{time.perf_counter() - t0:.1f} s inside a timed turn (run.yaml: grown_to)")

    def call(self, inputs, positions, write_at, allowed, embeds: bool, hidden: bool, compiled: bool,
             kv: StaticKV | None = None, slot: int | None = None, edits: tuple | None = None) -> torch.Tensor:
        """The static step over `kv` (batch 1's by default), compiled or eager; a compiled shape's first call is
        timed as its compile time. `edits`: layer edits inside a compiled call (compile_graph.py: Hidden Transfer's
        transfer steps); an eager call applies its own (the caller's hooks on the model)."""
        kv = kv or self.kv
        taps = self.tap_layers if hidden == TAPS else None  # (the graph model's layers read them)
        if not compiled:
            if taps:
                return step(self.graph, kv, inputs, positions, write_at, allowed, embeds, hidden, slot, taps=taps)
            return step(self.model, kv, inputs, positions, write_at, allowed, embeds, hidden, slot)
        slots = inputs.shape[0]
        key = (inputs.shape[1], embeds, allowed is not None, hidden)
        table, key = (self.shapes, key) if slots == 1 else (self.batch_shapes, (slots, *key))
        if edits:  # a graph of its own per layer and row count of every edit (the edits' own table)
            self.take_edits()
            edits = compile_graph.padded(edits)
            if not self.frozen:
                self.edited.add((slots, *key[-4:]))
            table, key = self.edit_shapes, (*key, compile_graph.edit_key(edits))
        first = key not in table
        if first:
            if not self.shapes and not self.batch_shapes:  # the first compile of this model: the wait to expect
                _say_start(self.name, self.device)
            _sync(self.device)
            t0, hits = time.perf_counter(), compile_wait.cache_hits()
        if self.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()  # the previous replay's outputs were consumed (cloned)
        if self.frozen:  # nothing compiles after warm-up: a shape that would recompile runs eagerly, counted
            try:
                if edits and first:  # a kind of edit warm-up never met: nothing compiled for it
                    raise torch._dynamo.exc.RecompileError("edits")
                with self._no_recompile:
                    out = self.fn(self.graph, kv, inputs, positions, write_at, allowed, embeds, hidden, edits=edits,
                                  taps=taps)
            except torch._dynamo.exc.RecompileError:
                self.eager_steps += 1
                if edits or taps:  # the graph model's own layers apply them (the model's have no hook now)
                    return step(self.graph, kv, inputs, positions, write_at, allowed, embeds, hidden, edits=edits,
                                taps=taps)
                return step(self.model, kv, inputs, positions, write_at, allowed, embeds, hidden)
            self.compiled_steps += 1
        else:
            with warnings.catch_warnings():  # torch's compiler stack warns of its own deprecated internals
                if first:
                    warnings.simplefilter("ignore", DeprecationWarning)
                    warnings.simplefilter("ignore", FutureWarning)
                out = self.fn(self.graph, kv, inputs, positions, write_at, allowed, embeds, hidden, edits=edits,
                              taps=taps)
        if first:
            _sync(self.device)
            table[key] = time.perf_counter() - t0
            self.read_back[key] = compile_wait.cache_hits() > hits  # inductor's cache served it: not built here
            self.done += 1
            said = (slots, *key[-5:-1]) if edits else key if slots > 1 else (1, *key)
            compile_wait.said(self.name, said, table[key], self.done, self.expected, self.read_back[key],
                              key[-1] if edits else ())
        return out

    @torch.inference_mode()  # as every decode runs: a graph compiled outside it would compile again inside
    def finish_warm_up(self) -> None:
        """Compile every shape `ahead()` lists (a dummy forward each, into the cache's stale rows: the next sample's
        prefill starts it afresh), saying how many first (the count before warm-up was a guess: it cannot know the
        kinds of input the methods meet), then freeze."""
        todo = self.ahead()
        if todo:
            self.expected = self.done + len(todo)  # the progress lines' total, exact from here on
            compile_wait.say_ahead(self.name, len(todo), self.done, self.device, self.model)
        for width, embeds, masked, hidden, slots, edits in todo:
            self._dummy(width, embeds, masked, hidden, start=0, slots=slots, edits=edits)
        self.kv.length = 0
        for slots, kv in self.batch_kv.items():
            kv.lengths = [0] * slots
        self.frozen = True
        if hasattr(self.fn, "_torchdynamo_orig_callable"):  # torch.compile's own function: real compile seconds
            compile_wait.remember(self.device, [(seconds, self.read_back.get(key, False)) for key, seconds in
                                                [*self.shapes.items(), *self.batch_shapes.items(),
                                                 *self.edit_shapes.items()]], self.model)

    def ahead(self) -> list[tuple]:
        """What finish_warm_up compiles, (width, embeds, masked, hidden, slots, edits) each: every bucket of every kind
        of input the warm-up met that has no graph yet, at batch 1 and at every batch size warm-up ran (the kinds that
        batch size met only), and the declared layer edits warm-up did not meet. Nothing where nothing ran."""
        todo = []
        if self.kv.keys:  # plain tokens to logits (every chain's verify, sd's drafts): the declared chain
            self.buckets.setdefault((False, False, False), list(self.chain))
            for (embeds, masked, hidden), sizes in sorted(self.buckets.items()):
                todo += [(width, embeds, masked, hidden, 1, None) for width in sizes  # (a shape warm-up met only
                         if (width, embeds, masked, hidden) not in self.shapes  # with layer edits has no plain one)
                         and (1, width, embeds, masked, hidden) not in self.edited]
            todo += [(width, *kind, 1, edits) for width, kind, edits in self.edits_ahead
                     if (width, *kind, compile_graph.edit_key(edits)) not in self.edit_shapes]
        for slots, kv in sorted(self.batch_kv.items()):
            if not kv.keys:
                continue
            table = self.batch_buckets.setdefault(slots, {})
            for kind in sorted(self.met.get(slots, set()) | self.declared_kinds):
                sizes = table.setdefault(kind, list(self.tree_chain) if kind in self.declared_kinds
                                         else [] if kind[1] else list(self.chain))
                todo += [(width, *kind, slots, None) for width in sizes
                         if (slots, width, *kind) not in self.batch_shapes and (slots, width, *kind) not in self.edited]
        return todo

    def _dummy(self, width: int, embeds: bool, masked: bool, hidden: bool, start: int, slots: int = 1,
               edits: tuple | None = None) -> None:
        """One forward of a shape on zeros, written to cache rows start..start+width-1 of every slot (stale rows:
        the next prefill starts afresh, or beyond the live lengths after a growth)."""
        kv = self.kv if slots == 1 else self.batch_kv[slots]
        embedding = self.model.get_input_embeddings().weight
        wide = getattr(self.model, "input_width", None) or embedding.shape[1]  # a drafter's inputs may be wider
        inputs = (torch.zeros(slots, width, wide, dtype=embedding.dtype, device=self.device) if embeds
                  else torch.zeros(slots, width, dtype=torch.long, device=self.device))
        at = torch.arange(start, start + width, device=self.device).repeat(slots, 1)  # [S, w], contiguous as a call's
        allowed = (torch.arange(kv.capacity, device=self.device)[None, None, :] <= at[:, :, None]) if masked else None
        frozen, self.frozen = self.frozen, False
        try:
            # positions and write_at as two tensors, as every real call passes them (one object passed twice would
            # compile a graph for aliased inputs, which a real call's guards then miss)
            self.call(inputs, at.clone(), at, allowed, embeds, hidden, compiled=True, kv=kv, edits=edits)
        finally:
            self.frozen = frozen

    def report(self) -> dict:
        """run.yaml's `compile:` block (compile_report.py)."""
        return compile_report.block(self)


def enable(model, capacity: int) -> Compiled:
    """Attach a Compiled state to `model` (its batch-1 engine becomes the static one); returns it."""
    # one graph per bucket and kind of input: more than dynamo's default of 8 recompilations a function
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
    torch._dynamo.config.accumulated_cache_size_limit = max(torch._dynamo.config.accumulated_cache_size_limit, 1024)
    state = attach(model, Compiled(model, capacity))
    chosen = linear_kernels.use(model, state.device)  # each bucket's CPU linear kernel, measured (linear_kernels.py)
    if chosen:
        state.settings["linear"] = chosen
        state.linear_choice = chosen["choice"]
    # its twin, run by every compiled call (compile_graph.py), made after the attention switch above
    state._graph = compile_graph.graph_model(model, state.linear_choice)
    return state


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


def _round(n: int) -> int:
    return max(ROUND, -(-n // ROUND) * ROUND)
