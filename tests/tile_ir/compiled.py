"""A model compiled for the CPU and run, against onnxruntime and the reference executor."""
from __future__ import annotations

import onnx
import onnxruntime as ort

import tilefuse
from tilefuse.compare import compare_output
from tilefuse.reference import run_graph


def cpu_plan_matches(name: str, model: onnx.ModelProto, graph, feeds: dict) -> None:
    """The compiled CPU plan's one output ``y`` against onnxruntime's and the reference's."""
    (got,) = tilefuse.InferenceSession(tilefuse.compile(model.SerializeToString(), target="cpu")).run(None, feeds)
    (want_ort,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    (want_ref,) = run_graph(graph, feeds).values()
    for what, want in (("onnxruntime", want_ort), ("reference", want_ref)):
        c = compare_output("y", got, want)
        assert c.ok, f"{name} against {what}: {c.problem}"
