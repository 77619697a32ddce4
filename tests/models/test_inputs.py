"""models.inputs: random feeds follow the model's declared shapes."""
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from models.inputs import random_inputs


def test_a_dim_declared_minus_one_is_dynamic():
    g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "m", [h.make_tensor_value_info("x", T.FLOAT, [-1, 4])],
                     [h.make_tensor_value_info("y", T.FLOAT, [-1, 4])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    with pytest.raises(ValueError, match="is symbolic; pass its shape"):
        random_inputs(m)
    assert random_inputs(m, {"x": (3, 4)})["x"].shape == (3, 4)
