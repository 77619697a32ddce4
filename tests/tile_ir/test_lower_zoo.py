"""Every fused group of every tiny zoo model lowers to ONE TileProgram, and the tile
interpreter agrees with the reference executor on it (fresh random inputs)."""
import random

import numpy as np
import pytest

import models
from tilefuse.compare import compare_output
from tilefuse.frontend import import_onnx
from tilefuse.partition import partition_graph
from tilefuse.reference import evaluate_all
from tilefuse.target import CPU
from tilefuse.tile_ir.interpret import run_program
from tilefuse.tile_ir.lower import lower_group

NAMES = [n for n, s in models.ZOO.items() if s.runs_in_ort]


@pytest.mark.parametrize("name", NAMES)
def test_every_group_lowers_and_interprets_like_the_reference(name, zoo_cache):
    shapes = models.ZOO[name].shapes("tiny")
    path = models.build(name, "tiny", "float32", cache_dir=zoo_cache)
    graph = import_onnx(path, shapes)
    seed = random.randrange(2**31)
    values = evaluate_all(graph, models.random_inputs(path, shapes, seed=seed))
    for group in partition_graph(graph, CPU).groups:
        if str(group.kind) == "opaque":
            continue
        lowered = lower_group(group, CPU)
        n_in = lowered.program.num_inputs
        args = [v.data if v.is_constant else values[id(v)] for v in lowered.bindings[:n_in]]
        outs = [np.zeros(v.type.shape, v.type.dtype.numpy) for v in lowered.bindings[n_in:]]
        run_program(lowered.program, [np.ascontiguousarray(a) for a in args] + outs)
        for v, got in zip(lowered.bindings[n_in:], outs):
            c = compare_output(v.name, got, values[id(v)])
            assert c.ok, f"{name} seed={seed} group {group.name}: {v.name}: {c.problem}"
