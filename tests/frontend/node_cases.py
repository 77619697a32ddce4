"""One-node ONNX test cases shared by the converter tables: the case record, its graph
inputs and feeds, onnxruntime's outputs, and the comparison with stated tolerances."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper as h
from onnx import numpy_helper


@dataclass
class Case:
    """One node: ``inputs`` in order (None = omitted); positions in ``consts`` are initializers."""

    id: str
    op: str
    inputs: list[np.ndarray | None]
    attrs: dict = field(default_factory=dict)
    consts: tuple[int, ...] = ()
    outputs: int | tuple[bool, ...] = 1  # a count, or which outputs to ask for
    opset: int = 17


def C(id: str, op: str, inputs: list, consts: tuple[int, ...] = (), outputs: int = 1, opset: int = 17, **attrs) -> Case:
    return Case(id, op, inputs, attrs, consts, outputs, opset)


def case_inputs(case: Case) -> tuple[list[str], list[onnx.ValueInfoProto], list[onnx.TensorProto], dict[str, np.ndarray]]:
    """The node's input names ('' for omitted), graph inputs, initializers and feeds."""
    names, graph_inputs, inits, feeds = [], [], [], {}
    for i, array in enumerate(case.inputs):
        if array is None:
            names.append("")
            continue
        name = f"in{i}"
        names.append(name)
        if i in case.consts:
            inits.append(numpy_helper.from_array(array, name))
        else:
            elem = h.np_dtype_to_tensor_dtype(array.dtype)
            graph_inputs.append(h.make_tensor_value_info(name, elem, array.shape))
            feeds[name] = array
    return names, graph_inputs, inits, feeds


def one_node_model(case: Case, node: onnx.NodeProto, graph_inputs, inits, outs: list[str]) -> onnx.ModelProto:
    """The node as a model with untyped outputs (callers fill their types in)."""
    g = h.make_graph([node], "case", graph_inputs, [h.make_empty_tensor_value_info(o) for o in outs], initializer=inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", case.opset)])
    m.ir_version = 10
    return m


def onnxruntime_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def assert_matches(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    """Same dtype and shape; floats within 1e-5 (float16: 1e-2) relative to the output's scale."""
    for name, w in want.items():
        g = got[name]
        assert g.dtype == w.dtype and g.shape == w.shape, (name, g.dtype, g.shape, w.dtype, w.shape)
        if w.dtype.kind == "f":
            tol = 1e-2 if w.dtype == np.float16 else 1e-5
            scale = max(1.0, float(np.abs(w.astype(np.float64)).max(initial=0)))
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol * scale)
        else:
            np.testing.assert_array_equal(g, w)
