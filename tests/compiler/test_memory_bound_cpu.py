"""A plan that cannot fit in the memory it runs in is refused when it is compiled, naming
what it would need, instead of failing with a MemoryError at its first run."""

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import tilefuse
from tilefuse.errors import ShapeError
from tilefuse.target import CPU, CUDA_SM90A, adjust, memory_limit


def _relu(n):
    g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "m", [h.make_tensor_value_info("x", T.FLOAT, [n])],
                     [h.make_tensor_value_info("y", T.FLOAT, [n])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_dims_of_2_to_the_40_are_refused_at_compile_time():
    with pytest.raises(ShapeError, match=r"the plan needs 8\.0 TiB \(arena 4\.0 TiB, inputs 4\.0 TiB.*"
                                         r"buffer 'x' float32\[1099511627776\] alone takes 4\.0 TiB\), more than the .* of memory this host has"):
        tilefuse.compile(_relu(2**40))


def test_the_bound_is_the_targets_memory():
    small = adjust(CPU, device__memory_bytes=4096)
    plan = tilefuse.compile(_relu(256), small)  # 1 KiB in, 1 KiB arena
    x = np.random.default_rng().standard_normal(256).astype(np.float32)
    np.testing.assert_array_equal(tilefuse.InferenceSession(plan).run(None, {"x": x})[0], np.maximum(x, 0))
    with pytest.raises(ShapeError, match=r"needs 8\.0 KiB .* more than the 4\.0 KiB of memory"):
        tilefuse.compile(_relu(1024), small)
    assert memory_limit(CUDA_SM90A)[0] == CUDA_SM90A.device.memory_bytes
    assert memory_limit(CPU)[0] > 0
