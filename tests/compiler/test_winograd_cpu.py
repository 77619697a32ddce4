"""3 x 3 convolutions through the CPU pipeline (compile, plan, run) against onnxruntime and
the reference executor, on fresh random inputs: every case of ``winograd_convs`` in one
model, those for minimal filtering computed by it (the schedule says so), the others as
before."""
import random

import tilefuse
from tests.compiler import winograd_convs
from tests.tile_ir.compiled import outputs_mismatch
from tilefuse.compiler import compile_model
from tilefuse.ir.prims import Conv
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
    bad = outputs_mismatch(got, model, x)
    assert not bad, f"seed={seed}:\n" + "\n".join(bad)
