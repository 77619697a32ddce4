"""Which schedule each kind of group gets, and the properties that make it that schedule."""
import math

import models
from tilefuse.frontend import import_onnx
from tilefuse.ir.prims import Kind
from tilefuse.partition import partition_graph
from tilefuse.target import CPU, adjust
from tilefuse.tile_ir import lower_group


def _lowered(name, zoo_cache, target=CPU):
    graph = import_onnx(models.build(name, "tiny", "float32", cache_dir=zoo_cache), models.ZOO[name].shapes("tiny"))
    return [(g, lower_group(g, target)) for g in partition_graph(graph, target).groups if str(g.kind) != "opaque"]


def test_attention_is_flash_style_without_a_score_matrix(zoo_cache):
    for name in ("bert", "gpt2", "llama", "vit"):
        for group, low in _lowered(name, zoo_cache):
            if sum(n.op.kind is Kind.CONTRACT for n in group.nodes) != 2 or not any(n.op.name == "exp" for n in group.nodes):
                continue
            assert low.program.notes[0].startswith("flash attention"), (name, group.name, low.program.notes)
            scores = next(n for n in group.nodes if n.op.kind is Kind.CONTRACT).outputs[0].type
            per_head = scores.shape[-2] * scores.shape[-1]
            # No per-tile buffer holds a whole score matrix of a head (unless one tile covers it).
            assert all(math.prod(b.shape) <= max(per_head, 64 * 64) for b in low.program.allocs)
            assert len(low.program.grid) == scores.rank - 1  # (batch, heads, query tiles)


def test_projection_and_norm_share_a_whole_row_tile(zoo_cache):
    for name in ("bert", "gpt2", "vit"):
        rows = [low for g, low in _lowered(name, zoo_cache)
                if any(n.op.name == "sqrt" for n in g.nodes) and any(n.op.kind is Kind.CONTRACT for n in g.nodes)]
        tiled = [low for low in rows if low.program.notes[0].startswith("gemm+epilogue")]
        # The pooler's token select reads the last norm's output as its own prologue, so
        # the last layer's kernel writes whole rows like the others.
        assert len(rows) == 4 and len(tiled) == 4, name
        for low in tiled:
            assert any(b.name.startswith("row") for b in low.program.allocs)


def test_mlp_chain_keeps_the_intermediate_on_chip(zoo_cache):
    """FFN-up, activation, FFN-down (+ residual, norm): the intermediate is computed a
    column chunk at a time into a tile and never written to a kernel parameter."""
    for name in ("bert", "gpt2", "vit"):
        # tiny models have few rows: a one-core CPU target lets their MLPs chain
        chains = [(g, low) for g, low in _lowered(name, zoo_cache, adjust(CPU, device__cores=1))
                  if sum(n.op.kind is Kind.CONTRACT and n.inputs[1].is_constant for n in g.nodes) == 2
                  and not any(n.op.name == "exp" for n in g.nodes)]
        assert len(chains) == 2, name  # one per layer
        tiled = [(g, low) for g, low in chains if low.program.notes[0].startswith("gemm+epilogue")]
        assert len(tiled) == 2, name
        for g, low in tiled:
            assert "chain" in low.program.notes[0], low.program.notes
            first = next(n for n in g.nodes if n.op.kind is Kind.CONTRACT)
            inner = first.outputs[0].type
            assert all(p.shape != inner.shape for p in low.program.params)
            h = next(b for b in low.program.allocs if b.name == "h_tile")
            assert math.prod(h.shape) <= inner.size and h.shape[-1] <= 256  # one K chunk of the intermediate


def test_norms_and_elementwise_chains_run_as_row_tiles(zoo_cache):
    """Embeddings + LayerNorm (BERT, ViT), RMSNorm (LLaMA), GPT-2's pre-norms (whose output
    is reshaped to [tokens, hidden] for the next product) and the mask computation: tiles
    of whole rows, each row reduced on its tile; no single tile holds the whole tensor."""
    from tilefuse.tile_ir.ir import ReduceTile

    for name in ("bert", "vit", "llama", "gpt2"):
        lows = [(g, low) for g, low in _lowered(name, zoo_cache) if not any(n.op.kind is Kind.CONTRACT for n in g.nodes)]
        norms = [low for g, low in lows if any(n.op.kind is Kind.REDUCE for n in g.nodes)]
        assert norms, name
        for low in norms:
            assert low.program.notes[0].startswith("rows:"), (name, low.program.notes)
            assert any(isinstance(st, ReduceTile) for st in low.program.body)
            assert all(math.prod(b.shape) <= 8192 for b in low.program.allocs)  # rows x E per tile


