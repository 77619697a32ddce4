"""A CUDA kernel step's launch: fixed once from its kernel's ``CudaLaunch`` record, then
started on a stream at every run (``runtime/cuda.py`` holds one per kernel step, and a
``CudaBinding`` its own over the bound memory).

The record (``codegen/launch.py``, checked when the plan was loaded) gives the entry's
grid, block and dynamic shared memory (which the entry is given at load), and per kernel
argument the param it covers: passed as that param's device pointer, or as a TMA
descriptor encoded once over it (``cuTensorMapEncodeTiled`` with the arguments TileLang
recorded at compile time). Kernels whose record says ``programmatic`` wait for the
previous kernel themselves (griddepcontrol.wait before any memory access): they are
launched with programmatic stream serialisation (``cuLaunchKernelEx``), so each one's
launch and block set-up overlap the end of the one before (in the graph too: capture
turns the attribute into programmatic edges). The others, and every kernel of a session
launching "plain", go through ``cuLaunchKernel``.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Sequence

from tilefuse.codegen.launch import CudaLaunch
from tilefuse.errors import ExecutionError, PlanError
from tilefuse.plan.model import Kernel

# A driver object (CUcontext, CUstream, CUevent, CUmodule, CUfunction, CUgraphExec, a
# tensor map, a launch config): cuda-bindings ships no type information, so they are opaque.
Handle = Any
# The executor's check of a driver call: what the call returned past its CUresult, or an
# ExecutionError naming what failed
Check = Callable[[Any, str], Any]


def in_place(ptr: int) -> bool:
    """Caller's device memory a kernel may use in place of its buffer (TMA descriptors
    need 16-byte alignment; allocators give 256 or more, and so is this asked)."""
    return ptr % 256 == 0


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel step's launch, fixed at load: function, shape, arguments (and the
    objects they point into, kept alive), and the launch config where it is programmatic."""

    fn: Handle
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    args: tuple[tuple[object, ...], tuple[type[ctypes.c_void_p] | None, ...]]  # values and ctypes (None: by value)
    keep: list[object]
    config: Handle | None


def _record(kernel: Kernel) -> CudaLaunch:
    launch = kernel.launch
    assert isinstance(launch, CudaLaunch), "check_kernel_identity checked it at load"
    return launch


def set_up_function(cu: ModuleType, check: Check, fn: Handle, kernel: Kernel) -> None:
    """Give ``kernel``'s entry ``fn`` the dynamic shared memory its launch asks for."""
    smem = _record(kernel).dynamic_smem
    if smem:
        attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        check(cu.cuFuncSetAttribute(fn, attr, smem), f"cuFuncSetAttribute({kernel.symbol}, {smem} B)")


def kernel_launch(cu: ModuleType, check: Check, kernel: Kernel, fn: Handle, ptrs: Sequence[int], stream: Handle,
                  programmatic: bool) -> KernelLaunch:
    """The launch of ``kernel``'s entry ``fn`` on ``stream`` over ``ptrs``, the device
    pointer of each of its params (and its status word's, last, if it checks indices);
    ``programmatic``: launched so where its record asks."""
    launch = _record(kernel)
    values: list[object] = []
    types: list[type[ctypes.c_void_p] | None] = []
    keep: list[object] = []
    for arg in launch.args:
        ptr = ptrs[arg.param]
        t = arg.tma
        if t is None:  # the param's device pointer
            values.append(ptr)
            types.append(ctypes.c_void_p)
            continue
        if ptr % 16:
            raise ExecutionError(f"{kernel.name}: TMA needs 16-byte aligned buffers ({arg.name})")
        try:  # enums the driver does not know are a corrupt plan (the manifest checked their type)
            enums = (cu.CUtensorMapDataType(t.dtype), cu.CUtensorMapInterleave(t.interleave),
                     cu.CUtensorMapSwizzle(t.swizzle), cu.CUtensorMapL2promotion(t.l2_promotion),
                     cu.CUtensorMapFloatOOBfill(t.oob_fill))
        except ValueError as e:
            raise PlanError(f"kernel {kernel.name}: argument {arg.name}: {e}") from None
        tmap = check(cu.cuTensorMapEncodeTiled(
            enums[0], t.rank, ptr,
            [cu.cuuint64_t(x) for x in t.dims], [cu.cuuint64_t(x) for x in t.strides],
            [cu.cuuint32_t(x) for x in t.box], [cu.cuuint32_t(x) for x in t.element_strides],
            *enums[1:],
        ), f"cuTensorMapEncodeTiled({kernel.name}.{arg.name})")
        keep.append(tmap)
        values.append(tmap)
        types.append(None)
    grid, block, smem = launch.grid, launch.block, launch.dynamic_smem
    config = _programmatic(cu, grid, block, smem, stream, keep) if programmatic and launch.programmatic else None
    return KernelLaunch(fn, grid, block, smem, (tuple(values), tuple(types)), keep, config)


def _programmatic(cu: ModuleType, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int,
                  stream: Handle, keep: list[object]) -> Handle:
    """cuLaunchKernelEx's config for a kernel that waits for its predecessor itself:
    programmatic stream serialisation allowed (its attribute kept alive in ``keep``)."""
    attr = cu.CUlaunchAttribute()
    attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmaticStreamSerializationAllowed = 1
    keep.append(attr)
    config = cu.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = block
    config.sharedMemBytes = smem
    config.hStream = stream
    config.attrs = [attr]
    config.numAttrs = 1
    return config


def launch_kernel(cu: ModuleType, check: Check, launch: KernelLaunch, stream: Handle, kernel: str) -> None:
    """Start ``launch`` on ``stream`` (asynchronous); ``kernel`` names it in errors. A
    programmatic launch runs on the stream its config names."""
    if launch.config is not None:
        check(cu.cuLaunchKernelEx(launch.config, launch.fn, launch.args, 0), f"launching {kernel}")
    else:
        check(cu.cuLaunchKernel(launch.fn, *launch.grid, *launch.block, launch.smem, stream, launch.args, 0),
              f"launching {kernel}")
