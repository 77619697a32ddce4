"""A model compiled for the CPU and run, against onnxruntime and the reference executor."""
from __future__ import annotations

import onnx
import onnxruntime as ort

import tilefuse
from tilefuse.compare import compare_output
from tilefuse.reference import run_graph
from tilefuse.target import Target


def cpu_plan_matches(name: str, model: onnx.ModelProto, graph, feeds: dict, target: str | Target = "cpu") -> None:
    """The compiled CPU plan's (``target``: the CPU target or a variant of it) one output ``y``
    against onnxruntime's and the reference's."""
    (got,) = tilefuse.InferenceSession(tilefuse.compile(model.SerializeToString(), target=target)).run(None, feeds)
    (want_ort,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    (want_ref,) = run_graph(graph, feeds).values()
    for what, want in (("onnxruntime", want_ort), ("reference", want_ref)):
        c = compare_output("y", got, want)
        assert c.ok, f"{name} against {what}: {c.problem}"


def outputs_mismatch(got: dict, model: onnx.ModelProto, feeds: dict) -> list[str]:
    """A plan's outputs by name (``got``) against onnxruntime's and the reference's on the
    same feeds: a line per output and peer beyond tolerance."""
    from tilefuse.frontend import import_onnx

    want = dict(zip([o.name for o in model.graph.output],
                    ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)))
    ref = run_graph(import_onnx(model), feeds)
    bad = []
    for name, out in got.items():
        for what, expected in (("onnxruntime", want[name]), ("reference", ref[name])):
            c = compare_output(name, out, expected)
            if not c.ok:
                bad.append(f"{name} against {what}: {c.problem}")
    return bad
