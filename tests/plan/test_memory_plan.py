"""Memory planning: liveness, reuse, alignment, and the check that catches overlaps."""
import numpy as np
import pytest

from tilefuse.errors import PlanError
from tilefuse.ir import Builder, DType, TensorType
from tilefuse.ir.prims import CumSum
from tilefuse.partition import partition_graph
from tilefuse.plan import ALIGN, BufferKind, HostStep, assign_offsets, link
from tilefuse.plan.memory import align, verify_memory
from tilefuse.runtime import InferenceSession
from tilefuse.reference import run_graph
from tilefuse.target import CPU

from tests.plan.handmade import cumsum_chain, random_feeds


@pytest.mark.parametrize("length", [2, 3, 10, 50])
def test_chain_needs_two_slots(length):
    graph, partition = cumsum_chain(length)
    plan = link(graph, partition, {}, "cpu", "")
    slot = align(4 * 16 * 4)
    report = plan.memory_report()
    assert all(isinstance(s, HostStep) for s in plan.steps)
    assert report.intermediate_bytes == length * 4 * 16 * 4
    assert plan.arena_bytes == 2 * slot  # each link is live only with its neighbours
    feeds = random_feeds(graph)
    (got,) = InferenceSession(plan).run(None, feeds)
    np.testing.assert_allclose(got, run_graph(graph, feeds)["y"], rtol=1e-5, atol=1e-4)


def test_step_inputs_and_outputs_never_share():
    # A buffer dying at step i and one born at step i are both live at step i.
    offsets, arena = assign_offsets({0: 100, 1: 100}, {0: (0, 1), 1: (1, 2)})
    assert offsets[0] != offsets[1] and arena == 2 * align(100)


def test_offsets_are_aligned_and_disjoint_when_live_together():
    rng = np.random.default_rng(0)
    sizes, lives = {}, {}
    for b in range(300):
        start = int(rng.integers(0, 100))
        sizes[b] = int(rng.integers(0, 5000))
        lives[b] = (start, start + int(rng.integers(0, 10)))
    offsets, arena = assign_offsets(sizes, lives)
    assert all(o % ALIGN == 0 and o + sizes[b] <= arena for b, o in offsets.items())
    for a in sizes:
        for b in sizes:
            if a < b and sizes[a] and sizes[b] and lives[a][0] <= lives[b][1] and lives[b][0] <= lives[a][1]:
                assert offsets[a] + sizes[a] <= offsets[b] or offsets[b] + sizes[b] <= offsets[a]
    # Reuse pays: far less than every buffer side by side.
    assert arena < sum(align(s) for s in sizes.values()) / 3


def test_verify_memory_catches_overlap():
    graph, partition = cumsum_chain(3)
    plan = link(graph, partition, {}, "cpu", "")
    buffers = list(plan.buffers)
    arena = [b for b in buffers if b.kind.in_arena]
    first, second = arena[0], arena[1]  # written by steps 0 and 1, both live at step 1
    buffers[second.id] = type(second)(second.id, second.name, second.kind, second.type, first.offset)
    with pytest.raises(PlanError, match="overlap"):
        verify_memory(buffers, plan.steps, plan.arena_bytes)


def test_an_early_output_is_not_overwritten():
    # The first link is an output: it must survive the rest of the chain.
    b = Builder("early")
    y = b.input("x", TensorType(DType.FLOAT32, (4, 16)))
    for i in range(6):
        y = b.emit1(CumSum(axis=1), y)
        if i == 0:
            b.output("first", y)
    b.output("last", y)
    plan = link(b.graph, partition_graph(b.graph, CPU), {}, "cpu", "")
    first = plan.buffers[plan.outputs[0].buffer]
    assert first.kind is BufferKind.OUTPUT
    feeds = random_feeds(b.graph)
    ref = run_graph(b.graph, feeds)
    got = InferenceSession(plan).run(["first", "last"], feeds)
    np.testing.assert_allclose(got[0], ref["first"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], ref["last"], rtol=1e-5, atol=1e-3)
