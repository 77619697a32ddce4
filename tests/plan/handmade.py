"""Hand-written C kernels and the small graphs they compute, for plan and runtime tests.

The code generator is tested elsewhere; here each kernel is a few lines of C that
compute exactly one FusedGroup of a known graph, compiled with ``cc`` into a shared
library with the CPU ABI ``void SYMBOL(void **args)``.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from tilefuse.codegen.artifact import KernelArtifact, ParamSpec
from tilefuse.codegen.launch import CpuLaunch, CudaLaunch, KernelArg
from tilefuse.ir import Builder, DType, Graph, TensorType
from tilefuse.ir.prims import CumSum, ScalarFn, TopK
from tilefuse.partition import FusedGroup, Partition, partition_graph
from tilefuse.plan import Plan, link
from tilefuse.target import CPU

# y = max(x @ w + b, zero): the group [MatMul, add, max] with inputs (x, w, b, zero).
MATMUL_BIAS_RELU = r"""
void SYMBOL(void **args) {
    const float *x = args[0], *w = args[1], *b = args[2], *zero = args[3];
    float *y = args[4];
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) acc += x[i * K + k] * w[k * N + j];
            acc += b[j];
            y[i * N + j] = acc > *zero ? acc : *zero;
        }
}
"""

# y = max(x + b, zero) with b broadcast along rows: the group [add, max].
BIAS_RELU = r"""
void SYMBOL(void **args) {
    const float *x = args[0], *b = args[1], *zero = args[2];
    float *y = args[3];
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float v = x[i * N + j] + b[j];
            y[i * N + j] = v > *zero ? v : *zero;
        }
}
"""

# y = max(x + b, zero), rows in parallel; every share records the team size it ran in. Built
# with the kernels' flags and (unless pool=False) tilefuse's thread pool, like a real kernel.
PROBE = r"""
_Atomic int32_t probe_team;
void SYMBOL(void **args) {
    const float *x = args[0], *b = args[1], *zero = args[2];
    float *y = args[3];
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < M; i++) {
        atomic_store(&probe_team, omp_get_num_threads());
        for (int j = 0; j < N; j++) {
            float v = x[i * N + j] + b[j];
            y[i * N + j] = v > *zero ? v : *zero;
        }
    }
}
"""
PROBE_M, PROBE_N = 256, 64

F32 = DType.FLOAT32


def compile_kernel(tmp: Path, group: FusedGroup, source: str, **defines: int) -> KernelArtifact:
    """Build ``source`` for ``group`` (sizes as -D macros); params are the group's values."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    digest = hashlib.sha256((source + repr(sorted(defines.items()))).encode()).hexdigest()[:10]  # a generated kernel name: plan.model.KERNEL_NAME
    name = f"{group.name}_{digest}"
    tmp.mkdir(parents=True, exist_ok=True)
    src, lib = tmp / f"{name}.c", tmp / f"{name}.so"
    src.write_text(source)
    flags = [f"-D{k}={v}" for k, v in defines.items()] + [f"-DSYMBOL={name}"]
    subprocess.run([cc, "-O2", "-shared", "-fPIC", *flags, "-o", str(lib), str(src)], check=True)
    params = [ParamSpec(v.name, str(v.type.dtype), v.type.shape, "input") for v in group.inputs]
    params += [ParamSpec(v.name, str(v.type.dtype), v.type.shape, "output") for v in group.outputs]
    return KernelArtifact(name, name, lib, tuple(params), CpuLaunch(1), src)


def ops(group: FusedGroup) -> list[str]:
    return [n.op.name for n in group.nodes]


def mlp_graph(m: int = 4, k: int = 8, n: int = 16, seed: int = 0) -> Graph:
    """Two [MatMul, add, max] layers; the hidden layer is an output too, and so are the
    input itself and a bfloat16 constant (outputs that no step writes)."""
    rng = np.random.default_rng(seed)
    b = Builder("mlp")
    x = b.input("x", TensorType(F32, (m, k)))
    h = x
    for i, (kk, nn) in enumerate([(k, n), (n, k)]):
        w = b.const(rng.standard_normal((kk, nn)).astype(np.float32), name=f"w{i}")
        bias = b.const(rng.standard_normal(nn).astype(np.float32), name=f"b{i}")
        h = b.map(ScalarFn.MAX, b.map(ScalarFn.ADD, b.matmul(h, w), bias), b.const(np.float32(0)))
        b.output(f"h{i}", h)
    b.output("x_again", x)
    table = (rng.standard_normal((2, 3)) * 10).astype(ml_dtypes.bfloat16)
    b.output("table", b.const(table, name="table"))
    return b.graph


