"""The plan verifier: every reference resolves, every type agrees, memory is sound.

Run after ``link`` (a bug in tilefuse) and after ``load_plan`` (a corrupt or edited
plan); both get a PlanError saying which step, buffer or kernel is wrong.
"""
from __future__ import annotations

from tilefuse.errors import PlanError
from tilefuse.plan.memory import verify_memory
from tilefuse.plan.model import BufferKind, HostStep, KernelStep, Plan


def verify_plan(plan: Plan) -> None:
    n = len(plan.buffers)
    for i, buf in enumerate(plan.buffers):
        if buf.id != i:
            raise PlanError(f"buffer {i} has id {buf.id}; buffers must be numbered in order")
        if buf.kind.in_arena != (buf.offset is not None):
            raise PlanError(f"buffer {i} ({buf.name}): a {buf.kind.value} buffer {'needs' if buf.kind.in_arena else 'has no'} arena offset")
    for what, bindings, kinds in (
        ("input", plan.inputs, {BufferKind.INPUT}),
        ("output", plan.outputs, set(BufferKind)),
    ):
        names = [b.name for b in bindings]
        if len(set(names)) != len(names):
            raise PlanError(f"duplicate {what} names in {names}")
        for b in bindings:
            if not 0 <= b.buffer < n or plan.buffers[b.buffer].kind not in kinds:
                raise PlanError(f"{what} {b.name!r} is bound to buffer {b.buffer}, which is not an {what} buffer")
    bound = {b.buffer for b in plan.inputs}
    for buf in plan.buffers:
        if buf.kind is BufferKind.INPUT and buf.id not in bound:
            raise PlanError(f"input buffer {buf.id} ({buf.name}) is bound to no input")
        if buf.kind is BufferKind.CONSTANT:
            _check_weight(plan, buf.id)
    for step in plan.steps:
        for b in step.inputs + step.outputs:
            if not 0 <= b < n:
                raise PlanError(f"{step.label}: buffer {b} does not exist")
        for b in step.outputs:
            if not plan.buffers[b].kind.in_arena:
                raise PlanError(f"{step.label} writes buffer {b} ({plan.buffers[b].name}), a {plan.buffers[b].kind.value}")
        if isinstance(step, KernelStep):
            _check_kernel_step(plan, step)
        else:
            _check_host_step(plan, step)
    verify_memory(plan.buffers, plan.steps, plan.arena_bytes)


def _check_weight(plan: Plan, b: int) -> None:
    buf = plan.buffers[b]
    data = plan.weights.get(buf.name)
    if data is None:
        raise PlanError(f"weights.safetensors: no tensor {buf.name!r} (constant buffer {b})")
    want = (buf.type.dtype.numpy, buf.type.shape)
    if (data.dtype, tuple(data.shape)) != want:
        raise PlanError(f"weights.safetensors: tensor {buf.name!r} is {data.dtype}{list(data.shape)}, expected {want[0]}{list(want[1])}")


def _check_kernel_step(plan: Plan, step: KernelStep) -> None:
    kernel = plan.kernels.get(step.kernel)
    if kernel is None:
        raise PlanError(f"{step.label}: no such kernel")
    args = [(b, "input") for b in step.inputs] + [(b, "output") for b in step.outputs]
    params = kernel.params
    if step.sites:  # the status word the runtime passes after the buffers
        if not params or (params[-1].role, params[-1].dtype, tuple(params[-1].shape)) != ("status", "int64", (2,)):
            raise PlanError(f"{step.label}: {len(step.sites)} index checks, but the kernel takes no status word")
        params = params[:-1]
    if any(x.extent < 1 for x in step.sites):
        raise PlanError(f"{step.label}: an index check of an empty axis")
    if len(args) != len(params):
        raise PlanError(f"{step.label}: {len(args)} arguments for {len(params)} params")
    for i, ((b, role), p) in enumerate(zip(args, params)):
        t = plan.buffers[b].type
        if (p.role, p.dtype, tuple(p.shape)) != (role, str(t.dtype), t.shape):
            raise PlanError(f"{step.label}: argument {i} is buffer {b} ({role} {t}), but param {p.name} is {p.role} {p.dtype}{list(p.shape)}")


def _check_host_step(plan: Plan, step: HostStep) -> None:
    ins = [plan.buffers[b].type for b in step.inputs]
    try:
        outs = step.primitive.infer(ins)
    except (TypeError, ValueError) as e:
        raise PlanError(f"{step.label}: {e}") from None
    got = [plan.buffers[b].type for b in step.outputs]
    if list(outs) != got:
        raise PlanError(f"{step.label}: writes {[str(t) for t in got]}, but computes {[str(t) for t in outs]}")
