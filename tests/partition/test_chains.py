"""Weight chains (an MLP: up-projection, activation, down-projection) are one kernel
when a tile can hold whole input and output rows on chip, and two otherwise."""
import numpy as np

from tilefuse.ir import Builder, DType, TensorType
from tilefuse.ir.prims import ReduceFn, ScalarFn
from tilefuse.partition import partition_graph
from tilefuse.target import CPU, CUDA_SM90A, adjust

H = DType.FLOAT16


def _mlp(k1: int, n1: int, n2: int, *, leak: bool = False, rows: int = 128, dtype: DType = DType.FLOAT32):
    rng = np.random.default_rng(0)
    b = Builder("mlp")
    np_t = dtype.numpy.type
    x = b.input("x", TensorType(dtype, (rows // 16, 16, k1)))
    h = b.matmul(x, b.const(rng.standard_normal((k1, n1)).astype(np_t)))
    h = b.map(ScalarFn.MAX, h, b.const(np_t(0)))
    y = b.matmul(h, b.const(rng.standard_normal((n1, n2)).astype(np_t)))
    s = b.reduce(ReduceFn.SUM, y, [2], keepdims=True)
    b.output("y", b.map(ScalarFn.DIV, y, s))
    if leak:
        b.output("h", h)
    return b.graph


def test_chain_is_one_kernel_with_its_row_epilogue():
    p = partition_graph(_mlp(64, 256, 64), CPU)  # 128 rows: 2 tiles of 64 for 2 cores
    assert len(p.groups) == 1
    assert [n.op.name for n in p.groups[0].nodes].count("MatMul") == 2


def test_chain_respects_on_chip_capacity_per_target():
    graph = _mlp(4096, 256, 1024)
    # cpu: 64 rows x (2048 in + 1024 out) fp32 = 768 KB of 1 MB, 2 row tiles for 2 cores
    assert len(partition_graph(_mlp(2048, 256, 1024), CPU).groups) == 1
    p = partition_graph(graph, CPU)  # 64 rows x 5120 fp32 = 1280 KB > 1 MB
    assert len(p.groups) == 2
    assert any("chain of products needs 1280 KB on chip" in r.reason for r in p.refusals), [r.reason for r in p.refusals]
    p = partition_graph(_mlp(4096, 256, 1024, rows=4096, dtype=H), CUDA_SM90A)  # 16 rows x 5120 fp32 = 320 KB > 227 KB
    assert all(sum(n.op.name == "MatMul" for n in g.nodes) < 2 for g in p.groups)
    assert any("chain of products needs 320 KB on chip" in r.reason for r in p.refusals), [r.reason for r in p.refusals]


def test_intermediate_read_elsewhere_is_not_chained():
    p = partition_graph(_mlp(64, 256, 64, leak=True), CPU)
    assert len(p.groups) == 2
    assert any("read outside the chain" in r.reason for r in p.refusals), [r.reason for r in p.refusals]


def test_chain_needs_a_row_tile_per_core():
    """Chained, only rows make tiles: 128 rows are 8 tiles of 16 for 132 SMs, so the GPU
    keeps the products apart; 4096 rows (256 tiles) chain."""
    p = partition_graph(_mlp(64, 256, 64, dtype=H), CUDA_SM90A)
    assert len(p.groups) == 2
    assert any("8 whole-row tiles, fewer than the target's 132 cores" in r.reason for r in p.refusals)
    assert len(partition_graph(_mlp(64, 256, 64, rows=4096, dtype=H), CUDA_SM90A).groups) == 1


def test_exact_float32_chains_stay_apart_on_the_gpu():
    """Exact float32 products are FMA loops on the GPU, a chain's accumulator whole rows in
    shared memory: ViT's MLP chain at batch 32 took 34.7 ms a layer and raced on the H200.
    Apart, each product tiles its columns. TF32 products and the CPU still chain."""
    p = partition_graph(_mlp(64, 256, 64, rows=4096), CUDA_SM90A)
    assert len(p.groups) == 2
    assert any("chain of exact float32 products" in r.reason for r in p.refusals), [r.reason for r in p.refusals]
    assert len(partition_graph(_mlp(64, 256, 64, rows=4096), adjust(CUDA_SM90A, tf32_products=True)).groups) == 1
    assert len(partition_graph(_mlp(64, 256, 64, rows=4096), CPU).groups) == 1


def test_whole_row_epilogue_that_would_idle_the_gpu_stays_apart():
    """128 rows on the GPU: the norm on the product's tile makes 8 whole-row tiles for 132
    SMs where the product apart makes 4 x 32 tiles of 32 x 32; batch 1 keeps them apart,
    4096 rows (256 whole-row tiles) fuse."""
    from tilefuse.ir.prims import Kind

    def kernel_of_norm(p):
        return next(g for g in p.groups if any(n.op.kind is Kind.REDUCE for n in g.nodes))

    small = partition_graph(_mlp(4096, 256, 1024, rows=128), CUDA_SM90A)
    assert not any(n.op.name == "MatMul" for n in kernel_of_norm(small).nodes)
    big = partition_graph(_mlp(4096, 256, 1024, rows=4096), CUDA_SM90A)
    assert any(n.op.name == "MatMul" for n in kernel_of_norm(big).nodes)


def _depth(nodes) -> int:
    members = {id(n) for n in nodes}
    depth: dict[int, int] = {}
    for n in nodes:  # in graph order
        depth[id(n)] = 1 + max((depth.get(id(v.producer), 0) for v in n.inputs
                                if v.producer is not None and id(v.producer) in members), default=0)
    return max(depth.values())


def test_deep_elementwise_chain_is_cut_at_the_depth_cap():
    """300 elementwise ops in a row: one group would be a 300-deep element expression,
    past what the lowering's recursion takes; groups stop at the target's depth cap."""
    b = Builder("deep")
    v = b.input("x", TensorType(DType.FLOAT32, (4, 8)))
    for _ in range(300):
        v = b.map(ScalarFn.NEG, v)
    b.output("y", v)
    p = partition_graph(b.graph, CPU)
    order = {id(n): i for i, n in enumerate(b.graph.nodes)}
    assert all(_depth(sorted(g.nodes, key=lambda n: order[id(n)])) <= CPU.partition.max_group_depth for g in p.groups)
    assert len(p.groups) == -(-300 // CPU.partition.max_group_depth)
    assert any("depth cap" in r.reason for r in p.refusals), [r.reason for r in p.refusals]
