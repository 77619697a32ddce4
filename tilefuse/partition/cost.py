"""The cost model: bytes moved and FLOPs of a kernel, and the time they take on a target."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from tilefuse.ir.dtypes import HALF_FLOATS, DType
from tilefuse.ir.graph import Node, Value
from tilefuse.ir.prims import Gather, GatherElements, GatherND, Kind, Map, ScalarFn
from tilefuse.target import Target

_GATHERS = (Gather, GatherElements, GatherND)


@dataclass(frozen=True, slots=True)
class Cost:
    flops: int = 0
    matrix_flops: int = 0  # the part of ``flops`` done by half-float matrix products
    bytes_in: int = 0
    bytes_out: int = 0
    launches: int = 0
    # seconds of one thread's loads in turn, none hidden behind another's (a kernel that
    # runs on a handful of threads waits for every load): added to the roofline time
    serial_seconds: float = 0.0
    int8_flops: int = 0  # the part of ``flops`` done by uint8 x int8 products (``integer_product``)

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(
            self.flops + other.flops,
            self.matrix_flops + other.matrix_flops,
            self.bytes_in + other.bytes_in,
            self.bytes_out + other.bytes_out,
            self.launches + other.launches,
            self.serial_seconds + other.serial_seconds,
            self.int8_flops + other.int8_flops,
        )

    @property
    def bytes(self) -> int:
        return self.bytes_in + self.bytes_out

    def compute_seconds(self, target: Target) -> float:
        d = target.device
        int8 = self.int8_flops / d.int8_matrix_flops if d.int8_matrix_flops else self.int8_flops / d.vector_flops
        return self.matrix_flops / d.matrix_flops + int8 + (self.flops - self.matrix_flops - self.int8_flops) / d.vector_flops

    def memory_seconds(self, target: Target) -> float:
        return self.bytes / target.device.dram_bandwidth

    def seconds(self, target: Target) -> float:
        """Roofline time: compute and memory overlap; launches and serial loads do not."""
        return (max(self.compute_seconds(target), self.memory_seconds(target))
                + self.launches * target.device.launch_seconds + self.serial_seconds)

    def bound(self, target: Target) -> str:
        return "compute" if self.compute_seconds(target) >= self.memory_seconds(target) else "memory"


def node_flops(node: Node) -> tuple[int, int]:
    """(all FLOPs, the half-float matrix part) of one primitive."""
    flops = node.op.flops([v.type for v in node.inputs], [v.type for v in node.outputs])
    half_matrix = node.op.kind is Kind.CONTRACT and node.inputs[0].type.dtype in HALF_FLOATS
    return flops, flops if half_matrix else 0


def read_bytes(value: Value, readers: Iterable[Node]) -> int:
    """Bytes a kernel reads of ``value``: all of it, except through gathers (an embedding
    lookup reads the rows it gathers, not the table)."""
    readers = list(readers)
    if readers and all(isinstance(n.op, _GATHERS) and n.inputs[0] is value for n in readers):
        return min(value.type.nbytes, sum(n.outputs[0].type.nbytes for n in readers))
    return value.type.nbytes


def kernel_cost(nodes: list[Node], outputs: Iterable[Value]) -> Cost:
    """Cost of running ``nodes`` as one kernel that writes ``outputs``."""
    members = set(map(id, nodes))
    readers: dict[int, list[Node]] = {}
    values: dict[int, Value] = {}
    flops = matrix = int8 = 0
    for node in nodes:
        f, m = node_flops(node)
        flops, matrix = flops + f, matrix + m
        if integer_product(node, members):
            int8 += f
        for v in node.inputs:
            if v.producer is None or id(v.producer) not in members:
                readers.setdefault(id(v), []).append(node)
                values[id(v)] = v
    bytes_in = sum(read_bytes(values[k], rs) for k, rs in readers.items())
    bytes_out = sum(v.type.nbytes for v in outputs)
    return Cost(flops, matrix, bytes_in, bytes_out, 1, int8_flops=int8)


def integer_product(node: Node, members: set[int]) -> bool:
    """An int32 product of a uint8 operand by an int8 one, each widened inside the kernel
    (the kernel reads the 8-bit values: a host's integer product core,
    ``tile_ir/lower/panels.py``)."""
    if node.op.kind is not Kind.CONTRACT or node.outputs[0].type.dtype is not DType.INT32:
        return False
    sources = []
    for x in node.inputs[:2]:
        cast = x.producer
        if cast is None or id(cast) not in members or not (isinstance(cast.op, Map) and cast.op.fn is ScalarFn.CAST):
            return False
        sources.append(cast.inputs[0].type.dtype)
    return sources == [DType.UINT8, DType.INT8]


def unfused_cost(nodes: Iterable[Node]) -> Cost:
    """Every primitive as a kernel of its own (what an unfused runtime moves)."""
    total = Cost()
    for node in nodes:
        total = total + kernel_cost([node], node.outputs)
    return total
