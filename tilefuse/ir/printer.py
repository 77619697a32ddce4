"""The one textual form of a graph, for debugging, tests and `tilefuse inspect`."""
from __future__ import annotations

from tilefuse.ir.control import Branch
from tilefuse.ir.graph import Graph, Value


def _ref(v: Value) -> str:
    if v.is_constant and v.type.size == 1:
        return f"{v.data.reshape(()).item()!r}:{v.type.dtype}"  # type: ignore[union-attr]
    return f"%{v.name}"


def format_graph(graph: Graph, *, max_nodes: int | None = None) -> str:
    lines = [f"graph {graph.name}("]
    lines += [f"    %{v.name}: {v.type}," for v in graph.inputs]
    lines.append(") {")
    nodes = graph.nodes if max_nodes is None else graph.nodes[:max_nodes]
    for node in nodes:
        outs = ", ".join(f"%{v.name}: {v.type}" for v in node.outputs)
        ins = ", ".join(_ref(v) for v in node.inputs)
        lines.append(f"  {outs} = {node.op}({ins})")
        if isinstance(node.op, Branch):  # both branch graphs, indented under the node
            for g in (node.op.then_graph, node.op.else_graph):
                lines += ["    " + line for line in format_graph(g).splitlines()]
    if max_nodes is not None and len(graph.nodes) > max_nodes:
        lines.append(f"  ... {len(graph.nodes) - max_nodes} more nodes")
    rets = ", ".join(f"{name}={_ref(v)}" for name, v in graph.outputs.items())
    lines.append(f"  return {rets}")
    lines.append("}")
    return "\n".join(lines)
