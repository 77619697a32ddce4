"""3 x 3 convolutions through the CPU pipeline (compile, plan, run) against onnxruntime and
the reference executor, on fresh random inputs: every case of ``winograd_convs`` in one
model, those for minimal filtering computed by it (the schedule says so), the others as
before."""
import random

import onnxruntime as ort

import tilefuse
from tests.compiler import winograd_convs
from tilefuse.compare import compare_output
from tilefuse.compiler import compile_model
from tilefuse.frontend import import_onnx
from tilefuse.ir.prims import Conv
from tilefuse.reference import run_graph
from tilefuse.tile_ir.schedule import GemmSchedule


def test_winograd_convolutions_match_onnxruntime_and_the_reference_on_cpu(tmp_path):
    names = list(winograd_convs.CASES)
    seed = random.randrange(2**31)
    model = winograd_convs.model(names, seed)
    x = winograd_convs.feeds(names, seed + 1)
    compiled = compile_model(model, "cpu")
    took = {}
    groups = {g.id: g for g in compiled.partition.groups}
    for gid, low in compiled.lowered.items():
        s = low.program.schedule
        (conv,) = [n for n in groups[gid].nodes if isinstance(n.op, Conv)]
        took[conv.inputs[0].name.removeprefix("x_")] = isinstance(s, GemmSchedule) and s.winograd == 4
    assert took == {n: winograd_convs.winograd(n) for n in names}
    outs = [f"y_{n}" for n in names]
    got = dict(zip(outs, tilefuse.InferenceSession(compiled.plan.save(tmp_path / "w.tfplan")).run(None, x)))
    want = dict(zip(outs, ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, x)))
    ref = run_graph(import_onnx(model), x)
    bad = []
    for name in outs:
        for what, expected in (("onnxruntime", want[name]), ("reference", ref[name])):
            c = compare_output(name, got[name], expected)
            if not c.ok:
                bad.append(f"{name} against {what}: {c.problem}")
    assert not bad, f"seed={seed}:\n" + "\n".join(bad)
