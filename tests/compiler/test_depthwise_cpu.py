"""Depthwise convolutions through the CPU pipeline (compile, plan, run) against onnxruntime
and the reference executor, on fresh random inputs: every case of ``depthwise_convs`` in one
model, each one kernel with its epilogue: from zero-padded rows on chip, channels in lanes,
or over the input planes where they lie."""
import random

import tilefuse
from tests.compiler import depthwise_convs
from tests.tile_ir.compiled import outputs_mismatch
from tilefuse.compiler import compile_model
from tilefuse.tile_ir.schedule import GemmSchedule


def test_depthwise_convolutions_match_onnxruntime_and_the_reference_on_cpu(tmp_path):
    names = list(depthwise_convs.CASES)
    seed = random.randrange(2**31)
    model = depthwise_convs.model(names, seed)
    x = depthwise_convs.feeds(names, seed + 1)
    compiled = compile_model(model, "cpu")
    padded = lanes = planes = in_lanes = 0
    for low in compiled.lowered.values():
        s = low.program.schedule
        assert isinstance(s, GemmSchedule) and s.depthwise, (low.program.name, s)
        padded += s.depthwise_padded_width > 0
        lanes += s.depthwise_lanes == 16
        planes += s.depthwise_planes
        in_lanes += "the epilogue in the lanes" in low.program.notes[0]
    assert len(compiled.lowered) == len(names)
    # rows under 32 wide with whole vectors of channels: channels in lanes; wider rows: over
    # the input planes; the rest from padded rows
    want_lanes = sum(depthwise_convs.in_lanes(n) for n in names)
    want_planes = sum(depthwise_convs.in_planes(n) for n in names)
    assert (padded, lanes, planes) == (len(names) - want_lanes - want_planes, want_lanes, want_planes)
    # in lanes, an epilogue of one value a channel runs there, the tile stored by a transpose
    assert in_lanes == sum(depthwise_convs.in_lanes(n) and depthwise_convs.lanes_epilogue(n) for n in names)
    outs = [f"y_{n}" for n in names]
    got = dict(zip(outs, tilefuse.InferenceSession(compiled.plan.save(tmp_path / "d.tfplan")).run(None, x)))
    bad = outputs_mismatch(got, model, x)
    assert not bad, f"seed={seed}:\n" + "\n".join(bad)
