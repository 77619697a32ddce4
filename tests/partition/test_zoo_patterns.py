"""The partitioner finds the fusion patterns on the zoo models, without op names.

Each kernel is recognised by the primitives it holds. Dynamo (opset 20) and
TorchScript-style (opset 14, spelled-out norms) exports must partition alike.
"""
from collections import Counter

import pytest

import models
from tilefuse.frontend import import_onnx
from tilefuse.ir.prims import Kind
from tilefuse.partition import partition_graph
from tilefuse.target import CPU, CUDA_SM90A, adjust

LAYERS = 2  # every tiny transformer in the zoo has two layers
# tiny models' few rows still make "enough" row tiles; TF32 products, which may chain (exact
# float32 ones stay apart on the GPU: test_chains.py)
ONE_CORE = adjust(CUDA_SM90A, device__cores=1, tf32_products=True)


def _partition(name, zoo_cache, target=CUDA_SM90A):
    path = models.build(name, "tiny", "float32", cache_dir=zoo_cache)
    graph = import_onnx(path, models.ZOO[name].shapes("tiny"))
    return partition_graph(graph, target)  # the verifier runs inside


def _ops(group) -> Counter:
    return Counter(n.op.name for n in group.nodes)


def _matmuls(group) -> list:
    return [n for n in group.nodes if n.op.kind is Kind.CONTRACT]


def is_attention(g) -> bool:
    """Two products of activations with a row softmax between them."""
    mm = _matmuls(g)
    ops = _ops(g)
    return (
        len(mm) == 2
        and not any(n.inputs[1].is_constant for n in mm)
        and ops["reduce_max"] >= 1 and ops["exp"] >= 1 and ops["reduce_sum"] >= 1
    )


def is_projection_with_norm(g) -> bool:
    """One weight product with bias, residual add and a whole-row norm in its epilogue."""
    mm = _matmuls(g)
    return len(mm) == 1 and mm[0].inputs[1].is_constant and _ops(g)["reduce_sum"] >= 1 and _ops(g)["sqrt"] >= 1


def is_projection_with_activation(g) -> bool:
    ops = _ops(g)
    return len(_matmuls(g)) == 1 and (ops["erf"] or ops["tanh"] or ops["sigmoid"]) and not ops["reduce_sum"]


def is_mlp_chain(g) -> bool:
    """Up-projection, activation, down-projection in one kernel (the intermediate on chip)."""
    mm = _matmuls(g)
    ops = _ops(g)
    return (
        len(mm) == 2
        and all(m.inputs[1].is_constant for m in mm)
        and mm[0].inputs[0] is not mm[1].inputs[0]
        and bool(ops["erf"] or ops["tanh"] or ops["sigmoid"])
    )


def has_norm(g) -> bool:
    return _ops(g)["reduce_sum"] >= 1 and _ops(g)["sqrt"] >= 1


def is_fused_qkv(g) -> bool:
    mm = _matmuls(g)
    return len(mm) == 3 and all(m.inputs[0] is mm[0].inputs[0] and m.inputs[1].is_constant for m in mm)


def test_nothing_is_an_index_only_kernel(zoo_cache):
    for name in ("bert", "bert-legacy", "gpt2", "gpt2-legacy", "llama", "llama-legacy", "vit", "vit-legacy"):
        p = _partition(name, zoo_cache)
        for g in p.groups:
            assert any(n.op.kind is not Kind.INDEX for n in g.nodes), f"{name}: {g.name} only moves data"


def _bert_kernels(p) -> Counter:
    kinds = Counter()
    for g in p.groups:
        for label, check in (("qkv", is_fused_qkv), ("attention", is_attention),
                             ("proj+norm", is_projection_with_norm),
                             ("ffn-up+gelu", lambda g: is_projection_with_activation(g) and _ops(g)["erf"]),
                             ("mlp+norm", lambda g: is_mlp_chain(g) and _ops(g)["erf"] and has_norm(g))):
            if check(g):
                kinds[label] += 1
    return kinds


@pytest.mark.parametrize("name", ["bert", "bert-legacy"])
def test_bert_layer_is_four_kernels_when_the_mlp_fits_on_chip(name, zoo_cache):
    # Tiny BERT has 32 rows: 2 whole-row tiles, which a chain may take only on a target
    # with no more cores than that (test_chains.py has the parallelism rule itself).
    p = _partition(name, zoo_cache, ONE_CORE)
    assert _bert_kernels(p) == {"qkv": LAYERS, "attention": LAYERS, "proj+norm": LAYERS, "mlp+norm": LAYERS}
    # Embeddings (gather + adds + LayerNorm), the attention mask (computed once, read by
    # every layer) and the pooler are the only other kernels.
    assert len(p.groups) == 4 * LAYERS + 3
    mask = [g for g in p.groups if not _matmuls(g) and not _ops(g)["reduce_sum"]]
    assert len(mask) == 1


