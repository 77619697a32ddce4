"""Which schedule each kind of group gets, and the properties that make it that schedule."""
import math
from dataclasses import replace

import models
from tilefuse.frontend import import_onnx
from tilefuse.ir.prims import Kind
from tilefuse.partition import partition_graph
from tilefuse.target import CPU
from tilefuse.tile_ir import lower_group
from tilefuse.tile_ir.lower.conv_rows import MIN_POSITIONS


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
        chains = [(g, low) for g, low in _lowered(name, zoo_cache, replace(CPU, cores=1))
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
    """Embeddings + LayerNorm (BERT, ViT), RMSNorm (LLaMA) and the mask computation: tiles
    of whole rows, each row reduced on its tile; no single tile holds the whole tensor."""
    from tilefuse.tile_ir.ir import ReduceTile

    for name in ("bert", "vit", "llama"):
        lows = [(g, low) for g, low in _lowered(name, zoo_cache) if not any(n.op.kind is Kind.CONTRACT for n in g.nodes)]
        norms = [low for g, low in lows if any(n.op.kind is Kind.REDUCE for n in g.nodes)]
        assert norms, name
        for low in norms:
            assert low.program.notes[0].startswith("rows:"), (name, low.program.notes)
            assert any(isinstance(st, ReduceTile) for st in low.program.body)
            assert all(math.prod(b.shape) <= 8192 for b in low.program.allocs)  # rows x E per tile


def test_convolutions_run_as_parallel_tiles(zoo_cache):
    # Channels as tile rows (cpu): weights read as stored; a few positions per image
    # (deep layers) keep positions as rows, with the weights packed [K, M].
    convs = [(g, low) for g, low in _lowered("resnet", zoo_cache) if any(n.op.name == "Conv" for n in g.nodes)]
    assert convs
    for g, low in convs:
        assert low.program.notes[0].startswith("gemm+epilogue")
        (conv,) = [n for n in g.nodes if n.op.name == "Conv"]
        rows = math.prod(conv.outputs[0].type.shape[2:]) >= MIN_POSITIONS
        assert any(p.name.endswith("_kxm") for p in low.program.params) != rows
    kinds = {math.prod(n.outputs[0].type.shape[2:]) >= MIN_POSITIONS for g, _ in convs for n in g.nodes if n.op.name == "Conv"}
    assert kinds == {True, False}  # resnet tiny has both


def test_convolutions_with_packed_weights_when_the_target_says_so(zoo_cache):
    target = replace(CPU, conv_channel_rows=False)
    for g, low in _lowered("resnet", zoo_cache, target):
        if any(n.op.name == "Conv" for n in g.nodes):
            assert low.program.notes[0].startswith("gemm+epilogue")
            assert any(p.name.endswith("_kxm") for p in low.program.params)


def test_depthwise_convolutions_are_tiled(zoo_cache):
    dw = [low for g, low in _lowered("mobilenetv2", zoo_cache)
          if any(n.op.name == "Conv" and n.op.groups > 1 for n in g.nodes)]
    assert dw
    assert all(low.program.notes[0].startswith("gemm+epilogue") and math.prod(low.program.grid) > 1 for low in dw)
