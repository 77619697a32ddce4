"""Exact float32 products on the GPU (FMA loops, no tensor cores): where the accumulator
splits evenly over the block within ``CudaOptions.fma_registers`` elements a thread, it is
a register tile and the printer steps over K outermost, so one step's operand loads serve
all of a thread's elements; otherwise (or with the option at 0) it stays in shared memory
and each element runs its own K loop. Either way each element sums K in order."""
from __future__ import annotations

import re

import pytest

from tilefuse.codegen.cuda.emit import emit_tilelang
from tilefuse.ir.dtypes import DType
from tilefuse.target import CUDA_SM90A, adjust
from tilefuse.tile_ir import verify_program
from tilefuse.tile_ir.ir import Buffer, Fill, Gemm, Load, Loop, LoopKind, Scope, Store, TileProgram, Var, const_index, statements
from tilefuse.tile_ir.passes import DeviceOptions, for_device

F32 = DType.FLOAT32


def _exact_product(m: int, n: int, k: int = 32, threads: int = 128) -> TileProgram:
    """An m x n float32 product over k, not rounded to TF32: an FMA loop."""
    a, b = Buffer("a", F32, (m, k), Scope.GLOBAL), Buffer("b", F32, (k, n), Scope.GLOBAL)
    y = Buffer("y", F32, (m, n), Scope.GLOBAL)
    sa, sb = Buffer("sa", F32, (m, k), Scope.SHARED), Buffer("sb", F32, (k, n), Scope.SHARED)
    acc = Buffer("acc", F32, (m, n), Scope.FRAGMENT)
    i, j = Var("i"), Var("j")

    def nest(rows, width, body):
        return Loop(i, rows, LoopKind.PARALLEL, (Loop(j, width, LoopKind.PARALLEL, body),))

    body = (
        nest(m, k, (Store(sa, (i, j), Load(a, (i, j))),)),
        nest(k, n, (Store(sb, (i, j), Load(b, (i, j))),)),
        Fill(acc, const_index(0)),
        Gemm(sa, sb, acc),
        nest(m, n, (Store(y, (i, j), Load(acc, (i, j))),)),
    )
    return TileProgram("exact", (a, b, y), 2, (1,), (Var("bx"),), threads, (sa, sb, acc), body)


def _printed(p: TileProgram, fma_registers: int) -> tuple[TileProgram, str]:
    target = adjust(CUDA_SM90A, codegen__fma_registers=fma_registers)
    placed = for_device(p, target.device, DeviceOptions.of(target.codegen))
    verify_program(placed, target)
    return placed, emit_tilelang(placed, target.codegen, target.device).text


def _k_outermost(text: str) -> bool:
    return bool(re.search(r"for (_t\d+) in T\.serial\(32\):\n\s+for _t\d+, _t\d+ in T\.Parallel\(\d+, \d+\):\n"
                          r"\s+acc\[_t\d+, _t\d+\] = acc\[_t\d+, _t\d+\] \+ sa\[_t\d+, \1\] \* sb\[\1, _t\d+\]", text))


def _k_innermost(text: str) -> bool:
    return bool(re.search(r"for _t\d+, _t\d+ in T\.Parallel\(\d+, \d+\):\n\s+for (_t\d+) in T\.serial\(32\):\n"
                          r"\s+acc\[_t\d+, _t\d+\] = acc\[_t\d+, _t\d+\] \+ sa\[_t\d+, \1\] \* sb\[\1, _t\d+\]", text))


def test_the_default_keeps_an_exact_accumulator_in_registers_and_steps_over_k_outermost():
    assert CUDA_SM90A.codegen.fma_registers == DeviceOptions().fma_registers > 0
    placed, text = _printed(_exact_product(64, 64), CUDA_SM90A.codegen.fma_registers)  # 32 elements a thread
    (gemm,) = [s for s in placed.body if isinstance(s, Gemm)]
    assert not gemm.tensor_cores and "acc" in placed.registers
    assert "acc = T.alloc_fragment((64, 64)" in text and _k_outermost(text) and not _k_innermost(text)


@pytest.mark.parametrize("m, n, most", [(64, 512, 128),  # 256 elements a thread, over the bound
                                        (64, 64, 0)])     # the option off (variant "fmashared")
def test_an_accumulator_past_the_bound_stays_in_shared_memory_with_k_innermost(m, n, most):
    placed, text = _printed(_exact_product(m, n), most)
    assert "acc" not in placed.registers
    assert f"acc = T.alloc_shared(({m}, {n})" in text and _k_innermost(text) and not _k_outermost(text)


def test_threads_are_fitted_before_placement():
    """A 24 x 20 accumulator (480 elements) does not split over 128 threads: the block is
    narrowed to one that splits it (fit_threads), and then each thread holds its 15."""
    placed, text = _printed(_exact_product(24, 20, threads=128), 128)
    assert 480 % placed.threads == 0 and 480 // placed.threads <= 128
    assert "acc" in placed.registers and _k_outermost(text)


def test_an_exact_whole_row_product_takes_k_steps_below_the_mma_s_16():
    """A float32 product fused with an RMSNorm over 2048-wide rows (LLaMA at batch 32; it
    did not compile): its B tile is K x 2048, 128 KB at K 16, two stages past
    the block's 227 KB. An exact product takes any K step: it halves to fit; and its row
    tile is chosen so the accumulator fits the register bound."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from tilefuse.frontend import import_onnx
    from tilefuse.partition import partition_graph
    from tilefuse.tile_ir import lower_group

    rng = np.random.default_rng(0)
    rows, k, n = (32, 128), 2048, 2048
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "r"], ["h"]),
             helper.make_node("Mul", ["h", "h"], ["sq"]), helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1]),
             helper.make_node("Add", ["ms", "eps"], ["mse"]), helper.make_node("Sqrt", ["mse"], ["rms"]),
             helper.make_node("Div", ["h", "rms"], ["hn"]), helper.make_node("Mul", ["g", "hn"], ["y"])]
    inits = [numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "w"),
             numpy_helper.from_array(np.ones(n, np.float32), "g"), numpy_helper.from_array(np.array(1e-6, np.float32), "eps")]
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(nodes, "whole_row", [helper.make_tensor_value_info("x", f32, [*rows, k]),
                                                   helper.make_tensor_value_info("r", f32, [*rows, n])],
                              [helper.make_tensor_value_info("y", f32, [*rows, n]), helper.make_tensor_value_info("h", f32, [*rows, n])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    g = import_onnx(onnx.load_from_string(model.SerializeToString()), {})
    groups = [x for x in partition_graph(g, CUDA_SM90A).groups if any(type(nd.op).__name__ == "MatMul" for nd in x.nodes)]
    (group,) = groups
    program = lower_group(group, CUDA_SM90A).program  # verified: its tiles fit the block
    (gemm,) = [s for s in statements(program.body) if isinstance(s, Gemm)]
    assert gemm.b.shape[1] == n and gemm.b.shape[0] < 16 and not gemm.tensor_cores
    # and its rows are few enough that the accumulator stays in registers (8 of 2048 on
    # 128 threads: 128 elements a thread; 16 rows stayed in shared memory, 330 ms at b32)
    rows_of_tile = gemm.c.shape[0]
    assert gemm.c.name in program.registers
    assert rows_of_tile * n // program.threads <= CUDA_SM90A.codegen.fma_registers
