"""``tilefuse.compile``'s own arguments: a bad one is a TilefuseError, never a traceback."""
import pytest
from onnx import TensorProto, helper

import tilefuse
from tilefuse.errors import TilefuseError


def _model():
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("target", [None, 5, ["cpu"], "gpu9"], ids=repr)
def test_a_target_that_is_no_target_name(target):
    with pytest.raises(TilefuseError, match="target"):
        tilefuse.compile(_model(), target=target)
