"""Helpers of the onnxruntime integration tests: the zoo models to run, a model with ops
tilefuse leaves to onnxruntime, plain onnxruntime as the reference, and CPU exports
relabelled for the CUDA provider's stand-in driver."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import models
from tests.ort_int8 import ort_int8_exact
from tilefuse.frontend import import_onnx
from tilefuse.frontend.qdq import checked_precision
from tilefuse.ort import CUDA_EP_NAME
from tilefuse.reference import run_graph

# Zoo models that onnxruntime runs (edge-custom-op is a custom op nobody implements).
RUNNABLE = [name for name, spec in models.ZOO.items() if spec.runs_in_ort]


def mixed_model() -> onnx.ModelProto:
    """Claimed ops around two that stay with onnxruntime: Det (no tilefuse converter) and
    TopK (a tilefuse host step). s bypasses Det, so a naive region {h, s, y} would have a
    cycle through Det; the export must split it."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal((3,)).astype(np.float32), "b")
    k = numpy_helper.from_array(np.array([2], np.int64), "k")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"], name="matmul"),
        helper.make_node("Add", ["xw", "b"], ["h0"], name="add"),
        helper.make_node("Relu", ["h0"], ["h"], name="relu"),
        helper.make_node("Det", ["h"], ["d"], name="det"),
        helper.make_node("ReduceSum", ["h", "axes"], ["s"], name="sum", keepdims=0),
        helper.make_node("Mul", ["d", "s"], ["ds"], name="mul"),
        helper.make_node("Tanh", ["ds"], ["y"], name="tanh"),
        helper.make_node("TopK", ["y", "k"], ["top", "top_i"], name="topk"),
        helper.make_node("Mul", ["top", "top"], ["z"], name="square"),
    ]
    axes = numpy_helper.from_array(np.array([1, 2], np.int64), "axes")
    graph = helper.make_graph(
        nodes, "mixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch"]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])],
        [w, b, k, axes],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def reference(path: Path, feeds: dict) -> dict[str, np.ndarray]:
    """Plain onnxruntime's outputs by name; for a quantized model on a host where its u8 x
    s8 kernels are not exact (tests/ort_int8.py), the project's reference's."""
    if checked_precision(path) == "int8" and not ort_int8_exact():
        return run_graph(import_onnx(str(path), shapes={k: v.shape for k, v in feeds.items()}), feeds)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def data_dependent_model() -> onnx.ModelProto:
    """Unique's output length depends on the data: the Mul after it cannot be compiled for
    a fixed shape and stays with onnxruntime too; Relu and Neg around it are claimed."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Unique", ["r"], ["u"], name="unique"),
        helper.make_node("Mul", ["u", "u"], ["y"], name="square"),
        helper.make_node("Neg", ["r"], ["z"], name="neg"),
    ]
    graph = helper.make_graph(
        nodes, "data_dependent", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [6])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def as_fake_cuda(src: Path, out: Path) -> Path:
    """A CPU export relabelled for the CUDA provider, for the fake driver: descriptors say
    cuda and launch their CPU library with every param as a pointer (grid x = count)."""
    shutil.copytree(src, out)
    for d in (out / "kernels").glob("*.tfk"):
        lines = d.read_text().splitlines()
        n = sum(line.startswith(("input ", "output ", "status ")) for line in lines)
        lines = ["target cuda" if line.startswith("target ") else line for line in lines]
        lines += [f"grid {n} 1 1", "block 1 1 1", "smem 0", *(f"arg pointer {i}" for i in range(n))]
        d.write_text("\n".join(lines) + "\n")
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    for node in model.graph.node:
        for a in node.attribute:
            if a.name == "source":
                a.s = CUDA_EP_NAME.encode()
    onnx.save(model, str(out / "model.onnx"))
    return out


TILEFUSE_OPS = {"EPContext", "FusedKernel", "Identity"}  # what an export's tilefuse nodes are


def export_session(result, ep_options) -> ort.InferenceSession:
    """onnxruntime's session on an ``export_ort`` result: with the plugin provider
    (``ep_options``, the conftest fixture) or the custom-op library beside the model."""
    if result.mode == "ep":
        return ort.InferenceSession(str(result.model_path), ep_options())
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(result.library))
    return ort.InferenceSession(str(result.model_path), so)


def computed_ops(result) -> list[str]:
    """The op types of an exported model that onnxruntime computes itself."""
    model = onnx.load(str(result.model_path), load_external_data=False)
    return sorted(n.op_type for n in model.graph.node if n.op_type not in TILEFUSE_OPS)
