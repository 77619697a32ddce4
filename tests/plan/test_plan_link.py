"""link: buffers, steps and kernels from a partition, and the mistakes it refuses."""
import dataclasses

import numpy as np
import pytest

from tilefuse.codegen.artifact import ParamSpec
from tilefuse.errors import PlanError
from tilefuse.ir.prims import TopK
from tilefuse.partition import partition_graph
from tilefuse.plan import BufferKind, HostStep, KernelStep, link
from tilefuse.target import CPU

from tests.plan.handmade import MATMUL_BIAS_RELU, compile_kernel, mlp_graph, mlp_plan, topk_plan


def test_mlp_plan_structure(tmp_path):
    graph, plan = mlp_plan(tmp_path)
    assert [type(s) for s in plan.steps] == [KernelStep, KernelStep]
    assert [b.name for b in plan.inputs] == ["x"]
    assert [b.name for b in plan.outputs] == ["h0", "h1", "x_again", "table"]
    kinds = {b.name: plan.buffers[b.buffer].kind for b in plan.outputs}
    assert kinds == {"h0": BufferKind.OUTPUT, "h1": BufferKind.OUTPUT, "x_again": BufferKind.INPUT,
                     "table": BufferKind.CONSTANT}
    # h0 is written by the first kernel and read by the second: one buffer for both.
    first, second = plan.steps
    assert first.outputs[0] == second.inputs[0] == plan.outputs[0].buffer
    assert set(plan.weights) == {b.name for b in plan.buffers if b.kind is BufferKind.CONSTANT}
    assert plan.weights["table"].dtype.name == "bfloat16"


def test_topk_is_a_host_step(tmp_path):
    _, plan = topk_plan(tmp_path)
    kernel, host, kernel2 = plan.steps
    assert isinstance(host, HostStep) and host.primitive == TopK(axis=1, k=4)
    assert host.inputs == kernel.outputs and kernel2.inputs[0] == host.outputs[0]
    assert isinstance(kernel2, KernelStep)


def _mlp_parts(tmp_path):
    graph = mlp_graph()
    partition = partition_graph(graph, CPU)
    g0, g1 = partition.groups
    kernels = {
        g0.id: compile_kernel(tmp_path, g0, MATMUL_BIAS_RELU, M=4, K=8, N=16),
        g1.id: compile_kernel(tmp_path, g1, MATMUL_BIAS_RELU, M=4, K=16, N=8),
    }
    return graph, partition, kernels


def test_missing_kernel(tmp_path):
    graph, partition, kernels = _mlp_parts(tmp_path)
    del kernels[1]
    with pytest.raises(PlanError, match="no kernel for group 1"):
        link(graph, partition, kernels, "cpu", "")


def test_params_must_match_the_group(tmp_path):
    graph, partition, kernels = _mlp_parts(tmp_path)
    params = list(kernels[0].params)
    params[1] = ParamSpec(params[1].name, "float32", (8, 15), "input")
    kernels[0] = dataclasses.replace(kernels[0], params=tuple(params))
    with pytest.raises(PlanError, match=r"param 1 \(w0\)"):
        link(graph, partition, kernels, "cpu", "")
    kernels[0] = dataclasses.replace(kernels[0], params=tuple(params[:-1]))
    with pytest.raises(PlanError, match="4 params, but 4 inputs and 1 outputs are bound"):
        link(graph, partition, kernels, "cpu", "")


def test_kernel_file_and_name_are_checked(tmp_path):
    graph, partition, kernels = _mlp_parts(tmp_path)
    bad_name = dict(kernels)
    bad_name[0] = dataclasses.replace(kernels[0], name="../evil")
    with pytest.raises(PlanError, match="'../evil' is not a generated kernel name"):
        link(graph, partition, bad_name, "cpu", "")
    no_file = dict(kernels)
    no_file[0] = dataclasses.replace(kernels[0], path=tmp_path / "nowhere.so")
    with pytest.raises(PlanError, match="does not exist"):
        link(graph, partition, no_file, "cpu", "")
    clash = dict(kernels)
    clash[1] = dataclasses.replace(kernels[1], name=kernels[0].name, symbol=kernels[0].symbol)
    with pytest.raises(PlanError, match="two different kernels"):
        link(graph, partition, clash, "cpu", "")
    untyped = dict(kernels)  # launch data is the family's record, never a loose dict
    untyped[0] = dataclasses.replace(kernels[0], launch={"threads": 1})
    with pytest.raises(PlanError, match="launch data is a dict, not a CpuLaunch"):
        link(graph, partition, untyped, "cpu", "")


def test_shared_kernel_appears_once(tmp_path):
    # Identical layers may share one artifact: the plan lists the kernel once.
    from tilefuse.ir import Builder, DType, TensorType
    from tilefuse.ir.prims import ScalarFn

    rng = np.random.default_rng(0)
    b = Builder("twins")
    h = b.input("x", TensorType(DType.FLOAT32, (4, 8)))
    for i in range(2):
        w = b.const(rng.standard_normal((8, 8)).astype(np.float32), name=f"w{i}")
        bias = b.const(rng.standard_normal(8).astype(np.float32), name=f"b{i}")
        h = b.map(ScalarFn.MAX, b.map(ScalarFn.ADD, b.matmul(h, w), bias), b.const(np.float32(0)))
        b.output(f"y{i}", h)  # each layer's output is read: two kernels, not one weight chain
    partition = partition_graph(b.graph, CPU)
    artifact = compile_kernel(tmp_path, partition.groups[0], MATMUL_BIAS_RELU, M=4, K=8, N=8)
    plan = link(b.graph, partition, {0: artifact, 1: artifact}, "cpu", "")
    assert len(plan.kernels) == 1 and len(plan.steps) == 2
