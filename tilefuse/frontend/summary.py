"""What `tilefuse inspect` reports about a model, as data (the CLI only prints it)."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx

from tilefuse.errors import ShapeError, TilefuseError, UnsupportedOp
from tilefuse.frontend.context import ONNX_DTYPES
from tilefuse.frontend.coverage import _walk, find_unsupported, opsets_of
from tilefuse.frontend.importer import ModelLike, import_onnx
from tilefuse.frontend.loader import check_model, load_model, upgrade_opset
from tilefuse.frontend.shapes import ShapeSpec, bind_input_types, fixed_size, runtime_inputs
from tilefuse.ir.graph import Graph


@dataclass
class ModelSummary:
    name: str
    ir_version: int
    opsets: dict[str, int]
    producer: str
    inputs: list[dict[str, object]]
    outputs: list[dict[str, object]]
    op_histogram: dict[str, int]
    onnx_nodes: int
    parameters: int
    parameter_bytes: int
    unsupported: list[UnsupportedOp] = field(default_factory=list)
    # Filled when the model imports (supported and every dim bound):
    flops: int | None = None
    primitives: dict[str, int] | None = None
    primitive_kinds: dict[str, int] | None = None
    not_imported: str = ""  # why flops/primitives are missing
    # a model tilefuse's export-ort wrote: its kernel nodes, counted by how they run
    tilefuse_export: dict[str, int] = field(default_factory=dict)
    # The error that stopped the import, when something is wrong with the model or the
    # shapes given (a dynamic model inspected without shapes has none: it is not wrong)
    error: TilefuseError | None = None

    def to_json(self) -> dict[str, object]:
        d = dict(vars(self))
        del d["error"]
        d["unsupported"] = [
            {"domain": u.domain or "ai.onnx", "op_type": u.op_type, "opset": u.opset, "nodes": list(u.nodes), "reason": u.reason}
            for u in self.unsupported
        ]
        return d


def _value_info(vi: onnx.ValueInfoProto) -> dict[str, object]:
    tt = vi.type.tensor_type
    dtype = ONNX_DTYPES.get(tt.elem_type)
    dims: list[object] = [fixed_size(d) if fixed_size(d) is not None else (d.dim_param or "?") for d in tt.shape.dim]
    return {"name": vi.name, "dtype": str(dtype) if dtype else onnx.TensorProto.DataType.Name(tt.elem_type), "shape": dims}


def graph_flops(graph: Graph) -> int:
    return sum(n.op.flops([v.type for v in n.inputs], [v.type for v in n.outputs]) for n in graph.nodes)


def summarize(model: ModelLike, shapes: ShapeSpec | None = None) -> ModelSummary:
    proto = load_model(model)
    check_model(proto)
    histogram = Counter(
        (f"{n.domain}::" if n.domain not in ("", "ai.onnx") else "") + n.op_type for n, _ in _walk(proto.graph)
    )
    params = sum(int(np.prod(t.dims)) for t in proto.graph.initializer)
    param_bytes = sum(
        int(np.prod(t.dims)) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize for t in proto.graph.initializer
    )
    summary = ModelSummary(
        name=proto.graph.name,
        ir_version=proto.ir_version,
        opsets={(k or "ai.onnx"): v for k, v in opsets_of(proto).items()},
        producer=f"{proto.producer_name} {proto.producer_version}".strip(),
        inputs=[_value_info(vi) for vi in runtime_inputs(proto)],
        outputs=[_value_info(vi) for vi in proto.graph.output],
        op_histogram=dict(histogram.most_common()),
        onnx_nodes=sum(histogram.values()),
        parameters=params,
        parameter_bytes=param_bytes,
    )
    summary.unsupported = find_unsupported(proto, any_opset=True)
    if not summary.unsupported:
        summary.unsupported = find_unsupported(upgrade_opset(proto))
    if summary.unsupported:
        summary.not_imported = "unsupported ops"
        return summary
    try:
        bind_input_types(proto, shapes)
    except ShapeError as e:
        if not shapes:  # FLOPs need every dim bound; none were given, and nothing is wrong
            summary.not_imported = str(e)
            return summary
    except TilefuseError:
        pass  # import_onnx raises it again below
    try:
        graph = import_onnx(proto, shapes)
    except TilefuseError as e:
        summary.not_imported = f"{type(e).__name__}: {e}"
        summary.error = e
        return summary
    summary.flops = graph_flops(graph)
    summary.primitives = dict(Counter(n.op.name for n in graph.nodes).most_common())
    summary.primitive_kinds = dict(Counter(n.op.kind.value for n in graph.nodes).most_common())
    return summary
