"""Every non-opaque group of every tiny zoo model, compiled to C and run: it matches the
reference executor (float32 within 1e-4 of the output's scale, float16 within 1e-2).

Kernels build in parallel (build_all) into the default kernel cache, so a rerun only
emits C and loads libraries."""
import random

import numpy as np
import pytest

import models
from tilefuse.codegen.cpu import build_all
from tilefuse.codegen.cpu.call import call_kernel
from tilefuse.compare import compare_output
from tilefuse.frontend.qdq import checked_precision
from tilefuse.frontend import import_onnx
from tilefuse.partition import partition_graph
from tilefuse.reference import evaluate_all
from tilefuse.target import CPU
from tilefuse.tile_ir.lower import lower_group

CASES = [(n, "float32") for n, s in models.ZOO.items() if s.runs_in_ort] + [("bert", "float16"), ("resnet", "float16")]


@pytest.mark.parametrize("name,dtype", CASES, ids=[f"{n}-{d}" for n, d in CASES])
def test_every_group_compiles_and_runs_like_the_reference(name, dtype, zoo_cache):
    shapes = models.ZOO[name].shapes("tiny")
    path = models.build(name, "tiny", dtype, cache_dir=zoo_cache)
    graph = import_onnx(path, shapes)
    seed = random.randrange(2**31)
    values = evaluate_all(graph, models.random_inputs(path, shapes, seed=seed))
    lowered = [lower_group(g, CPU) for g in partition_graph(graph, CPU).groups if str(g.kind) != "opaque"]
    artifacts = build_all([low.program for low in lowered])
    for low, artifact in zip(lowered, artifacts):
        n_in = low.program.num_inputs
        args = [np.ascontiguousarray(v.data if v.is_constant else values[id(v)]) for v in low.bindings[:n_in]]
        outs = [np.zeros(v.type.shape, v.type.dtype.numpy) for v in low.bindings[n_in:]]
        call_kernel(artifact, args + outs)
        for v, got in zip(low.bindings[n_in:], outs):
            c = compare_output(v.name, got, values[id(v)], precision=checked_precision(path))
            assert c.ok, f"{name}-{dtype} seed={seed} {low.program.name} ({artifact.source}): {v.name}: {c.problem}"
