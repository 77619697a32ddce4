"""Depthwise convolutions through the CPU pipeline (compile, plan, run) against onnxruntime
and the reference executor, on fresh random inputs: every case of ``depthwise_convs`` in one
model, each one kernel with its epilogue, computed from zero-padded rows on chip."""
import random

import tilefuse
from tests.compiler import depthwise_convs
from tests.tile_ir.compiled import outputs_mismatch
from tilefuse.compiler import compile_model
from tilefuse.tile_ir.schedule import GemmSchedule


def _in_lanes(name: str) -> bool:
    """Whether case ``name``'s rows are under 32 wide, its channels a multiple of 16 and it
    is strided or of 25 taps or more (what ``ConvPolicy.depthwise_lanes`` computes in lanes
    on the CPU)."""
    shape, attrs, _ = depthwise_convs.CASES[name]
    pads, k = attrs.get("pads", [0, 0, 0, 0]), attrs["kernel_shape"][1]
    span = (k - 1) * attrs.get("dilations", [1, 1])[1] + 1
    stride = attrs.get("strides", [1, 1])[1]
    width = (shape[3] + pads[1] + pads[3] - span) // stride + 1
    return width < 32 and shape[1] % 16 == 0 and (stride > 1 or k * attrs["kernel_shape"][0] >= 25)


def test_depthwise_convolutions_match_onnxruntime_and_the_reference_on_cpu(tmp_path):
    names = list(depthwise_convs.CASES)
    seed = random.randrange(2**31)
    model = depthwise_convs.model(names, seed)
    x = depthwise_convs.feeds(names, seed + 1)
    compiled = compile_model(model, "cpu")
    padded = lanes = 0
    for low in compiled.lowered.values():
        s = low.program.schedule
        assert isinstance(s, GemmSchedule) and s.depthwise, (low.program.name, s)
        padded += s.depthwise_padded_width > 0
        lanes += s.depthwise_lanes == 16
    assert len(compiled.lowered) == len(names)
    # rows under 32 wide with whole vectors of channels: channels in lanes; the rest padded rows
    want_lanes = sum(_in_lanes(n) for n in names)
    assert (padded, lanes) == (len(depthwise_convs.STRIDE_1) - want_lanes, want_lanes)
    outs = [f"y_{n}" for n in names]
    got = dict(zip(outs, tilefuse.InferenceSession(compiled.plan.save(tmp_path / "d.tfplan")).run(None, x)))
    bad = outputs_mismatch(got, model, x)
    assert not bad, f"seed={seed}:\n" + "\n".join(bad)