def test_convolutions_run_as_parallel_tiles(zoo_cache):
    # Channels as tile rows (cpu): weights read as stored; a few positions per image
    # (deep layers) keep positions as rows, with the weights packed as the [K, M] matrix's
    # panels (the host's panel core reads them; tile_ir/lower/panels.py).
    convs = [(g, low) for g, low in _lowered("resnet", zoo_cache) if any(n.op.name == "Conv" for n in g.nodes)]
    assert convs
    for g, low in convs:
        assert low.program.notes[0].startswith("gemm+epilogue")
        (conv,) = [n for n in g.nodes if n.op.name == "Conv"]
        rows = math.prod(conv.outputs[0].type.shape[2:]) >= CPU.conv.min_positions
        assert any(p.name.endswith("_panels32") for p in low.program.params) != rows
    kinds = {math.prod(n.outputs[0].type.shape[2:]) >= CPU.conv.min_positions for g, _ in convs for n in g.nodes if n.op.name == "Conv"}
    assert kinds == {True, False}  # resnet tiny has both


def test_convolutions_with_packed_weights_when_the_target_says_so(zoo_cache):
    target = adjust(CPU, conv__channel_rows=False)
    for g, low in _lowered("resnet", zoo_cache, target):
        if any(n.op.name == "Conv" for n in g.nodes):
            assert low.program.notes[0].startswith("gemm+epilogue")
            assert any(p.name.endswith("_panels32") for p in low.program.params)


