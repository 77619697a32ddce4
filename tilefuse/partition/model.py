"""What the partitioner hands on: ordered fusion groups, and why neighbours stayed apart."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tilefuse.ir.graph import Graph, Node, Value
from tilefuse.partition.cost import Cost
from tilefuse.partition.kinds import FusionKind
from tilefuse.target import Target

if TYPE_CHECKING:
    from tilefuse.patterns import Match
    from tilefuse.patterns import Refusal as NoPattern


@dataclass(slots=True, eq=False)
class FusedGroup:
    """A convex set of primitives that one kernel computes.

    ``nodes`` are in graph order; ``inputs`` are the values read from outside (graph
    inputs, constants, other groups' outputs); ``outputs`` the values other groups or
    the graph's outputs read. ``match``: which kernel the group becomes (a pattern's
    match, ``tilefuse/patterns/``), set once the partition is final; for an opaque group,
    the refusal that makes it a host step.
    """

    id: int
    nodes: tuple[Node, ...]
    kind: FusionKind
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    cost: Cost
    match: "Match | NoPattern | None" = None

    @property
    def anchor(self) -> Node | None:
        """The first member of the group's kind when that kind anchors (contraction, reduce)."""
        if self.kind < FusionKind.REDUCE:
            return None
        return next(n for n in self.nodes if _kind_of(n) is self.kind)

    @property
    def onnx_nodes(self) -> list[str]:
        return list(dict.fromkeys(n.origin for n in self.nodes if n.origin))

    @property
    def name(self) -> str:
        """A deterministic kernel name: the group id and the kinds of ops it holds."""
        ops = list(dict.fromkeys(n.op.name.lower() for n in self.nodes if _kind_of(n) >= FusionKind.REDUCE))
        ops = ops or list(dict.fromkeys(n.op.name.lower() for n in self.nodes))[:3]
        return f"k{self.id}_" + "_".join(ops[:4])


def _kind_of(node: Node) -> FusionKind:
    from tilefuse.partition.kinds import fusion_kind

    return fusion_kind(node)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Two neighbouring groups that stayed apart, and why."""

    group_a: int
    group_b: int
    node_a: str
    node_b: str
    reason: str


@dataclass(slots=True, eq=False)
class Partition:
    graph: Graph
    target: Target
    groups: list[FusedGroup]
    refusals: list[Refusal] = field(default_factory=list)
    # Nodes that repeat another node's computation in a second kernel (copies of a
    # widening cast moved into the kernels that read it): not counted as graph work twice.
    recomputed: list[Node] = field(default_factory=list)

    def group_of(self) -> dict[int, FusedGroup]:
        """id(node) -> its group."""
        return {id(n): g for g in self.groups for n in g.nodes}
