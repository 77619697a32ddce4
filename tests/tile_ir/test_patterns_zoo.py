"""Every zoo kernel is lowered by the lowering of its group's own match.

Which kernel a group becomes is decided once, by its pattern (``group.match``, made by
``tilefuse/patterns/`` when the partition is final). A lowering that finds no tiles for
its match falls through to the next pattern and says so in the program's notes; over the
zoo that must never happen, and lowering must never match again (``match_group`` is
made to fail while the groups are lowered). Every program carries the schedule record of
its match's family, agreeing with the program on threads, occupancy and producer, and
the CUDA printer emits the block's threads as the program has them (after thread fitting). Tiny models always; real ones where they are
in the model cache (or ``TILEFUSE_ZOO_REAL=1`` builds them), since they lower in seconds.
"""
import math
import os
import re

import pytest

import models
from tilefuse import patterns
from tilefuse.codegen.cuda.emit import emit_tilelang
from tilefuse.errors import GraphError
from tilefuse.frontend import import_onnx
from tilefuse.frontend.precision import precision_target, with_precision
from tilefuse.ir.control import Branch
from tilefuse.partition import partition_graph
from tilefuse.target import CPU, CUDA_SM90A
from tilefuse.tile_ir.lower import LOWERINGS, lower_group

CASES = [(n, c) for n, s in models.ZOO.items() if s.runs_in_ort for c in s.configs]
# No CUDA kernel runs on one thread of one block (the staged schedule's, StagedPolicy): the
# partitioner refuses merges that only it could run (it costs that schedule at its real
# parallelism, partition/grow.py), and grouped convolutions, the last groups it took alone
# (the ONE_THREAD list, step 6 of docs/plans/schedules-as-data.md), are tiled implicit GEMMs.
TARGETS = [(CPU, "fp32"), (CUDA_SM90A, "fp32"), (CUDA_SM90A, "fp16")]

def _kernel_groups(graph, target):
    """The partition's kernel groups, those of If branches included."""
    for g in partition_graph(graph, target).groups:
        if str(g.kind) != "opaque":
            yield g
            continue
        assert isinstance(g.match, patterns.Refusal), g.match  # a host step: no kernel pattern
        for n in g.nodes:
            if isinstance(n.op, Branch):
                yield from _kernel_groups(n.op.then_graph, target)
                yield from _kernel_groups(n.op.else_graph, target)


@pytest.mark.parametrize("target,precision", TARGETS, ids=[f"{t.name}-{p}" for t, p in TARGETS])
@pytest.mark.parametrize("name,config", CASES, ids=[f"{n}:{c}" for n, c in CASES])
def test_every_group_is_lowered_by_its_own_match(name, config, target, precision, zoo_cache, monkeypatch):
    path = models.model_path(name, config, "float32", cache_dir=zoo_cache)
    if config != "tiny" and not path.exists() and os.environ.get("TILEFUSE_ZOO_REAL") != "1":
        pytest.skip("real-size model not in the cache; TILEFUSE_ZOO_REAL=1 builds it")
    graph = import_onnx(models.build(name, config, "float32", cache_dir=zoo_cache), models.ZOO[name].shapes(config))
    graph, target = with_precision(graph, precision), precision_target(target, precision)
    groups = list(_kernel_groups(graph, target))

    def no_matching(*args, **kwargs):
        raise AssertionError("a lowering matched again")

    monkeypatch.setattr(patterns, "match_group", no_matching)
    fell, narrow = [], []
    for g in groups:
        assert type(g.match) in LOWERINGS, f"group {g.name}: {g.match}"
        program = lower_group(g, target).program
        fell += [f"{g.name} ({patterns.pattern_name(g.match)}): {n}" for n in program.notes if n.startswith("fell through")]
        # the program carries the record of what its own pattern's lowering chose
        s = program.schedule
        assert s is not None and s.family == patterns.pattern_name(g.match), (g.name, s)
        assert (s.threads, getattr(s, "occupancy", program.occupancy)) == (program.threads, program.occupancy), g.name
        assert getattr(s, "producer", program.producer) == program.producer, g.name
        assert s.to_json()["family"] == s.family
        if target.device.max_block_threads:  # the CUDA printer prints the block the program has
            text = emit_tilelang(program, target.codegen, target.device).text
            assert re.findall(r"threads=(\d+)", text) == [str(program.threads)], g.name
            # no kernel runs on one block of one thread unless its whole output is a handful of elements
            out = sum(math.prod(b.shape) for b in program.outputs)
            lanes = math.prod(program.grid) * program.threads
            if lanes == 1 and out > 8:
                narrow.append(f"{g.name} ({s.family}): {program.grid} x {program.threads} threads for {out} outputs")
    assert not narrow, narrow
    assert not fell, fell


def test_a_group_without_a_match_is_an_error(zoo_cache):
    """Groups come from partition_graph, which matches them; a hand-made one is refused
    rather than matched inside the lowering."""

    graph = import_onnx(models.build("mlp", "tiny", "float32", cache_dir=zoo_cache), models.ZOO["mlp"].shapes("tiny"))
    group = partition_graph(graph, CPU).groups[0]
    assert isinstance(group.match, patterns.GemmMatch)
    group.match = None
    with pytest.raises(GraphError, match="carries no kernel pattern"):
        lower_group(group, CPU)