@pytest.mark.parametrize("name", ["bert", "bert-legacy"])
def test_bert_layer_is_five_kernels_when_only_rows_of_the_output_fit(name, zoo_cache):
    """Tiny BERT: hidden 64, FFN 128. 16 rows of 64 fp32 (4 KB) fit the norm epilogue;
    the chain also needs the rows it reads (4 KB more) and does not fit 6 KB."""

    p = _partition(name, zoo_cache, adjust(CUDA_SM90A, device__onchip_bytes=6 * 1024, tf32_products=True))
    assert _bert_kernels(p) == {"qkv": LAYERS, "attention": LAYERS, "proj+norm": 2 * LAYERS, "ffn-up+gelu": LAYERS}
    assert len(p.groups) == 5 * LAYERS + 3
    assert any("chain of products needs" in r.reason for r in p.refusals)


@pytest.mark.parametrize("name", ["gpt2", "gpt2-legacy"])
def test_gpt2_tanh_gelu_epilogue_and_attention(name, zoo_cache):
    p = _partition(name, zoo_cache, ONE_CORE)
    assert sum(map(is_attention, p.groups)) == LAYERS
    assert sum(1 for g in p.groups if is_mlp_chain(g) and _ops(g)["tanh"]) == LAYERS
    assert len(p.groups) <= 6 * LAYERS + 2


@pytest.mark.parametrize("name", ["llama", "llama-legacy"])
def test_llama_rmsnorm_swiglu_attention(name, zoo_cache):
    p = _partition(name, zoo_cache)
    assert sum(map(is_attention, p.groups)) == LAYERS
    # SwiGLU: gate and up projections as one wide GEMM with SiLU and the product in its
    # epilogue; RMSNorm (no mean subtraction) as a row epilogue.
    swiglu = [g for g in p.groups if len(_matmuls(g)) == 2 and all(m.inputs[1].is_constant for m in _matmuls(g))
              and _ops(g)["sigmoid"] and _ops(g)["mul"] >= 2]
    assert len(swiglu) == LAYERS
    rms = [g for g in p.groups if _ops(g)["reduce_sum"] and _ops(g)["sqrt"] and not _ops(g)["sub"]]
    assert len(rms) >= 2 * LAYERS
    assert len(p.groups) <= 6 * LAYERS + 2


@pytest.mark.parametrize("name", ["vit", "vit-legacy"])
def test_vit_attention_and_norm_epilogues(name, zoo_cache):
    p = _partition(name, zoo_cache)
    assert sum(map(is_attention, p.groups)) == LAYERS
    norms = [g for g in p.groups if is_projection_with_norm(g) or (is_mlp_chain(g) and has_norm(g))]
    assert len(norms) >= 2 * LAYERS - 1
    assert len(p.groups) <= 6 * LAYERS + 3


@pytest.mark.parametrize("name", ["resnet", "mobilenetv2"])
def test_conv_batchnorm_activation_residual(name, zoo_cache):
    p = _partition(name, zoo_cache)
    convs = [g for g in p.groups if any(n.op.name == "Conv" for n in g.nodes)]
    for g in convs:
        assert sum(n.op.name == "Conv" for n in g.nodes) == 1
        ops = _ops(g)
        assert ops["mul"] >= 1 and ops["add"] >= 1, f"{g.name}: BatchNorm not in the conv's epilogue"
    graph_convs = sum(n.op.name == "Conv" for n in p.graph.nodes)
    assert len(convs) == graph_convs  # every conv anchors a kernel of its own
    # Every standalone Map (ReLU, BN, residual add) was absorbed by some conv.
    assert not [g for g in p.groups if g.kind.name == "ELEMENTWISE"]
    if name == "resnet":
        residual = [g for g in convs if _ops(g)["add"] >= 2 and _ops(g)["max"]]
        assert residual, "conv + BN + residual add + ReLU in one kernel"


def test_row_norm_epilogue_respects_on_chip_capacity(zoo_cache):
    """On the CPU target a tile of whole rows fits; shrink the on-chip budget and the
    norm must leave the projection's kernel, with the capacity as its reason."""

    tight = adjust(CPU, device__onchip_bytes=1024)
    p = _partition("bert", zoo_cache, tight)
    assert not any(is_projection_with_norm(g) for g in p.groups)
    assert any("KB on chip" in r.reason for r in p.refusals)


def test_partition_is_deterministic(zoo_cache):
    a = _partition("gpt2", zoo_cache)
    b = _partition("gpt2", zoo_cache)
    assert [[n.name for n in g.nodes] for g in a.groups] == [[n.name for n in g.nodes] for g in b.groups]


def test_every_refusal_has_a_reason(zoo_cache):
    p = _partition("bert", zoo_cache)
    assert p.refusals and all(r.reason for r in p.refusals)
    assert all(0 <= r.group_a < len(p.groups) and 0 <= r.group_b < len(p.groups) for r in p.refusals)
