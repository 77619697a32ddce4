"""A kernel's params: the group's inputs (less scalar constants, which become literals in
the code), then its outputs — and the values bound to each, for the plan's linker; and
the group's index check sites, which make the kernel take a status word after them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tilefuse.ir.graph import Value
from tilefuse.partition.model import FusedGroup
from tilefuse.tile_ir.ir import Buffer, Scope
from tilefuse.tile_ir.lower.checks import IndexSites

# (input position, value) -> a replacement (bound value, param buffer), e.g. a repacked
# weight; None keeps the value as it is; DROP leaves it out (another param holds it: the
# sibling weights packed into one).
DROP = "drop"
Substitute = Callable[[int, Value], "tuple[Value, Buffer] | str | None"]


@dataclass
class KernelParams:
    params: list[Buffer]
    buffers: dict[int, Buffer]  # id(value) -> its param buffer (inputs kept as they are)
    bindings: list[Value]  # one per param, in order
    num_inputs: int
    sites: IndexSites  # the indices read at run time, each checked where it is used

    @property
    def outputs(self) -> list[Buffer]:
        return self.params[self.num_inputs :]


def kernel_params(group: FusedGroup, substitute: Substitute | None = None) -> KernelParams:
    params: list[Buffer] = []
    buffers: dict[int, Buffer] = {}
    bindings: list[Value] = []
    for k, v in enumerate(group.inputs):
        if v.is_constant and v.type.size == 1:
            continue
        replaced = substitute(k, v) if substitute is not None else None
        if isinstance(replaced, str):  # DROP
            continue
        if replaced is not None:
            value, buf = replaced
        else:
            value, buf = v, Buffer(f"in{k}", v.type.dtype, v.type.shape, Scope.GLOBAL)
            buffers[id(v)] = buf
        params.append(buf)
        bindings.append(value)
    num_inputs = len(params)
    params += [Buffer(f"out{k}", v.type.dtype, v.type.shape, Scope.GLOBAL) for k, v in enumerate(group.outputs)]
    bindings += list(group.outputs)
    return KernelParams(params, buffers, bindings, num_inputs, IndexSites(group))
