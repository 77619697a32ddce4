"""The plan verifier: every reference resolves, every type agrees, memory is sound.

Run after ``link`` (a bug in tilefuse) and after ``load_plan`` (a corrupt or edited
plan); both get a PlanError saying which step, buffer or kernel is wrong.
"""
from __future__ import annotations

from tilefuse import backends
from tilefuse.errors import PlanError, TilefuseError
from tilefuse.plan.memory import verify_memory
from tilefuse.ir.dtypes import DType
from tilefuse.plan.model import (KERNEL_NAME, BranchStep, BufferKind, HostStep, Kernel, KernelStep, Plan,
                                  SelectStep)


def verify_plan(plan: Plan) -> None:
    n = len(plan.buffers)
    for kernel in plan.kernels.values():
        check_kernel_identity(kernel, plan.target)
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
        for i in step.inputs + step.outputs:
            if not 0 <= i < n:
                raise PlanError(f"{step.label}: buffer {i} does not exist")
        for i in step.outputs:
            if not plan.buffers[i].kind.in_arena:
                raise PlanError(f"{step.label} writes buffer {i} ({plan.buffers[i].name}), a {plan.buffers[i].kind.value}")
        if isinstance(step, KernelStep):
            _check_kernel_step(plan, step)
        elif isinstance(step, HostStep):
            _check_host_step(plan, step)
        elif isinstance(step, BranchStep):
            _check_condition(plan, step)
        else:
            _check_select_step(plan, step)
    _check_branch_ranges(plan)
    verify_memory(plan.buffers, plan.steps, plan.arena_bytes)


def check_kernel_identity(kernel: Kernel, target: str) -> None:
    """PlanError unless the kernel's name is one the code generators make, its symbol is
    the entry they give that name on ``target`` and its file has the target's suffix: a
    plan names its own kernels' entries and files, nothing else."""
    family = backends.family(target)
    backend = backends.find(family)
    if backend is None:
        raise PlanError(f"target {target!r} has no kernel format; known: {backends.families()}")
    fmt = backend.kernel_format
    if not KERNEL_NAME.fullmatch(kernel.name):
        raise PlanError(f"kernel name {kernel.name[:80]!r} is not a generated kernel name ({KERNEL_NAME.pattern})")
    if kernel.symbol != fmt.entry(kernel.name):
        raise PlanError(f"kernel {kernel.name}: symbol {kernel.symbol[:80]!r} is not its entry {fmt.entry(kernel.name)!r}")
    if kernel.suffix != fmt.suffix:
        raise PlanError(f"kernel {kernel.name}: file {kernel.path.name!r} is not a {family} kernel (*{fmt.suffix})")
    record = backend.launch_type()
    if not isinstance(kernel.launch, record):
        raise PlanError(f"kernel {kernel.name}: its launch data is a {type(kernel.launch).__name__}, "
                        f"not a {record.__name__}")


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
    # The primitive's parameters come from the manifest: whatever infer makes of values
    # out of its range (an axis past the rank, ...) is a corrupt plan.
    except (TilefuseError, ArithmeticError, LookupError, TypeError, ValueError) as e:
        raise PlanError(f"{step.label}: {e}") from None
    got = [plan.buffers[b].type for b in step.outputs]
    if list(outs) != got:
        raise PlanError(f"{step.label}: writes {[str(t) for t in got]}, but computes {[str(t) for t in outs]}")


def _check_condition(plan: Plan, step: BranchStep | SelectStep) -> None:
    t = plan.buffers[step.cond].type
    if t.dtype is not DType.BOOL or t.size != 1:
        raise PlanError(f"{step.label}: the condition, buffer {step.cond}, is {t}, not one bool")


def _check_select_step(plan: Plan, step: SelectStep) -> None:
    _check_condition(plan, step)
    if not len(step.then_values) == len(step.else_values) == len(step.outputs):
        raise PlanError(f"{step.label}: {len(step.then_values)} then values and {len(step.else_values)} else "
                        f"values for {len(step.outputs)} outputs")
    for i, (a, b, out) in enumerate(zip(step.then_values, step.else_values, step.outputs)):
        types = [plan.buffers[x].type for x in (a, b, out)]
        if types[0] != types[2] or types[1] != types[2]:
            raise PlanError(f"{step.label}: output {i} is {types[2]}, but the branches give {types[0]} and {types[1]}")


def _check_branch_ranges(plan: Plan) -> None:
    """Each branch's two step ranges lie inside the plan and inside the range of any
    branch around them, and a SelectStep follows them."""
    open_ranges: list[tuple[int, str]] = []  # (end, label) of ranges around the current step
    for i, step in enumerate(plan.steps):
        while open_ranges and open_ranges[-1][0] <= i:
            open_ranges.pop()
        if not isinstance(step, BranchStep):
            continue
        middle = i + 1 + step.then_steps
        end = middle + step.else_steps
        limit, around = open_ranges[-1] if open_ranges else (len(plan.steps), "the plan")
        if end >= limit:
            raise PlanError(f"{step.label}: its {step.then_steps} + {step.else_steps} steps end past {around}")
        select = plan.steps[end]
        if not isinstance(select, SelectStep) or select.cond != step.cond:
            raise PlanError(f"{step.label}: step {end}, after both branches, is not a select on buffer {step.cond}")
        open_ranges += [(end, step.label), (middle, step.label)]