def mlp_plan(tmp: Path, m: int = 4, k: int = 8, n: int = 16) -> tuple[Graph, Plan]:
    graph = mlp_graph(m, k, n)
    partition = partition_graph(graph, CPU)
    g0, g1 = partition.groups
    assert ops(g0) == ops(g1) == ["MatMul", "add", "max"], "the partitioner changed: adapt the kernels"
    kernels = {
        g0.id: compile_kernel(tmp, g0, MATMUL_BIAS_RELU, M=m, K=k, N=n),
        g1.id: compile_kernel(tmp, g1, MATMUL_BIAS_RELU, M=m, K=n, N=k),
    }
    return graph, link(graph, partition, kernels, "cpu", "0" * 64)


def topk_graph(m: int = 4, n: int = 16, k: int = 4, seed: int = 1) -> Graph:
    """[MatMul, add, max] -> TopK (a host step) -> [add, max] on the values; the indices
    are an output straight from the host step."""
    rng = np.random.default_rng(seed)
    b = Builder("topk")
    x = b.input("x", TensorType(F32, (m, 8)))
    zero = b.const(np.float32(0))
    h = b.matmul(x, b.const(rng.standard_normal((8, n)).astype(np.float32), name="w"))
    h = b.map(ScalarFn.MAX, b.map(ScalarFn.ADD, h, b.const(rng.standard_normal(n).astype(np.float32), name="b")), zero)
    values, indices = b.emit(TopK(axis=1, k=k), [h])
    bias = b.const(rng.standard_normal(k).astype(np.float32), name="c")
    b.output("y", b.map(ScalarFn.MAX, b.map(ScalarFn.ADD, values, bias), zero))
    b.output("indices", indices)
    return b.graph


def topk_plan(tmp: Path, m: int = 4, n: int = 16, k: int = 4) -> tuple[Graph, Plan]:
    graph = topk_graph(m, n, k)
    partition = partition_graph(graph, CPU)
    g0, g1, g2 = partition.groups
    assert (ops(g0), ops(g1), ops(g2)) == (["MatMul", "add", "max"], ["TopK"], ["add", "max"])
    kernels = {
        g0.id: compile_kernel(tmp, g0, MATMUL_BIAS_RELU, M=m, K=8, N=n),
        g2.id: compile_kernel(tmp, g2, BIAS_RELU, M=m, N=k),
    }
    return graph, link(graph, partition, kernels, "cpu", "1" * 64)


def cumsum_chain(length: int, shape: tuple[int, ...] = (4, 16)) -> tuple[Graph, Partition]:
    """``length`` CumSums in a row: host steps only, every intermediate the same size."""
    b = Builder("chain")
    y = b.input("x", TensorType(F32, shape))
    for _ in range(length):
        y = b.emit1(CumSum(axis=1), y)
    b.output("y", y)
    return b.graph, partition_graph(b.graph, CPU)


