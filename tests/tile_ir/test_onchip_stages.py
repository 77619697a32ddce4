"""A pipelined loop keeps one copy of each tile it fills per stage: a convolution whose K
tiles hold whole channels of many taps (ViT's 16 x 16 patches: 256 taps) narrows its tiles
until its stages fit the block. (The verifier does not count stages yet: TileLang reuses an
operand tile's shared memory for the epilogue's mirror after the K loop, which a sum of
buffers times stages does not see, and refused bert-base's producer-loaded products.) At batch 32 in float32 its 64 x
256 and 256 x 128 operand tiles, double-buffered, took 416 KB; TileLang refused the kernel
after the verifier had passed it."""
import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tilefuse.frontend import import_onnx
from tilefuse.partition import partition_graph
from tilefuse.target import CUDA_SM90A
from tilefuse.tile_ir.ir import Loop, LoopKind, statements
from tilefuse.tile_ir.lower import lower_group


def patch_conv(batch: int, cout: int = 768, dtype=TensorProto.FLOAT) -> bytes:
    w = numpy_helper.from_array((np.random.default_rng(0).standard_normal((cout, 3, 16, 16)) * 0.02).astype(np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[16, 16], strides=[16, 16])
    graph = helper.make_graph([node], "patches", [helper.make_tensor_value_info("x", dtype, [batch, 3, 224, 224])],
                              [helper.make_tensor_value_info("y", dtype, [batch, cout, 14, 14])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _onchip(p) -> int:
    stages = {}
    for s in statements(p.body):
        if isinstance(s, Loop) and s.kind is LoopKind.PIPELINED and s.stages > 1:
            for x in statements(s.body):
                b = getattr(x, "buffer", None) or getattr(getattr(x, "dst", None), "buffer", None)
                if b is not None and str(b.scope) == "Scope.SHARED":
                    stages[b.name] = s.stages
    return sum(math.prod(b.shape) * b.dtype.itemsize * stages.get(b.name, 1) for b in p.allocs)


@pytest.mark.parametrize("batch", [1, 32])
def test_float32_patch_convolutions_fit_the_block_with_their_stages(batch):
    (g,) = [g for g in partition_graph(import_onnx(patch_conv(batch)), CUDA_SM90A).groups if str(g.kind) != "opaque"]
    p = lower_group(g, CUDA_SM90A).program  # verified
    assert _onchip(p) <= CUDA_SM90A.device.onchip_bytes, (p.notes, _onchip(p))
    assert p.schedule.tile_k == 256, p.schedule  # whole channels of 256 taps a K step


def test_the_patch_convolution_at_batch_32_keeps_two_stages_of_narrower_tiles():
    (g,) = [g for g in partition_graph(import_onnx(patch_conv(32)), CUDA_SM90A).groups if str(g.kind) != "opaque"]
    p = lower_group(g, CUDA_SM90A).program
    assert "2-stage K loop" in p.notes[0] and p.schedule.tile_m * p.schedule.tile_n <= 64 * 64, p.notes
