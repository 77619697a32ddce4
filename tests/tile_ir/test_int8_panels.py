"""On the CPU, an integer product of uint8 rows by a constant int8 weight (a QDQ MatMul
rewritten by frontend/qdq.py, or a MatMulInteger as exported) reads the uint8 input in
place and the weight packed as panels of 4-row groups (tile_ir/lower/panels.py, the
prelude's u8 x s8 cores): int8 panels for kernels with AVX-512 VNNI, int16 ones (the
values widened at compile time) for the others. At shapes with every kind of tail (rows
past the last row tile, columns past the last panel, K not a multiple of 4 or of the K
block, one row) the lowered program interprets like the reference, and the compiled
kernel equals the reference's int32 result exactly, with every core the host can run:
VNNI's, AVX2's on int16 panels (x86-64-v3 and x86-64-v4 plans) and the plain loops
(x86-64-v2). onnxruntime's U8S8 kernel for AVX2
hosts without VNNI saturates its int16 pairs (vpmaddubsw: 255 * 127 * 2 > 32767), so it is
compared on inputs below 128, where no pair can saturate, and on the full range only where
the host has VNNI."""
from __future__ import annotations

import random
import subprocess

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tilefuse
from tests.codegen.prelude_builds import host_levels
from tests.ort_int8 import ort_int8_exact
from tilefuse.codegen.cpu.build import find_compiler, flags
from tilefuse.cpu_isa import LEVELS, host_flags
from tilefuse.frontend import import_onnx
from tilefuse.ir.dtypes import DType
from tilefuse.partition import partition_graph
from tilefuse.reference import evaluate_all, run_graph
from tilefuse.target import CPU, adjust
from tilefuse.tile_ir.ir import PanelGemm, statements
from tilefuse.tile_ir.lower import lower_group
from tilefuse.tile_ir.lower import panels as panels_module

from tests.tile_ir.interpreted import interpret


def integer_product(lead: tuple[int, ...], m: int, k: int, n: int, *, siblings: int = 1) -> onnx.ModelProto:
    """MatMulInteger(x uint8 [*lead, m, k], W int8 [k, n], zero point 131) for each of
    ``siblings`` weights (products sharing their input, as Q, K and V do); int32 outputs."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(np.array(131, np.uint8), "z")]
    nodes, outs = [], []
    for s in range(siblings):
        inits.append(numpy_helper.from_array(rng.integers(-128, 128, (k, n)).astype(np.int8), f"w{s}"))
        nodes.append(helper.make_node("MatMulInteger", ["x", f"w{s}", "z"], [f"y{s}"]))
        outs.append(helper.make_tensor_value_info(f"y{s}", TensorProto.INT32, [*lead, m, n]))
    graph = helper.make_graph(nodes, "integer", [helper.make_tensor_value_info("x", TensorProto.UINT8, [*lead, m, k])],
                              outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


SHAPES = [((), 128, 768, 768), ((), 1, 64, 32), ((1,), 7, 13, 100), ((2,), 37, 301, 64), ((), 130, 770, 97),
          ((), 64, 3, 40)]


def _feeds(seed: int, lead: tuple[int, ...], m: int, k: int, high: int = 256) -> dict:
    return {"x": np.random.default_rng(seed).integers(0, high, (*lead, m, k)).astype(np.uint8)}


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, (*s[0], *s[1:]))))
def test_integer_products_read_int8_panels_and_interpret_like_the_reference(shape):
    lead, m, k, n = shape
    graph = import_onnx(integer_product(lead, m, k, n))
    (group,) = [g for g in partition_graph(graph, CPU).groups if str(g.kind) != "opaque"]
    lowered = lower_group(group, CPU)
    (core,) = [s for s in statements(lowered.program.body) if isinstance(s, PanelGemm)]
    vnni = {"avx512f", "avx512_vnni"} <= host_flags()  # (the CPU target builds for this host)
    assert core.k_group == 4 and core.b.dtype is (DType.INT8 if vnni else DType.INT16) and core.width == 32, core
    assert core.k_rows == -(-k // 4) * 4
    assert core.a.buffer.dtype is DType.UINT8  # the rows are read in place, not widened into a tile
    assert not any(b.name.startswith(("a_tile", "b_tile")) for b in lowered.program.allocs), lowered.program.allocs
    seed = random.randrange(2**31)
    values = evaluate_all(graph, _feeds(seed, lead, m, k))
    for v, got in interpret(lowered, values):
        np.testing.assert_array_equal(got, values[id(v)], err_msg=f"{shape} seed={seed}: interpreted {v.name}")


@pytest.mark.parametrize("isa", host_levels())
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, (*s[0], *s[1:]))))
def test_compiled_integer_products_are_exact(shape, isa):
    lead, m, k, n = shape
    model = integer_product(lead, m, k, n, siblings=2 if m == 37 else 1)
    plan = tilefuse.compile(model, target=adjust(CPU, codegen__isa=isa))
    session = tilefuse.InferenceSession(plan)
    peer = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    vnni = ort_int8_exact()
    names = [o.name for o in model.graph.output]
    seed = random.randrange(2**31)
    for high in (256, 128):
        feeds = _feeds(seed, lead, m, k, high)
        got = session.run(None, feeds)
        ref = list(run_graph(import_onnx(model), feeds).values())
        want = peer.run(None, feeds) if high == 128 or vnni else ref
        for name, g, w, r in zip(names, got, want, ref):
            assert g.dtype == np.int32
            np.testing.assert_array_equal(g, r, err_msg=f"{shape} seed={seed} <{high} {name} against the reference")
            np.testing.assert_array_equal(g, w, err_msg=f"{shape} seed={seed} <{high} {name} against onnxruntime")


@pytest.mark.parametrize("isa", ["x86-64-v2", "x86-64-v3", "x86-64-v4", "vnni"])
def test_the_panels_are_int8_only_for_kernels_with_vnni(isa, monkeypatch):
    """The panels' type follows the kernels' instruction-set level: int8 where VNNI's
    core reads them (a host with AVX-512 VNNI, as native), int16 for every level that
    lacks it (x86-64-v4 included: its flags leave VNNI out, below)."""
    if isa == "vnni":  # a native build on a host with AVX-512 VNNI
        monkeypatch.setattr(panels_module.cpu_isa, "requires", lambda level: (*LEVELS["x86-64-v4"], "avx512_vnni"))
    target = adjust(CPU, codegen__isa="native" if isa == "vnni" else isa)
    (group,) = [g for g in partition_graph(import_onnx(integer_product((), 16, 64, 32)), target).groups
                if str(g.kind) != "opaque"]
    (core,) = [s for s in statements(lower_group(group, target).program.body) if isinstance(s, PanelGemm)]
    assert core.b.dtype is (DType.INT8 if isa == "vnni" else DType.INT16), core
    assert core.b.shape == (1, 16, 128)


def test_the_x86_64_v4_build_compiles_without_vnni():
    """The kernel flags of x86-64-v4 leave VNNI's macro undefined, so that plan takes int16
    panels and AVX2's core on them (x86-64-v2's the plain loop); a VNNI host's native
    build defines it."""
    def defines_vnni(isa: str) -> bool:
        out = subprocess.run([*find_compiler().command, *flags(isa), "-dM", "-E", "-x", "c", "-"], input="",
                             capture_output=True, text=True, check=True).stdout
        return "__AVX512VNNI__" in out
    assert not defines_vnni("x86-64-v4")
    assert defines_vnni("native") == ("avx512_vnni" in host_flags())
