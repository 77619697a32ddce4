"""Grouped convolutions through the CPU pipeline (compile, plan, run) against onnxruntime
and the reference executor, on fresh random inputs: every case of ``grouped_convs`` in one
model, each a tiled implicit GEMM with its bias and ReLU as the epilogue."""
import random

import numpy as np
import onnxruntime as ort

import tilefuse
from tests.compiler import grouped_convs
from tests.tile_ir.compiled import outputs_mismatch
from tilefuse.compiler import compile_model
from tilefuse.tile_ir.schedule import GemmSchedule


def test_grouped_convolutions_match_onnxruntime_and_the_reference_on_cpu(tmp_path):
    names = list(grouped_convs.CASES)
    seed = random.randrange(2**31)
    model = grouped_convs.model(names, seed)
    x = grouped_convs.feeds(names, seed + 1)
    compiled = compile_model(model, "cpu")
    for low in compiled.lowered.values():  # one kernel a convolution: the tiled schedule
        s = low.program.schedule
        assert isinstance(s, GemmSchedule) and s.groups > 1 and not s.depthwise, (low.program.name, s)
    assert len(compiled.lowered) == len(names)
    got = dict(zip([f"y_{n}" for n in names], tilefuse.InferenceSession(compiled.plan.save(tmp_path / "g.tfplan")).run(None, x)))
    want = dict(zip([f"y_{n}" for n in names],
                    ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, x)))
    for name in got:
        assert np.count_nonzero(want[name]) > want[name].size // 4, name  # the ReLU keeps a real share
    bad = outputs_mismatch(got, model, x)
    assert not bad, f"seed={seed}:\n" + "\n".join(bad)
