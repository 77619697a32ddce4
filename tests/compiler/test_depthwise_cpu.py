"""Depthwise convolutions through the CPU pipeline (compile, plan, run) against onnxruntime
and the reference executor, on fresh random inputs: every case of ``depthwise_convs`` in one
model, each one kernel with its epilogue, computed from zero-padded rows on chip."""
import random

import onnxruntime as ort

import tilefuse
from tests.compiler import depthwise_convs
from tilefuse.compare import compare_output
from tilefuse.compiler import compile_model
from tilefuse.frontend import import_onnx
from tilefuse.reference import run_graph
from tilefuse.tile_ir.schedule import GemmSchedule


def test_depthwise_convolutions_match_onnxruntime_and_the_reference_on_cpu(tmp_path):
    names = list(depthwise_convs.CASES)
    seed = random.randrange(2**31)
    model = depthwise_convs.model(names, seed)
    x = depthwise_convs.feeds(names, seed + 1)
    compiled = compile_model(model, "cpu")
    padded = 0
    for low in compiled.lowered.values():
        s = low.program.schedule
        assert isinstance(s, GemmSchedule) and s.depthwise, (low.program.name, s)
        padded += s.depthwise_padded_width > 0
    assert len(compiled.lowered) == len(names)
    assert padded == len(depthwise_convs.STRIDE_1)
    outs = [f"y_{n}" for n in names]
    got = dict(zip(outs, tilefuse.InferenceSession(compiled.plan.save(tmp_path / "d.tfplan")).run(None, x)))
    want = dict(zip(outs, ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, x)))
    ref = run_graph(import_onnx(model), x)
    bad = []
    for name in outs:
        for what, expected in (("onnxruntime", want[name]), ("reference", ref[name])):
            c = compare_output(name, got[name], expected)
            if not c.ok:
                bad.append(f"{name} against {what}: {c.problem}")
    assert not bad, f"seed={seed}:\n" + "\n".join(bad)
