"""The ranges random integer inputs are drawn from: what the model says, else a default."""
import numpy as np
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from tilefuse.frontend.input_ranges import DEFAULT_INT_RANGE, MASK_RANGE, integer_ranges
from tilefuse.frontend.shapes import bind_input_types


def _model(nodes, inputs, outputs, inits=()):
    g = h.make_graph(nodes, "m", inputs, outputs, initializer=list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _table(name, *shape):
    return numpy_helper.from_array(np.random.default_rng().standard_normal(shape).astype(np.float32), name)


def _ranges(m):
    return integer_ranges(m, bind_input_types(m, None))


def test_gather_indices_span_the_rows_of_the_table():
    m = _model(
        [
            h.make_node("Cast", ["ids32"], ["ids"], to=T.INT64),
            h.make_node("Unsqueeze", ["ids", "ax"], ["ids2"]),
            h.make_node("Gather", ["vocab", "ids2"], ["e"]),  # a vocabulary of 50
            h.make_node("Gather", ["cols", "pos"], ["c"], axis=1),  # [3, 7]: axis 1 has 7
            h.make_node("Gather", ["small", "pos"], ["s"], axis=-1),  # [9]: the smaller bound wins
            h.make_node("Transpose", ["cols"], ["colsT"]),  # [7, 3]: its shape only onnx's inference knows
            h.make_node("Gather", ["colsT", "t"], ["d"]),
            h.make_node("GatherND", ["grid", "nd"], ["g"]),  # [5, 6, 2] indexed by pairs: min(5, 6)
            h.make_node("Add", ["n", "n"], ["n2"]),
            h.make_node("Mul", ["attention_mask", "attention_mask"], ["mm"]),
        ],
        [
            h.make_tensor_value_info("ids32", T.INT32, [2, 3]),
            h.make_tensor_value_info("pos", T.INT64, [4]),
            h.make_tensor_value_info("t", T.INT64, [2]),
            h.make_tensor_value_info("nd", T.INT64, [4, 2]),
            h.make_tensor_value_info("n", T.INT64, [4]),
            h.make_tensor_value_info("attention_mask", T.INT64, [2, 3]),
            h.make_tensor_value_info("x", T.FLOAT, [2]),
        ],
        [h.make_tensor_value_info(o, T.FLOAT, None) for o in ("e", "c", "s", "d", "g")]
        + [h.make_tensor_value_info("n2", T.INT64, [4]), h.make_tensor_value_info("mm", T.INT64, [2, 3])],
        inits=[_table("vocab", 50, 4), _table("cols", 3, 7), _table("small", 9), _table("grid", 5, 6, 2),
               numpy_helper.from_array(np.array([0], np.int64), "ax")],
    )
    assert _ranges(m) == {
        "ids32": (0, 50), "pos": (0, 7), "t": (0, 7), "nd": (0, 5), "n": DEFAULT_INT_RANGE, "attention_mask": MASK_RANGE,
    }


def test_the_models_own_record_wins():
    m = _model(
        [h.make_node("Gather", ["vocab", "ids"], ["e"])],
        [h.make_tensor_value_info("ids", T.INT64, [2])],
        [h.make_tensor_value_info("e", T.FLOAT, [2, 4])],
        inits=[_table("vocab", 50, 4)],
    )
    h.set_model_props(m, {"tilefuse.input_ranges": '{"ids": [3, 10]}'})
    assert _ranges(m) == {"ids": (3, 10)}
    h.set_model_props(m, {"tilefuse.input_ranges": "not json"})  # a broken record is no record
    assert _ranges(m) == {"ids": (0, 50)}
