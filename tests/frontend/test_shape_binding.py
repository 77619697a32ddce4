"""Binding dynamic dims (issue 17, item 5): a whole input's shape binds the dim symbols it
names for every input that shares them; two sizes for one symbol are an error naming both;
errors raised from Python say how to bind from Python as well as from the CLI."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import tilefuse
from tilefuse.errors import ShapeError
from tilefuse.frontend import import_onnx
from tilefuse.runtime import InferenceSession


def _two_inputs():
    ids = helper.make_tensor_value_info("ids", TensorProto.FLOAT, ["batch", "seq"])
    mask = helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", "seq"])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq"])
    g = helper.make_graph([helper.make_node("Mul", ["ids", "mask"], ["y"])], "g", [ids, mask], [out])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_a_whole_input_binds_its_symbols_for_the_inputs_that_share_them():
    graph = import_onnx(_two_inputs(), {"ids": (2, 16)})
    assert [v.type.shape for v in graph.inputs] == [(2, 16), (2, 16)]
    plan = tilefuse.compile(_two_inputs().SerializeToString(), shapes={"ids": (2, 16)})
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 2, 16)).astype(np.float32)
    (y,) = InferenceSession(plan).run(None, {"ids": a, "mask": b})
    np.testing.assert_allclose(y, a * b, rtol=1e-6)


@pytest.mark.parametrize("shapes, message", [
    ({"ids": (2, 16), "seq": 8}, r"input 'ids' given as \[2, 16\] makes 'seq' 16, but 'seq' is given as 8"),
    ({"ids": (2, 16), "mask": (3, 16)}, r"inputs 'ids' and 'mask' give dim symbol 'batch' two sizes: 2 and 3"),
])
def test_two_sizes_for_one_symbol_are_an_error_naming_both(shapes, message):
    with pytest.raises(ShapeError, match=message):
        import_onnx(_two_inputs(), shapes)


def test_an_unbound_dim_says_how_to_bind_it_from_python_too():
    with pytest.raises(ShapeError, match=r"\(Python: shapes=\{'ids': \(N, N\)\} or shapes=\{'batch': N\}\)"):
        import_onnx(_two_inputs(), {"seq": 4})
