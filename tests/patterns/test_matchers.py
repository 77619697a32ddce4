"""The pattern matchers on small graphs and tiny zoo models: what each match names, and
the reasons a pattern refuses (a staged kernel's match carries them)."""
import numpy as np
import pytest

import models
from tilefuse import patterns
from tilefuse.frontend import import_onnx
from tilefuse.ir import Builder, DType, TensorType
from tilefuse.ir.prims import ScalarFn
from tilefuse.partition import partition_graph
from tilefuse.target import CPU, CUDA_SM90A


def _groups(name, zoo_cache, target):
    graph = import_onnx(models.build(name, "tiny", "float32", cache_dir=zoo_cache), models.ZOO[name].shapes("tiny"))
    return partition_graph(graph, target).groups


def _matmul_graph(rows: int, k: int, n: int):
    b = Builder("mm")
    x = b.input("x", TensorType(DType.FLOAT32, (1, rows, k)))
    b.output("y", b.matmul(x, b.const(np.random.default_rng(0).standard_normal((k, n)).astype(np.float32))))
    return b.graph


@pytest.mark.parametrize("target", [CPU, CUDA_SM90A], ids=lambda t: t.name)
def test_attention_names_its_products_and_softmax(target, zoo_cache):
    matches = [g.match for g in _groups("bert", zoo_cache, target) if isinstance(g.match, patterns.AttentionMatch)]
    assert len(matches) == 2  # one a layer
    for m in matches:
        assert m.softmax.probs is m.c2.inputs[0]
        assert m.softmax.scores.type.shape == m.c1.outputs[0].type.shape
        assert not m.epilogue.reductions


def test_siblings_and_chains_are_one_gemm_match(zoo_cache):
    """BERT's Q, K and V share one tiled product on the GPU; each match's products are the
    group's, a chain's first product its prologue."""
    gemms = [g for g in _groups("bert", zoo_cache, CUDA_SM90A) if isinstance(g.match, patterns.GemmMatch)]
    assert any(g.match.siblings and len(g.match.contractions) == 3 for g in gemms)
    for g in gemms:
        assert all(c in g.nodes for c in g.match.contractions)
        assert g.match.first is None or g.match.first in g.nodes


def test_norms_are_rows_and_pools_are_windows(zoo_cache):
    rows = [g.match for g in _groups("bert", zoo_cache, CPU) if isinstance(g.match, patterns.RowsMatch)]
    assert any(m.reductions for m in rows)  # the embeddings' LayerNorm; the mask is rows of no reduction
    assert all(r.inputs[0].type.shape == m.shape for m in rows for r in m.reductions)
    pools = [g.match for g in _groups("resnet", zoo_cache, CPU) if isinstance(g.match, patterns.WindowsMatch)]
    assert pools and all(m.reduction.op.kind.name == "REDUCE" for m in pools)


def test_a_staged_match_says_why_each_pattern_refused():
    """A product whose activation is concatenated with another input (a U-Net skip) is one
    staged kernel on the CPU, where that schedule's nests run on every core, and its match
    names every pattern's refusal; on the GPU, where it would run on one thread, the
    partitioner keeps the product and the concat apart (tests/partition/test_staged_merges.py)."""
    b = Builder("skip")
    x = b.input("x", TensorType(DType.FLOAT32, (256, 32)))
    h = b.map(ScalarFn.MAX, b.matmul(x, b.const(np.ones((32, 48), np.float32))), b.const(np.float32(0)))
    b.output("y", b.concat([h, b.input("skip", TensorType(DType.FLOAT32, (256, 16)))], axis=1))
    (g,) = partition_graph(b.graph, CPU).groups
    assert isinstance(g.match, patterns.StagedMatch)
    assert g.match.reason.startswith("attention: not two matrix products; gemm: Concat after the anchor")
    assert all(f"{name}: " in g.match.reason for name in ("attention", "gemm", "rows", "windows"))
    assert not any(isinstance(g.match, patterns.StagedMatch) for g in partition_graph(b.graph, CUDA_SM90A).groups)


def test_thin_rows_take_a_partial_last_tile_but_a_host_convolutions_are_staged():
    """197 rows (a prime: ViT's tokens) have no divisor tile; a matrix product takes them
    with a partial last row tile on the CPU (near-equal tiles) and on the GPU (powers of
    two). A convolution's 197 positions on the CPU, whose position tiles divide them, are
    still the staged schedule's."""
    graph = _matmul_graph(197, 64, 64)
    for target in (CPU, CUDA_SM90A):
        (g,) = partition_graph(graph, target).groups
        assert isinstance(g.match, patterns.GemmMatch), (target.name, g.match)
    from tilefuse.ir.prims import Conv

    (conv,) = partition_graph(_conv_graph(Conv((1,), (1,), (0, 0)), (1, 4, 197), (8, 4, 1)), CPU).groups
    assert isinstance(conv.match, patterns.StagedMatch) and "197 rows have no divisor tile" in conv.match.reason


def test_opaque_groups_and_empty_tensors():
    """An opaque group is no kernel (a Refusal); a group with an empty tensor is staged."""
    b = Builder("empty")
    x = b.input("x", TensorType(DType.FLOAT32, (0, 4)))
    b.output("y", b.matmul(x, b.const(np.ones((4, 4), np.float32))))
    (g,) = partition_graph(b.graph, CPU).groups
    assert g.match == patterns.StagedMatch("empty tensors: nothing to tile")
    assert patterns.match_group(g.nodes, g.outputs, CPU, after=patterns.GemmMatch) == g.match


def _conv_graph(op, x_shape, w_shape):
    b = Builder("conv")
    x = b.input("x", TensorType(DType.FLOAT32, x_shape))
    b.output("y", b.emit1(op, x, b.const(np.random.default_rng(0).standard_normal(w_shape).astype(np.float32))))
    return b.graph


@pytest.mark.parametrize("target", [CPU, CUDA_SM90A], ids=lambda t: t.name)
def test_grouped_convolutions_transposed_or_not_are_tiled_products(target):
    """A grouped convolution (ResNeXt's 32 groups of 4 channels) is one tiled product, its
    column tiles inside a group; so is a grouped transposed convolution."""
    from tilefuse.ir.prims import Conv, ConvTranspose

    (g,) = partition_graph(_conv_graph(Conv((1, 1), (1, 1), (1, 1, 1, 1), 32), (1, 128, 14, 14), (128, 4, 3, 3)), target).groups
    assert isinstance(g.match, patterns.GemmMatch), g.match
    op = ConvTranspose((2, 2), (1, 1), (0, 0, 0, 0), (0, 0), 2)
    (t,) = partition_graph(_conv_graph(op, (1, 4, 5, 5), (4, 3, 2, 2)), target).groups
    assert isinstance(t.match, patterns.GemmMatch), t.match
