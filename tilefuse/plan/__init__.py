"""plan stage: link compiled kernels into an executable plan, save and load ``.tfplan``.

``link(graph, partition, kernels, target_name, source_sha256)`` assigns a buffer to each
value crossing a group boundary, orders the steps (kernels, host steps for opaque
primitives, both branches of a run-time If), plans one arena by liveness and checks the result. ``Plan.save`` writes the
directory; ``load_plan`` reads it back, checking every file (the manifest's schema and
bounds, and the sha256 of each kernel and of the weights); ``read_verified`` gives a
runtime a kernel's bytes once they match the plan's hash.
"""
from tilefuse.plan.files import load_plan, read_verified, save_plan, write_weights
from tilefuse.plan.link import link
from tilefuse.plan.memory import assign_offsets, plan_memory
from tilefuse.plan.model import (
    ALIGN,
    FORMAT_VERSION,
    Binding,
    BranchStep,
    Buffer,
    BufferKind,
    HostStep,
    IndexSite,
    Kernel,
    KernelStep,
    MemoryReport,
    Plan,
    SelectStep,
    StepFacts,
    step_order,
)
from tilefuse.plan.verify import verify_plan

__all__ = [
    "ALIGN", "FORMAT_VERSION", "Binding", "BranchStep", "Buffer", "BufferKind", "HostStep", "IndexSite", "Kernel",
    "KernelStep", "MemoryReport", "Plan", "SelectStep", "StepFacts", "assign_offsets", "link", "load_plan", "plan_memory",
    "read_verified", "save_plan", "step_order", "verify_plan", "write_weights",
]