def test_gpu_convolutions_take_tensor_core_tiles(zoo_cache):
    """On the GPU (fp16 tiles): 3x3 convolutions take K tiles of whole channels that are a
    multiple of the MMA's k16 (16 channels x 9 taps), and row tiles are a power of two
    (wgmma's warp layouts), with a partial last tile where the positions have no such
    divisor (16 rows or fewer stay one tile)."""
    from tilefuse.tile_ir.passes.placement import tensor_core as _tensor_core
    from tilefuse.target import CUDA_SM90A
    from tilefuse.tile_ir.ir import Gemm

    graph = import_onnx(models.build("resnet", "tiny", "float16", cache_dir=zoo_cache), models.ZOO["resnet"].shapes("tiny"))
    convs = [lower_group(g, CUDA_SM90A).program for g in partition_graph(graph, CUDA_SM90A).groups
             if any(n.op.name == "Conv" and n.inputs[0].type.shape[1] % 16 == 0
                    and math.prod(n.outputs[0].type.shape) // n.outputs[0].type.shape[1] > 16 for n in g.nodes)]
    assert convs
    for program in convs:
        (gemm,) = [st for st in _walk(program.body) if isinstance(st, Gemm)]
        assert _tensor_core(gemm, program.threads), program.notes
        assert gemm.c.shape[0] & (gemm.c.shape[0] - 1) == 0, program.notes


def _walk(stmts):
    from tilefuse.tile_ir.ir import Loop

    for s in stmts:
        yield s
        if isinstance(s, Loop):
            yield from _walk(s.body)


def test_depthwise_convolutions_are_tiled(zoo_cache):
    dw = [low for g, low in _lowered("mobilenetv2", zoo_cache)
          if any(n.op.name == "Conv" and n.op.groups > 1 for n in g.nodes)]
    assert dw
    assert all(low.program.notes[0].startswith("gemm+epilogue") and math.prod(low.program.grid) > 1 for low in dw)


def _matmul_graph(rows: int, k: int, n: int, siblings: int = 1):
    import numpy as np

    from tilefuse.ir import Builder, DType, TensorType

    rng = np.random.default_rng(0)
    b = Builder("mm")
    x = b.input("x", TensorType(DType.FLOAT16, (1, rows, k)))
    for i in range(siblings):
        b.output(f"y{i}", b.matmul(x, b.const(rng.standard_normal((k, n)).astype(np.float16))))
    return b.graph


def test_product_tiles_shrink_until_the_gpu_is_full():
    """Batch 1, 128 rows x 768: 128x128 tiles make 6 blocks for 132 SMs; tiles halve down to
    the target's 32x32 (96 blocks), which wait on memory: 3 stages of 128-deep K tiles. The
    CPU (2 cores) keeps its 128x64 tiles (columns split between the cores); big products take 64x128 tiles of one warpgroup
    and 3 stages of 64 (GemmPolicy.rows)."""
    from tilefuse.target import CUDA_SM90A

    graph = _matmul_graph(128, 768, 768)
    (group,) = partition_graph(graph, CUDA_SM90A).groups
    program = lower_group(group, CUDA_SM90A).program
    assert math.prod(program.grid) == 96 and "tiles 32x32x128" in program.notes[0] and "3-stage" in program.notes[0]
    (group,) = partition_graph(graph, CPU).groups
    assert "tiles 128x64" in lower_group(group, CPU).program.notes[0]
    big = partition_graph(_matmul_graph(4096, 768, 768), CUDA_SM90A).groups[0]
    program = lower_group(big, CUDA_SM90A).program
    assert "tiles 64x128x64" in program.notes[0] and program.threads == 128  # one warpgroup
    assert "3-stage" in program.notes[0]


def test_sibling_products_share_the_accumulator_budget():
    """Unpacked (a target without ``pack_siblings``), three sibling products (Q, K, V) keep
    3 accumulators within the accumulator registers of their block: 64x64 each on the GPU's
    64-row tiles (one warpgroup: 48 of the 96 KB a 256-thread block has)."""

    from tilefuse.target import CUDA_SM90A

    target = adjust(CUDA_SM90A, gemm__pack_siblings=False)
    group = partition_graph(_matmul_graph(4096, 768, 768, siblings=3), target).groups[0]
    program = lower_group(group, target).program
    accumulators = [b for b in program.allocs if b.name.startswith("c_tile")]
    assert len(accumulators) == 3
    # 64-row tiles run on one warpgroup: half the registers of the 256-thread budget
    assert sum(math.prod(b.shape) * 4 for b in accumulators) <= target.gemm.accumulator_bytes // 2
    assert [b.shape for b in accumulators] == [(64, 64)] * 3 and program.threads == 128


def test_sibling_products_run_as_one_product_of_packed_weights():
    """On the GPU, Q, K and V run as one product of their weights packed [E, 3E]: one
    128x128 accumulator, each column tile running its own sibling's epilogue under an If;
    the interpreter agrees with numpy (fresh random input, fp16 tolerance 1e-2) on every
    output, K's transposed one included. The CPU keeps siblings sharing the A tile."""
    import numpy as np

    from tilefuse.target import CUDA_SM90A
    from tilefuse.tile_ir.interpret import run_program
    from tilefuse.tile_ir.ir import If

    from tests.tile_ir.graphs import qkv_graph

    graph = qkv_graph(2, 128, 4, 16)  # 16-wide heads: a column tile spans several
    (group,) = partition_graph(graph, CUDA_SM90A).groups
    low = lower_group(group, CUDA_SM90A)
    program = low.program
    assert "packed [64, 192]" in program.notes[0]
    assert len([b for b in program.allocs if b.name.startswith("c_tile")]) == 1
    assert sum(isinstance(s, If) for s in program.body) == 3
    assert sum(v.is_constant and v.type.shape == (64, 192) for v in low.bindings) == 1  # the weights, side by side
    x = np.random.default_rng().standard_normal((2, 128, 64)).astype(np.float16)
    args = [x if k == 0 else np.ascontiguousarray(v.data) if v.is_constant else np.zeros(v.type.shape, np.float16)
            for k, v in enumerate(low.bindings)]
    run_program(program, args)
    products = [n for n in graph.nodes if n.op.name == "MatMul"]
    biases = [next(n for n in graph.nodes if p.outputs[0] in n.inputs).inputs[1].data for p in products]
    got = {id(v): a for v, a in zip(low.bindings[-3:], args[-3:])}
    for name, perm, p, bias in zip("qkv", ((0, 2, 1, 3), (0, 2, 3, 1), (0, 2, 1, 3)), products, biases):
        y = (x.astype(np.float32) @ p.inputs[1].data.astype(np.float32)).astype(np.float16) + bias
        want = y.reshape(2, 128, 4, 16).transpose(perm)
        out = got[id(graph.outputs[name])]
        np.testing.assert_allclose(out.astype(np.float32), want.astype(np.float32), rtol=1e-2, atol=1e-2)
    (cpu_group,) = partition_graph(graph, CPU).groups
    assert "sharing the A tile" in lower_group(cpu_group, CPU).program.notes[0]


def test_a_column_count_without_divisors_gets_a_partial_last_tile():
    """An LM head of 50257 words (29 x 1733) on the GPU: 128-wide column tiles, the last one
    partial, instead of 29-wide tiles; the interpreter agrees with numpy on it."""
    low = _gpu_product_interpreted(32, 64, 29 * 11)  # 319 columns: divisors 1, 11, 29, 319
    assert "last column tile" in low.program.notes[0] and low.program.grid[-1] == -(-319 // 128)
    # 319 fp16 are not whole 16-byte vectors: the weight is bound padded to whole tiles
    assert low.bindings[1].type.shape == (64, 3 * 128) and not low.bindings[1].data[:, 319:].any()


def test_a_row_count_without_a_tensor_core_divisor_gets_a_partial_last_tile():
    """196 rows (ResNet-50's 14x14 positions at batch 1: divisors 49, 98) on the GPU: row
    tiles of a power of two (wgmma's warp layouts), the last one partial and its
    rows clamped, instead of 49-row tiles on 4 threads; the interpreter agrees with numpy."""
    low = _gpu_product_interpreted(196, 64, 256)
    assert "last row tile" in low.program.notes[0]
    rows = int(low.program.notes[0].split("tiles ")[1].split("x")[0])
    assert rows & (rows - 1) == 0 and low.program.grid[-2] == -(-196 // rows)


def _gpu_product_interpreted(rows: int, k: int, n: int):
    """An fp16 [1, rows, k] x [k, n] product lowered for the GPU; the tile interpreter runs
    it on fresh random inputs and must agree with numpy (fp16 tolerance). The lowering."""
    import numpy as np

    from tilefuse.target import CUDA_SM90A
    from tilefuse.tile_ir.interpret import run_program

    graph = _matmul_graph(rows, k, n)
    (group,) = partition_graph(graph, CUDA_SM90A).groups
    low = lower_group(group, CUDA_SM90A)
    x = np.random.default_rng().standard_normal((1, rows, k)).astype(np.float16)
    w = next(node for node in graph.nodes if node.op.name == "MatMul").inputs[1].data
    out = np.zeros((1, rows, n), np.float16)
    run_program(low.program, [x, np.ascontiguousarray(low.bindings[1].data), out])  # the weight as bound
    want = (x.astype(np.float32) @ w.astype(np.float32)).astype(np.float16)
    np.testing.assert_allclose(out.astype(np.float32), want.astype(np.float32), rtol=1e-2, atol=1e-2)
    return low


def test_a_group_too_large_for_the_gpu_says_so_clearly():
    """The staged schedule keeps every staged value on chip: where they do not fit a GPU
    block, the error names the kernel, the schedule, both sizes and the target. (No group
    of a real model is left to it at such sizes any more: scatters and grouped transposed
    convolutions have schedules of their own. The group here is a ScatterND into a 2 MB
    tensor made to take the staged schedule.)"""
    import dataclasses

    import pytest
    from onnx import TensorProto, helper

    from tilefuse.errors import GraphError
    from tilefuse.frontend import import_onnx
    from tilefuse.patterns import StagedMatch
    from tilefuse.target import CUDA_SM90A

    def tensor(name, dtype, shape):
        return helper.make_tensor_value_info(name, dtype, shape)

    node = helper.make_node("ScatterND", ["data", "indices", "updates"], ["y"])
    graph = helper.make_graph([node], "scatter", [tensor("data", TensorProto.FLOAT, [2048, 256]),
                                                   tensor("indices", TensorProto.INT64, [16, 1]),
                                                   tensor("updates", TensorProto.FLOAT, [16, 256])],
                              [tensor("y", TensorProto.FLOAT, [2048, 256])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (group,) = partition_graph(import_onnx(model), CUDA_SM90A).groups
    group = dataclasses.replace(group, match=StagedMatch("made to take the staged schedule"))
    with pytest.raises(GraphError, match=r"kernel \S+: the staged schedule needs \d+ KB of on-chip tile buffers, "
                                         r"more than the 227 KB a cuda:sm_90a block has"):
        lower_group(group, CUDA_SM90A)


def test_attention_reads_keys_along_their_contiguous_axis(zoo_cache):
    """The key tile (head dim x keys) is filled with the head dim innermost where K is
    stored [keys, d] (GPT-2: a slice of the packed QKV product; LLaMA: RoPE applied in
    the fill), and with keys innermost where K^T arrives transposed (BERT's QKV epilogue
    writes it so): neighbouring threads read neighbouring elements either way."""
    from tilefuse.target import CUDA_SM90A
    from tilefuse.tile_ir.ir import Copy, Loop, Store

    def k_fill(name):
        graph = import_onnx(models.build(name, "tiny", "float16", cache_dir=zoo_cache), models.ZOO[name].shapes("tiny"))
        for g in partition_graph(graph, CUDA_SM90A).groups:
            program = lower_group(g, CUDA_SM90A).program
            if program.notes[0].startswith("flash attention"):
                for outer in _walk(program.body):
                    if isinstance(outer, Copy) and outer.dst.buffer.name == "k_tile":
                        return outer, None, None  # a plain tile load, raised to a bulk copy
                    if isinstance(outer, Loop) and isinstance(outer.body[0], Loop):
                        inner = outer.body[0]
                        st = inner.body[0]
                        if isinstance(st, Store) and st.buffer.name == "k_tile":
                            return outer, inner, st
        raise AssertionError(f"{name}: no key tile fill")

    for name in ("gpt2", "llama"):
        outer, inner, st = k_fill(name)
        assert st.indices == (inner.var, outer.var), name  # k_tile[d, key]: d innermost
    copy, _, _ = k_fill("bert")  # K^T [d, keys] loaded as it is: keys innermost, one bulk copy
    assert copy.bulk and copy.src.extents[-2:] == copy.dst.buffer.shape
