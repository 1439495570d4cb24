"""One oneDNN call for the linear layers of a module that read the same input, inside a compiled CPU forward: a
decoder layer's q / k / v projections, its MLP's gate / up projections (`--compile`, core/model/compile_graph.py).

Why: a compiled float32 forward of the embedded model spends ~2 ms of its ~18 in the fixed cost of 150 small
oneDNN calls (k and v run at 3-4x their bytes) and ~1.8 ms in the Python hop into the packed-linear op, 211 calls a
forward. One q/k/v call and one gate/up call per layer instead of five measured 7.99 / 8.34 / 9.99 ms against
10.22 / 10.25 / 12.16 ms over 30 layers at 1 / 8 / 16 rows (benchmarks/RESULTS-cpu.md, stop 57).

How: a group's weights are concatenated ([sum of out, in]) and packed once for oneDNN (a copy of its own, beside the
layers' own packed copies, which the eager forwards keep using). In the compiled graph's twin each member is a
GroupedLinear: at a width whose bucket chose oneDNN it calls `specbench::packed_group(x, index, out)` and takes its
own columns of the output (its own bias added after). The members' calls are the same op on the same input; a graph
pass (`MergeSameCalls`, inductor's post-grad custom pass) keeps one of them (the op: native_linear's C++ one where it
is built, the same on the group's packed copy). Where a bucket runs the panels (panel_linear.py), the group's weight
is packed in panels too: one `specbench_native::panels` call for the group, merged the same way. A member called on
another input (a cross-attention's k / v) keeps a call of its own: still its own exact rows, only not shared. The
model's own modules are not touched; the packed copies live in linear_kernels' table (the panels' in panel_linear's),
weak-keyed by the group's first layer.
"""

from __future__ import annotations

import os
import weakref

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

from . import linear_kernels as lk, native_linear, panel_linear
from .cpu_kernels import room_for_copies

ENV = "SPECBENCH_COMPILE_FUSE"  # 0: every linear its own call (the A / B of benchmarks/RESULTS-cpu.md)
GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # children that read one input, in call order

# a group's first layer -> its fused copy's index into lk._PACKED (a table of its own, as linear_kernels keeps one)
_GROUP_INDEX: "weakref.WeakKeyDictionary[torch.nn.Linear, int]" = weakref.WeakKeyDictionary()


@torch.library.custom_op("specbench::packed_group", mutates_args=())
def packed_group(x: torch.Tensor, index: int, out_features: int) -> torch.Tensor:
    """x [..., K] @ (the group's concatenated weight)^T through oneDNN on lk._PACKED[index] -> [..., out_features]."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), lk._PACKED[index], None, "none", [], "")


@packed_group.register_fake
def _(x, index, out_features):
    return x.new_empty(*x.shape[:-1], out_features)


class MergeSameCalls(CustomGraphPass):
    """Keep one call of a packed op (`packed_group`, or native_linear's) per set of arguments (input, packed copy):
    the later identical calls' uses read the first one's output (the ops are pure: same arguments, same result)."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        first: dict[tuple, torch.fx.Node] = {}
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target not in _merged():
                continue
            key = (node.args, tuple(sorted(node.kwargs.items())))
            if key in first:
                node.replace_all_uses_with(first[key])
                graph.erase_node(node)
            else:
                first[key] = node

    def uuid(self):
        return get_hash_for_files((__file__,))


def _merged() -> tuple:
    """The ops whose identical calls are merged: the Python group op, and the C++ ones where they are loaded."""
    ops = (torch.ops.specbench.packed_group.default,)
    native = (torch.ops.specbench_native.linear.default, torch.ops.specbench_native.panels.default)
    return ops + (native if lk.native_ready() else ())


def groups(module: torch.nn.Module) -> list[tuple[str, ...]]:
    """The GROUPS among `module`'s children: every member a plain CPU nn.Linear, all of one input width and dtype."""
    found = []
    for names in GROUPS:
        members = [module._modules.get(n) for n in names]
        if all(type(m) is torch.nn.Linear and m.weight.device.type == "cpu" for m in members) \
                and len({(m.in_features, m.weight.dtype) for m in members}) == 1:
            found.append(names)
    return found


def worth_fusing(model: torch.nn.Module, choice: dict[int, str] | None) -> bool:
    """Fuse where some bucket runs oneDNN or the panels, on a model small enough for one more packed copy of its
    grouped weights (the limit cpu_kernels.prepack keeps for its own copy); not with $SPECBENCH_COMPILE_FUSE=0."""
    packed = bool(choice) and ("onednn" in choice.values() or lk.runs_panels(choice))
    return os.environ.get(ENV, "1").strip() != "0" and packed \
        and room_for_copies(model)


def pack_group(members: list[torch.nn.Linear]) -> int:
    """The index into lk._PACKED of the members' concatenated weight, packed for oneDNN (once per group)."""
    head = members[0]
    if head not in _GROUP_INDEX:
        with torch.no_grad():
            weight = torch.cat([m.weight.detach() for m in members])  # [sum of out, in]
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, lk.PACK_ROWS_HINT)
        _GROUP_INDEX[head] = lk.keep(packed)
        weakref.finalize(head, lk._free, _GROUP_INDEX[head])
    return _GROUP_INDEX[head]


class GroupedLinear(lk.ChosenLinear):
    """One member of a fused group in the compiled graph's twin: columns [start, stop) of the group's one call at a
    oneDNN or panels bucket; elsewhere its own bucket's kernel (lk.ChosenLinear)."""

    def __init__(self, linear: torch.nn.Linear, choice: dict[int, str], index: int, start: int, total: int,
                 group_panels: torch.Tensor | None = None):
        super().__init__(linear, choice, own_panels=False)
        self.group_index, self.start, self.total = index, start, total
        self.panels = group_panels  # the group's weight in panels (one tensor for every member), or None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernel = lk.for_rows(self.choice, x.numel() // x.shape[-1]) if torch.compiler.is_compiling() else None
        if kernel == "onednn" or kernel in lk.PANELS:
            if kernel in lk.PANELS:
                out = panel_linear.linear(x, self.panels, self.total, None, *lk.PANELS[kernel])
            elif lk.native_ready():
                out = native_linear.linear(x, None, self.group_index, self.total)
            else:
                out = packed_group(x, self.group_index, self.total)
            out = out[..., self.start:self.start + self.out_features]
            return out if self.linear.bias is None else out + self.linear.bias
        return super().forward(x)


def twins(module: torch.nn.Module, choice: dict[int, str]) -> dict[str, GroupedLinear]:
    """The GroupedLinear twin of every grouped child of `module` (name -> twin); {} where it has no group."""
    out = {}
    for names in groups(module):
        members = [module._modules[n] for n in names]
        index = pack_group(members) if "onednn" in choice.values() else None
        start, total = 0, sum(m.out_features for m in members)
        panels = panel_linear.group_copy(members) if lk.runs_panels(choice) else None
        for name, m in zip(names, members):
            out[name] = GroupedLinear(m, choice, index, start, total, panels)
            start += m.out_features
    return out


def unpack(model: torch.nn.Module) -> None:
    """Drop the fused copies of `model`'s groups (tests; a model's copies otherwise go with its layers)."""
    for module in model.modules():
        for names in groups(module):
            index = _GROUP_INDEX.pop(module._modules[names[0]], None)
            if index is not None:
                lk._free(index)
