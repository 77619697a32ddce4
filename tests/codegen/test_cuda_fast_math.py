"""The CUDA emitter's cheaper forms (codegen/cuda/fast_math.py): ``1 + erf(u)`` through
Abramowitz-Stegun's erfc. The expression tree the emitter renders is evaluated here in
float32 numpy, the hardware approximations stood in by their exact values (rcp.approx and
ex2.approx are within 2 ulp), against erf in float64."""
import numpy as np
import pytest
import scipy.special

from tilefuse.codegen.cuda.fast_math import Intrinsic, erf_plus_one, fast_forms
from tilefuse.ir.dtypes import DType
from tilefuse.ir.prims import ScalarFn
from tilefuse.tile_ir.ir import Buffer, Call, Const, Load, Scope, Var

F32, F16 = DType.FLOAT32, DType.FLOAT16
U = Buffer("u", F32, (4096,), Scope.GLOBAL)
I = Var("i")


def _eval(e, u):
    """float32 numpy value of a tile expression over the buffer ``u``."""
    if isinstance(e, Const):
        return np.float32(e.value)
    if isinstance(e, Load):
        return u
    if isinstance(e, Intrinsic):
        a = [_eval(x, u) for x in e.args]
        with np.errstate(over="ignore", divide="ignore"):
            return {"__fdividef": lambda x, y: x / y, "__exp": np.exp, "copysign": np.copysign}[e.name](*a).astype(np.float32)
    a = [_eval(x, u) for x in e.args]
    if e.fn is ScalarFn.CAST:
        return a[0].astype(e.dtype.numpy)
    return np.asarray(e.fn.value.impl(*a)).astype(e.dtype.numpy)


def test_erf_plus_one_is_within_fp32_erf_accuracy():
    u = np.concatenate([np.linspace(-6, 6, 20001), [0.0, -0.0, 1e-8, -1e-8, 30.0, -30.0]]).astype(np.float32)
    got = _eval(erf_plus_one(Load(U, (I,))), u).astype(np.float64)
    want = 1.0 + scipy.special.erf(u.astype(np.float64))
    # A-S 7.1.26's 1.5e-7 plus float32 rounding: <= 2.5 ulp of the sum near 2 (erff + 1 in
    # float32: ~1 ulp)
    assert np.abs(got - want).max() < 6e-7
    assert got[-2] == 2.0 and got[-1] == 0.0
    assert np.isnan(_eval(erf_plus_one(Load(U, (I,))), np.float32([np.nan]))).all()


def test_only_sums_of_erf_and_one_change():
    x = Load(U, (I,))
    erf = Call(ScalarFn.ERF, (x,), F32)
    for e in (Call(ScalarFn.ADD, (erf, Const(1.0, F32)), F32), Call(ScalarFn.ADD, (Const(1.0, F32), erf), F32)):
        assert isinstance(fast_forms(e), Call) and any(isinstance(n, Intrinsic) for n in _nodes(fast_forms(e)))
    for e in (erf, Call(ScalarFn.ADD, (erf, Const(2.0, F32)), F32), Call(ScalarFn.SUB, (Const(1.0, F32), erf), F32)):
        assert fast_forms(e) is e


def test_a_half_sum_is_evaluated_in_float32_and_rounded_once():
    h = Buffer("h", F16, (4096,), Scope.GLOBAL)
    x = Load(h, (I,))
    e = fast_forms(Call(ScalarFn.ADD, (Call(ScalarFn.ERF, (x,), F16), Const(1.0, F16)), F16))
    assert e.fn is ScalarFn.CAST and e.dtype is F16 and e.args[0].dtype is F32
    u = np.linspace(-4, 4, 4001).astype(np.float16)
    got = _eval(e, u).astype(np.float64)
    want = (1.0 + scipy.special.erf(u.astype(np.float64)))
    assert np.abs(got - want).max() <= 2.0**-10  # half an ulp of fp16 at 2, and the approximation


def _nodes(e):
    yield e
    for a in getattr(e, "args", ()):
        yield from _nodes(a)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_gelu_epilogue_renders_the_cheaper_form(dtype):
    """bert's exact GELU (x/2 (1 + erf(x / sqrt 2))) after a product: the emitted module
    calls __fdividef and __exp, not erf (the module text; it is compiled in
    test_cuda_codegen's producer test and run on the GPU machine)."""
    pytest.importorskip("tilelang")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from tilefuse.codegen.cuda import emit_tilelang
    from tilefuse.frontend import import_onnx
    from tilefuse.partition import partition_graph
    from tilefuse.target import CUDA_SM90A
    from tilefuse.tile_ir.lower import lower_group

    t = TensorProto.FLOAT16 if dtype == "float16" else TensorProto.FLOAT
    w = numpy_helper.from_array((np.random.default_rng(0).standard_normal((64, 256)) * 0.02).astype(dtype), "w")
    k = [numpy_helper.from_array(np.array(v, dtype), n) for n, v in (("s2", 1.4142135), ("one", 1.0), ("half", 0.5))]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Div", ["h", "s2"], ["d"]),
             helper.make_node("Erf", ["d"], ["e"]), helper.make_node("Add", ["e", "one"], ["p"]),
             helper.make_node("Mul", ["h", "p"], ["q"]), helper.make_node("Mul", ["q", "half"], ["y"])]
    g = helper.make_graph(nodes, "gelu", [helper.make_tensor_value_info("x", t, [256, 64])],
                          [helper.make_tensor_value_info("y", t, [256, 256])], [w, *k])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    (group,) = partition_graph(import_onnx(model.SerializeToString(), {}), CUDA_SM90A).groups
    text = emit_tilelang(lower_group(group, CUDA_SM90A).program).text
    assert "__fdividef" in text and "T.__exp(" in text and "T.erf(" not in text
    onnx.checker.check_model(model)
