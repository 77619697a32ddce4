"""The CUDA emitter's cheaper forms (codegen/cuda/fast_math.py and the device functions of
codegen/cuda/include/tilefuse_math.cuh): ``1 + erf(u)`` through Abramowitz-Stegun's erfc.
The header is compiled for the host here (its intrinsics then fall back to their exact
counterparts; rcp.approx and ex2.approx are within 2 ulp) and evaluated against erf in
float64; the emitted kernels call it and compile for sm_90a."""
import shutil
import subprocess

import numpy as np
import pytest
import scipy.special

from tilefuse.codegen.cuda.fast_math import HEADER, DeviceCall, fast_forms
from tilefuse.ir.dtypes import DType
from tilefuse.ir.prims import ScalarFn
from tilefuse.tile_ir.ir import Buffer, Call, Const, Load, Scope, Var

F32, F16 = DType.FLOAT32, DType.FLOAT16
U = Buffer("u", F32, (4096,), Scope.GLOBAL)
I = Var("i")

_DRIVER = r"""
#define __host__
#define __device__
#define __forceinline__ inline
#include <cstdio>
#include <cstdlib>
#include "HEADER"
int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) printf("%.9g\n", (double)tf_erf_plus_one(strtof(argv[i], nullptr)));
}
"""


@pytest.fixture(scope="module")
def erf_plus_one(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    d = tmp_path_factory.mktemp("fast_math")
    (d / "driver.cpp").write_text(_DRIVER.replace("HEADER", str(HEADER)))
    subprocess.run([cxx, "-O2", "-o", str(d / "driver"), str(d / "driver.cpp")], check=True)

    def run(u: np.ndarray) -> np.ndarray:
        out = subprocess.run([str(d / "driver"), *(repr(float(x)) for x in u)], check=True, capture_output=True, text=True)
        return np.array([float(x) for x in out.stdout.split()])

    return run


def test_erf_plus_one_is_within_fp32_erf_accuracy(erf_plus_one):
    u = np.concatenate([np.linspace(-6, 6, 2001), [0.0, -0.0, 1e-8, -1e-8, 30.0, -30.0, np.inf, -np.inf]]).astype(np.float32)
    got = erf_plus_one(u)
    want = 1.0 + scipy.special.erf(u.astype(np.float64))
    # A-S 7.1.26's 1.5e-7 plus float32 rounding: <= 2.5 ulp of the sum near 2 (erff + 1 in
    # float32: ~1 ulp)
    assert np.abs(got - want).max() < 6e-7
    assert list(got[-4:]) == [2.0, 0.0, 2.0, 0.0]
    assert np.isnan(erf_plus_one(np.float32([np.nan]))).all()


def test_only_sums_of_erf_and_one_change():
    x = Load(U, (I,))
    erf = Call(ScalarFn.ERF, (x,), F32)
    for e in (Call(ScalarFn.ADD, (erf, Const(1.0, F32)), F32), Call(ScalarFn.ADD, (Const(1.0, F32), erf), F32)):
        assert fast_forms(e) == DeviceCall("tf_erf_plus_one", (x,))
    inner = Call(ScalarFn.MUL, (x, Call(ScalarFn.ADD, (erf, Const(1.0, F32)), F32)), F32)
    assert fast_forms(inner).args[1] == DeviceCall("tf_erf_plus_one", (x,))
    for e in (erf, Call(ScalarFn.ADD, (erf, Const(2.0, F32)), F32), Call(ScalarFn.SUB, (Const(1.0, F32), erf), F32)):
        assert fast_forms(e) is e


def test_a_half_sum_is_evaluated_in_float32_and_rounded_once():
    h = Buffer("h", F16, (4096,), Scope.GLOBAL)
    x = Load(h, (I,))
    e = fast_forms(Call(ScalarFn.ADD, (Call(ScalarFn.ERF, (x,), F16), Const(1.0, F16)), F16))
    assert e == Call(ScalarFn.CAST, (DeviceCall("tf_erf_plus_one", (Call(ScalarFn.CAST, (x,), F32),)),), F16)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_gelu_epilogue_calls_the_device_function_once_an_element(dtype):
    """bert's exact GELU (x/2 (1 + erf(x / sqrt 2))) after a product: the kernel calls
    tf_erf_plus_one, not erf, once per element, and compiles for sm_90a (run on the GPU
    machine by gpu_check / gpu_real_check)."""
    pytest.importorskip("tilelang")
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    from onnx import TensorProto, helper, numpy_helper

    from tilefuse.codegen.cuda import build_all, emit_tilelang
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
    program = lower_group(group, CUDA_SM90A).program
    text = emit_tilelang(program).text
    assert text.count('"tf_erf_plus_one"') == 1 and "T.erf(" not in text
    (art,) = build_all([program], arch="sm_90a")
    source = art.source.read_text()
    assert source.count("tf_erf_plus_one(") == 1 and "erff(" not in source
