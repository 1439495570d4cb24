"""`--compile` of a small module's own forward beside the target's step: one function over the module (Medusa's heads
and the LM head on the one kept row), compiled at the static shapes warm-up meets and counted as the static step is.

A CompiledCall is attached to its module (`enable`, a table weak-keyed by module: nothing is set on the module);
the code that runs the module asks `call_of(module)` and calls it in place of the function. In warm-up a shape's
first call compiles it (timed as its compile time, never inside a timed turn); `finish_warm_up` freezes it: from then
on a call at a shape warm-up never met, or one that would recompile, runs the function eagerly and is counted
(`eager_steps`), every other call is a compiled one (`compiled_steps`). run/compiled.py lists these states beside the
target's, so summary.csv's compiled / eager forward counts and run.yaml's `compile:` block include them.
"""

from __future__ import annotations

import time
import warnings
import weakref

import torch

from . import compile_wait
from .compile_graph import compile_function, settings, sync as _sync

# module -> its CompiledCall (kept beside the module, never on it)
_CALLS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _shape_key(args) -> tuple:
    return tuple((tuple(a.shape), str(a.dtype)) if isinstance(a, torch.Tensor) else type(a).__name__ for a in args)


class CompiledCall:
    """One module's function, compiled per static input shape; its counts and compile seconds."""

    def __init__(self, module: torch.nn.Module, function, name: str, device: torch.device):
        self._model = weakref.ref(module)
        self.function = function  # (module, *args) -> tensor: the eager path, and what is compiled
        self.name, self.device = name, torch.device(device)
        self.settings = settings(self.device)
        # its own code object: dynamo keeps compiled graphs per code object, and two modules' graphs must not mix
        label = "".join(c if c.isalnum() else "_" for c in name)
        self.fn = compile_function(self.device, function, f"{function.__name__}_{label}_{id(module):x}",
                                   module_guards=True)
        self.shapes: dict[tuple, float] = {}  # input shapes -> seconds of the first call
        self.read_back: dict[tuple, bool] = {}  # input shapes -> inductor's cache served the first call
        self.frozen = False
        self.compiled_steps = 0  # calls run compiled after warm-up
        self.eager_steps = 0  # calls run eagerly after warm-up (a shape warm-up never met)
        self.expected, self.done = 1, 0

    @property
    def model(self):
        return self._model()

    def __call__(self, *args) -> torch.Tensor:
        module = self.model
        key = _shape_key(args)
        if self.frozen:
            if key not in self.shapes:
                self.eager_steps += 1
                return self.function(module, *args)
            if self.device.type == "cuda":
                torch.compiler.cudagraph_mark_step_begin()
            try:
                with torch._dynamo.config.patch(error_on_recompile=True):
                    out = self.fn(module, *args)
            except torch._dynamo.exc.RecompileError:
                self.eager_steps += 1
                return self.function(module, *args)
            self.compiled_steps += 1
            return self._own(out)
        first = key not in self.shapes
        if first:
            _sync(self.device)
            t0, hits = time.perf_counter(), compile_wait.cache_hits()
        if self.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()
        with warnings.catch_warnings():  # torch's compiler stack warns of its own deprecated internals
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)
            out = self.fn(module, *args)
        if first:
            _sync(self.device)
            self.shapes[key] = time.perf_counter() - t0
            self.read_back[key] = compile_wait.cache_hits() > hits
            self.done += 1
            from ...progress import console

            console.print(f"[dim]--compile {self.name}: inputs {[k[0] for k in key if isinstance(k, tuple)]} compiled "
                          f"in {self.shapes[key]:.1f} s (not timed)[/]")
        return self._own(out)

    def _own(self, out: torch.Tensor) -> torch.Tensor:
        # a CUDA graph's output buffer is rewritten by its next replay: a copy of its own there
        return out.clone() if self.device.type == "cuda" else out

    def finish_warm_up(self) -> None:
        """Freeze: the shapes warm-up met are compiled; nothing compiles from here on."""
        self.frozen = True
        if self.shapes and hasattr(self.fn, "_torchdynamo_orig_callable"):
            compile_wait.remember(self.device, [(s, self.read_back.get(k, False)) for k, s in self.shapes.items()],
                                  self.model)

    def report(self) -> dict:
        """Its part of run.yaml's `compile:` block."""
        return {**self.settings, "device": str(self.device), "function": self.function.__name__,
                "shapes": [{"inputs": [list(k[0]) for k in key if isinstance(k, tuple)], "seconds": round(s, 3)}
                           for key, s in self.shapes.items()],
                "seconds": round(sum(self.shapes.values()), 3),
                "compiled_steps": self.compiled_steps, "eager_steps": self.eager_steps}


def enable(module: torch.nn.Module, function, name: str, device: torch.device) -> CompiledCall:
    """Attach a CompiledCall of `function` (module, *args) -> tensor to `module`; returns it."""
    call = _CALLS[module] = CompiledCall(module, function, name, device)
    return call


def disable(module: torch.nn.Module) -> None:
    _CALLS.pop(module, None)


def call_of(module: torch.nn.Module) -> CompiledCall | None:
    return _CALLS.get(module)