def random_feeds(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {v.name: rng.standard_normal(v.type.shape).astype(v.type.dtype.numpy) for v in graph.inputs}


def fake_cuda_kernel(tmp: Path, group: FusedGroup) -> KernelArtifact:
    """A CUDA kernel artifact for ``group`` whose "cubin" is a few bytes: for loading and
    for the runtime against a recording driver (tests/runtime/test_session_resources.py),
    never for a GPU. The launch data has the shape codegen/cuda gives it."""
    params = [ParamSpec(v.name, str(v.type.dtype), v.type.shape, "input") for v in group.inputs]
    params += [ParamSpec(v.name, str(v.type.dtype), v.type.shape, "output") for v in group.outputs]
    name = f"{group.name}_{hashlib.sha256(repr(params).encode()).hexdigest()[:10]}"
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / f"{name}.cubin"
    path.write_bytes(b"not a cubin: " + name.encode())
    launch = CudaLaunch(f"{name}_kernel", (2, 1, 1), (128, 1, 1), tuple(KernelArg(p.name, i) for i, p in enumerate(params)),
                        arch="sm_90a")
    return KernelArtifact(name, f"{name}_kernel", path, tuple(params), launch)


def cuda_mlp_plan(tmp: Path) -> tuple[Graph, Plan]:
    """``mlp_graph`` linked for cuda:sm_90a with fake kernels (see fake_cuda_kernel)."""
    graph = mlp_graph()
    partition = partition_graph(graph, CPU)
    kernels = {g.id: fake_cuda_kernel(tmp, g) for g in partition.groups}
    return graph, link(graph, partition, kernels, "cuda:sm_90a", "2" * 64)


def aborting_library(tmp: Path, symbol: str) -> Path:
    """A shared library whose ``symbol`` calls abort(): what must never run in place of a
    kernel (a swapped or corrupted file). Tests that could reach it run in a subprocess."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    tmp.mkdir(parents=True, exist_ok=True)
    src, lib = tmp / f"abort_{symbol}.c", tmp / f"abort_{symbol}.so"
    src.write_text(f"#include <stdlib.h>\nvoid {symbol}(void **args) {{ (void)args; abort(); }}\n")
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


def probe_graph(seed: int = 0) -> Graph:
    """y = max(x + bias, 0) on x [PROBE_M, PROBE_N]: one [add, max] group."""
    rng = np.random.default_rng(seed)
    b = Builder("probe")
    x = b.input("x", TensorType(F32, (PROBE_M, PROBE_N)))
    bias = b.const(rng.standard_normal(PROBE_N).astype(np.float32), name="bias")
    b.output("y", b.map(ScalarFn.MAX, b.map(ScalarFn.ADD, x, bias), b.const(np.float32(0))))
    return b.graph


def probe_plan(tmp: Path, pool: bool = True) -> tuple[Graph, Plan, Path]:
    """(graph, plan, kernel library) of the probe: its kernel reports the team size it ran
    with (``probe_team``); ``pool=False``: a kernel as built before tilefuse's pool, on libgomp."""
    from tilefuse.codegen.cpu.build import find_compiler, flags
    from tilefuse.codegen.cpu.prelude import PRELUDE
    from tilefuse.codegen.cpu.threads import THREAD_POOL

    graph = probe_graph()
    partition = partition_graph(graph, CPU)
    (group,) = partition.groups
    assert ops(group) == ["add", "max"], "the partitioner changed: adapt the kernel"
    head = THREAD_POOL + PRELUDE if pool else "#include <stdatomic.h>\n#include <stdint.h>\nint omp_get_num_threads(void);\n"
    source = head + PROBE
    name = f"probe_{hashlib.sha256(source.encode()).hexdigest()[:10]}"  # a generated name's form
    tmp.mkdir(parents=True, exist_ok=True)
    src, lib = tmp / f"{name}.c", tmp / f"{name}.so"
    src.write_text(source)
    defines = [f"-DSYMBOL={name}", f"-DM={PROBE_M}", f"-DN={PROBE_N}"]
    subprocess.run([*find_compiler().command, *flags("native"), *defines, "-o", str(lib), str(src)], check=True)
    params = [ParamSpec(v.name, str(v.type.dtype), v.type.shape, "input") for v in group.inputs]
    params += [ParamSpec(v.name, str(v.type.dtype), v.type.shape, "output") for v in group.outputs]
    kernel = KernelArtifact(name, name, lib, tuple(params), CpuLaunch(1), src)
    return graph, link(graph, partition, {group.id: kernel}, "cpu", "2" * 64), lib


def probe_team(lib: Path) -> int:
    """The team size the probe kernel last ran with (in this process). The runtime loads a
    kernel from a private copy of its verified bytes, named by their sha256
    (runtime/native.py): that copy, already loaded, is the one to read."""
    digest = hashlib.sha256(lib.read_bytes()).hexdigest()
    with open("/proc/self/maps") as maps:
        paths = {line.split(None, 5)[5].strip().removesuffix(" (deleted)") for line in maps if f"{digest}.so" in line}
    if not paths:
        return 0  # not loaded by a session (yet)
    loaded = ctypes.CDLL(paths.pop(), mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    return ctypes.c_int32.in_dll(loaded, "probe_team").value


def default_team() -> int:
    """The pool's default team size: OMP_NUM_THREADS's first level, else the cores this
    process may run on."""
    first = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(first) if first.isdigit() and int(first) > 0 else len(os.sched_getaffinity(0))
