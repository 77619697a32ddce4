"""Every fused group of every tiny zoo model lowers to ONE TileProgram, and the tile
interpreter agrees with the reference executor on it (fresh random inputs)."""
import random

import pytest

import models
from tilefuse.compare import compare_output
from tilefuse.frontend.qdq import checked_precision
from tilefuse.frontend import import_onnx
from tilefuse.partition import partition_graph
from tilefuse.reference import evaluate_all
from tilefuse.target import CPU, CUDA_SM90A
from tilefuse.tile_ir.lower import lower_group

from tests.tile_ir.interpreted import interpret

NAMES = [n for n, s in models.ZOO.items() if s.runs_in_ort]


@pytest.mark.parametrize("name", NAMES)
def test_every_group_lowers_and_interprets_like_the_reference(name, zoo_cache):
    _check(name, "float32", CPU, zoo_cache)


@pytest.mark.parametrize("name", NAMES)
def test_every_gpu_program_interprets_like_the_reference(name, zoo_cache):
    """The GPU's partition and tiles (position tiles, guarded narrow depthwise rows, 1-D
    convolutions filled along K, products kept apart from what only the staged schedule
    could run with them) compute what the model does."""
    _check(name, "float32", CUDA_SM90A, zoo_cache)


@pytest.mark.parametrize("name", ["mlp", "bert", "gpt2", "llama", "vit", "resnet"])
def test_half_float_tiles_for_tensor_cores_interpret_like_the_reference(name, zoo_cache):
    """The CUDA target keeps float16 operands float16 in their tiles (fp32 accumulators)."""
    _check(name, "float16", CUDA_SM90A, zoo_cache)


def _check(name, dtype, target, zoo_cache):
    shapes = models.ZOO[name].shapes("tiny")
    path = models.build(name, "tiny", dtype, cache_dir=zoo_cache)
    graph = import_onnx(path, shapes)
    precision = checked_precision(path)
    seed = random.randrange(2**31)
    values = evaluate_all(graph, models.random_inputs(path, shapes, seed=seed))
    for group in partition_graph(graph, target).groups:
        if str(group.kind) == "opaque":
            continue
        for v, got in interpret(lower_group(group, target), values):
            c = compare_output(v.name, got, values[id(v)], precision=precision)
            assert c.ok, f"{name} seed={seed} group {group.name}: {v.name}: {c.problem}"
