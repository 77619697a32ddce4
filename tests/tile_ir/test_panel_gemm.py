"""On the CPU, a float32 product by a constant weight binds the weight packed in panels
and reads A in place (tile_ir/lower/panels.py, the prelude's product core): no operand
tiles. At shapes with every kind of tail (rows past the last row tile, columns past the
last panel, K not a multiple of the K block, batched A, one row) the lowered program
interprets like the reference, and the compiled kernel matches onnxruntime and the
reference on fresh random inputs. Products that must keep operand tiles (A computed in
the group, a weight read twice, the GPU) do."""
from __future__ import annotations

import random

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tilefuse
from tilefuse.compare import compare_output
from tilefuse.frontend import import_onnx
from tilefuse.partition import partition_graph
from tilefuse.reference import evaluate_all, run_graph
from tilefuse.target import CPU, CUDA_SM90A
from tilefuse.tile_ir.ir import PanelGemm, statements
from tilefuse.tile_ir.lower import lower_group

from tests.tile_ir.interpreted import interpret


def product(lead: tuple[int, ...], m: int, k: int, n: int, *, prologue: bool = False, relu: bool = True) -> onnx.ModelProto:
    """x [*lead, m, k] @ w [k, n] + b, then Relu; ``prologue``: x scaled by 2 in the group first."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b")]
    nodes, a = [], "x"
    if prologue:
        inits.append(numpy_helper.from_array(np.array(2.0, np.float32), "two"))
        nodes.append(helper.make_node("Mul", ["x", "two"], ["x2"]))
        a = "x2"
    nodes += [helper.make_node("MatMul", [a, "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["pb" if relu else "y"])]
    if relu:
        nodes.append(helper.make_node("Relu", ["pb"], ["y"]))
    graph = helper.make_graph(nodes, "product", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*lead, m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*lead, m, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


SHAPES = [((1,), 128, 768, 768), ((), 1, 64, 32), ((), 7, 33, 100), ((2,), 37, 300, 64), ((1,), 130, 257, 1000),
          ((3,), 5, 1, 96), ((), 64, 520, 40), ((1,), 197, 96, 64), ((2,), 131, 64, 96)]  # 197, 131: primes


def _group(model: onnx.ModelProto, target):
    graph = import_onnx(model)
    (group,) = [g for g in partition_graph(graph, target).groups if str(g.kind) != "opaque"]
    return graph, group


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, (*s[0], *s[1:]))))
def test_cpu_products_by_a_constant_weight_read_packed_panels_in_place(shape):
    lead, m, k, n = shape
    graph, group = _group(product(lead, m, k, n), CPU)
    lowered = lower_group(group, CPU)
    program = lowered.program
    (core,) = [s for s in statements(program.body) if isinstance(s, PanelGemm)]
    s = program.schedule
    assert s.panel_width == core.width == 32 and s.tile_n % 32 == 0, s
    assert not any(b.name.startswith(("a_tile", "b_tile")) for b in program.allocs), program.allocs
    (packed,) = [v for v in lowered.bindings if v.name.endswith(f"panels32x{-(-n // s.tile_n) * s.tile_n}")]
    assert packed.type.shape == (-(-n // s.tile_n) * s.tile_n // 32, k, 32)
    seed = random.randrange(2**31)
    x = np.random.default_rng(seed).standard_normal((*lead, m, k)).astype(np.float32)
    values = evaluate_all(graph, {"x": x})
    for v, got in interpret(lowered, values):
        c = compare_output(v.name, got, values[id(v)])
        assert c.ok, f"{shape} seed={seed}: interpreted {c.problem}"


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, (*s[0], *s[1:]))))
def test_compiled_panel_products_match_onnxruntime(shape):
    lead, m, k, n = shape
    model = product(lead, m, k, n)
    seed = random.randrange(2**31)
    x = np.random.default_rng(seed).standard_normal((*lead, m, k)).astype(np.float32)
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    ref = list(run_graph(import_onnx(model), {"x": x}).values())[0]
    plan = tilefuse.compile(model, target="cpu")
    assert [k.schedule.get("panel_width") for k in plan.kernels.values()] == [32], [k.schedule for k in plan.kernels.values()]
    (got,) = tilefuse.InferenceSession(plan).run(None, {"x": x})
    for what, expected in (("onnxruntime", want), ("reference", ref)):
        c = compare_output("y", got, expected)
        assert c.ok, f"{shape} seed={seed} against {what}: {c.problem}"


def test_a_computed_a_keeps_its_operand_tiles():
    _, group = _group(product((1,), 64, 128, 64, prologue=True), CPU)
    program = lower_group(group, CPU).program
    assert program.schedule.panel_width == 0
    assert not any(isinstance(s, PanelGemm) for s in statements(program.body))


def test_the_gpu_keeps_its_operand_tiles():
    _, group = _group(product((1,), 128, 256, 256), CUDA_SM90A)
    program = lower_group(group, CUDA_SM90A).program
    assert program.schedule.panel_width == 0
    assert not any(isinstance(s, PanelGemm) for s in statements(program.body))


def siblings(m: int, k: int, n: int) -> onnx.ModelProto:
    """Q, K and V of one input: three products sharing A, each with its bias."""
    rng = np.random.default_rng(1)
    inits, nodes, outs = [], [], []
    for s in "qkv":
        inits += [numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), f"w{s}"),
                  numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), f"b{s}")]
        nodes += [helper.make_node("MatMul", ["x", f"w{s}"], [f"p{s}"]), helper.make_node("Add", [f"p{s}", f"b{s}"], [s])]
        outs.append(helper.make_tensor_value_info(s, TensorProto.FLOAT, [1, m, n]))
    graph = helper.make_graph(nodes, "qkv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, m, k])], outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def mlp(m: int, d: int, hidden: int, *, lead: tuple[int, ...] = (1,), act: str = "Gelu",
        leak: bool = False) -> onnx.ModelProto:
    """A transformer's MLP block: LayerNorm(x + act(x @ W1 + b1) @ W2 + b2); ``leak``: the
    intermediate is also an output (read outside the chain)."""
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array((rng.standard_normal((d, hidden)) / np.sqrt(d)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "b1"),
             numpy_helper.from_array((rng.standard_normal((hidden, d)) / np.sqrt(hidden)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.standard_normal(d).astype(np.float32), "b2"),
             numpy_helper.from_array(rng.standard_normal(d).astype(np.float32), "g"),
             numpy_helper.from_array(rng.standard_normal(d).astype(np.float32), "beta")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node(act, ["hb"], ["a"]),
             helper.make_node("MatMul", ["a", "w2"], ["o"]), helper.make_node("Add", ["o", "b2"], ["ob"]),
             helper.make_node("Add", ["ob", "x"], ["r"]),
             helper.make_node("LayerNormalization", ["r", "g", "beta"], ["y"], axis=-1, epsilon=1e-5)]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*lead, m, d])]
    if leak:
        outputs.append(helper.make_tensor_value_info("a", TensorProto.FLOAT, [*lead, m, hidden]))
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*lead, m, d])],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 8
    return model


def _check_model(model: onnx.ModelProto, shape: tuple[int, ...], what: str) -> None:
    seed = random.randrange(2**31)
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    ref = list(run_graph(import_onnx(model), {"x": x}).values())
    plan = tilefuse.compile(model, target="cpu")
    cores = [k.schedule.get("panel_width") for k in plan.kernels.values() if k.schedule.get("family") == "gemm"]
    assert cores and all(w == 32 for w in cores), [k.schedule for k in plan.kernels.values()]
    got = tilefuse.InferenceSession(plan).run(None, {"x": x})
    for name, g, w, r in zip([o.name for o in model.graph.output], got, want, ref):
        for against, expected in (("onnxruntime", w), ("reference", r)):
            c = compare_output(name, g, expected)
            assert c.ok, f"{what} seed={seed} {name} against {against}: {c.problem}"


@pytest.mark.parametrize("m, k, n", [(128, 768, 768), (37, 200, 96)])
def test_sibling_products_each_read_their_panels(m, k, n):
    _check_model(siblings(m, k, n), (1, m, k), f"siblings {m}x{k}x{n}")


@pytest.mark.parametrize("m, d, hidden", [(128, 256, 1024), (70, 256, 544), (197, 256, 544)])
def test_a_weight_chain_walks_both_weights_panels(m, d, hidden):
    """(70, 256, 544): rows past the last row tile, an intermediate of 544 = two K chunks
    of 256 and a partial one; 197 (ViT's tokens, a prime): near-equal row tiles, the last
    one partial. (128, 256, 1024): 2 MB of weights over 128 rows, split in two parts
    (partition/split_chains.py): a chain batched by its parts, each part's weight
    matrices packed one after the other."""
    model = mlp(m, d, hidden)
    graph = import_onnx(model)
    (s,) = [sch for sch in (lower_group(g, CPU).program.schedule for g in partition_graph(graph, CPU).groups)
            if getattr(sch, "chain", False)]
    assert s.chain and s.panel_width == 32, s
    assert s.batch == ((2,) if m == 128 else (1,)), s.batch
    if m == 197:
        assert m % s.tile_m and s.tile_m >= 16, s
    _check_model(model, (1, m, d), f"mlp {m}x{d}x{hidden}")
