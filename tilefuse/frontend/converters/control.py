"""If: the branch taken inlined when the condition is known at compile time (a constant,
shape arithmetic, or an input bound with ``constants=`` / ``--const``); otherwise both
branches converted into graphs of their own under one ``Branch`` node, which the plan
runs as a branch between two step sequences."""
from __future__ import annotations

import onnx

from tilefuse.frontend.context import NodeContext, NotConstantError, graph_inputs_behind, tensor_to_array
from tilefuse.frontend.registry import converter
from tilefuse.frontend.scope import Scope, convert_nodes
from tilefuse.ir.builder import Builder
from tilefuse.ir.control import Branch
from tilefuse.ir.dtypes import DType
from tilefuse.ir.graph import Graph, Value
from tilefuse.ir.verify import verify_graph

BRANCHES = ("then_branch", "else_branch")


@converter("If", note="specialised when the condition is known at compile time, else a run-time branch")
def if_(ctx: NodeContext) -> list[Value]:
    cond = ctx.input(0)
    if cond.type.dtype is not DType.BOOL or cond.type.size != 1:
        raise ctx.error(f"the condition must be one bool, got {cond.type}")
    graphs = {attr: ctx.attr(attr) for attr in BRANCHES}
    for attr, g in graphs.items():
        if not isinstance(g, onnx.GraphProto):
            raise ctx.error(f"attribute {attr} is missing")
        if len(g.input):
            raise ctx.error(f"{attr} declares inputs {[i.name for i in g.input]}; an If branch takes none")
        if len(g.output) != len(ctx.node.output):
            raise ctx.error(f"{attr} has {len(g.output)} outputs, the node {len(ctx.node.output)}")
    if cond.data is not None:
        taken = BRANCHES[0] if bool(cond.data.reshape(-1)[0]) else BRANCHES[1]
        return _inline(ctx, graphs[taken], taken)
    return _branch(ctx, cond, graphs)


def _inline(ctx: NodeContext, g: onnx.GraphProto, attr: str) -> list[Value]:
    """The branch's nodes converted into the enclosing graph, reading its values directly."""
    scope = Scope(ctx.b, ctx.scope)
    _convert(ctx, ctx.b, scope, g, attr)
    ctx.b.origin = ctx.label
    return [scope[o.name] for o in g.output]


def _branch(ctx: NodeContext, cond: Value, graphs: dict[str, onnx.GraphProto]) -> list[Value]:
    """Both branches as graphs of their own, taking the union of the outer values they
    read (in the order first read), under one Branch node."""
    built: list[tuple[Builder, Scope]] = []
    for attr, g in graphs.items():
        sub = Builder(f"{ctx.label}/{attr}")
        sub.graph.opset = ctx.b.graph.opset
        scope = Scope(sub, ctx.scope, capture=True)
        _convert(ctx, sub, scope, g, attr)
        for k, o in enumerate(g.output):
            sub.output(o.name if o.name not in sub.graph.outputs else f"{o.name}#{k}", scope[o.name])
        built.append((sub, scope))
    ctx.b.origin = ctx.label
    outer = list({id(v): v for _, scope in built for v, _ in scope.captured}.values())
    for sub, scope in built:
        local = {id(v): x for v, x in scope.captured}
        sub.graph.inputs = [local.get(id(v)) or Value(sub.unique(v.name), v.type) for v in outer]
    then_graph, else_graph = (_finish(sub.graph) for sub, _ in built)
    then_types = [v.type for v in then_graph.outputs.values()]
    else_types = [v.type for v in else_graph.outputs.values()]
    if then_types != else_types:
        deps = graph_inputs_behind(cond)
        raise NotConstantError(
            f"If node {ctx.label!r}: its branches give different output types (then_branch "
            f"{[str(t) for t in then_types]}, else_branch {[str(t) for t in else_types]}), which a branch "
            f"taken at run time cannot give; its condition depends on graph input(s) {deps}: bind them "
            f"(--const NAME=VALUE, constants=...) to specialise it", deps, ctx.label)
    return list(ctx.b.emit(Branch(then_graph, else_graph), [cond, *outer]))


def _convert(ctx: NodeContext, b: Builder, scope: Scope, g: onnx.GraphProto, attr: str) -> None:
    for init in g.initializer:
        scope[init.name] = b.const(tensor_to_array(init), name=init.name)
    convert_nodes(b, scope, g.node, ctx.opsets, prefix=f"{ctx.label}/{attr}/")


def _finish(graph: Graph) -> Graph:
    graph.remove_dead_nodes()
    verify_graph(graph)
    return graph
