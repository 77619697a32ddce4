"""plan stage: link compiled kernels into an executable plan, save and load ``.tfplan``.

``link(graph, partition, kernels, target_name, source_sha256)`` assigns a buffer to each
value crossing a group boundary, orders the steps (kernels, host steps for opaque
primitives), plans one arena by liveness and checks the result. ``Plan.save`` writes the
directory; ``load_plan`` reads it back, checking every file.
"""
from tilefuse.plan.files import load_plan, save_plan
from tilefuse.plan.link import link
from tilefuse.plan.memory import assign_offsets, plan_memory
from tilefuse.plan.model import (
    ALIGN,
    FORMAT_VERSION,
    Binding,
    Buffer,
    BufferKind,
    HostStep,
    IndexSite,
    Kernel,
    KernelStep,
    MemoryReport,
    Plan,
)
from tilefuse.plan.verify import verify_plan

__all__ = [
    "ALIGN", "FORMAT_VERSION", "Binding", "Buffer", "BufferKind", "HostStep", "IndexSite", "Kernel", "KernelStep",
    "MemoryReport", "Plan", "assign_offsets", "link", "load_plan", "plan_memory", "save_plan", "verify_plan",
]
