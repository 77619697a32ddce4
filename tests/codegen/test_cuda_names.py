"""A CUDA kernel's name is one kernel: it covers the signature as well as the body, so two
programs whose bodies agree over params of different shapes get different names (CRNN's
LSTM gates slice the first step of a [9, 2, 32] product in one kernel and of a [1, 2, 32]
one in the next: the same body, and the plan refused two kernels of one name)."""
from tilefuse.codegen.cuda import emit_tilelang
from tilefuse.ir import Builder, DType, TensorType
from tilefuse.ir.prims import ScalarFn
from tilefuse.partition import partition_graph
from tilefuse.target import CUDA_SM90A
from tilefuse.tile_ir.lower import lower_group


def _first_row_sigmoid(rows: int):
    b = Builder("gate")
    x = b.input("x", TensorType(DType.FLOAT32, (rows, 2, 32)))
    b.output("y", b.map(ScalarFn.SIGMOID, b.slice(x, 0, 0, 1)))
    (group,) = partition_graph(b.graph, CUDA_SM90A).groups
    return emit_tilelang(lower_group(group, CUDA_SM90A).program, CUDA_SM90A.codegen, CUDA_SM90A.device)


def test_equal_bodies_over_params_of_other_shapes_are_other_kernels():
    nine, one = _first_row_sigmoid(9), _first_row_sigmoid(2)
    body = [line for line in nine.text.splitlines() if "def " not in line and "tilefuse cuda kernel" not in line]
    assert body == [line for line in one.text.splitlines() if "def " not in line and "tilefuse cuda kernel" not in line]
    assert nine.func != one.func
    assert _first_row_sigmoid(9).func == nine.func  # and a name stays deterministic
