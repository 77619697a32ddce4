"""TileLang on the host: import an emitted kernel module, lower it for a CUDA arch, and
read its launch metadata from the lowered modules. No GPU is touched.

This is the only module of tilefuse that imports tilelang (pinned in the ``cuda`` extra).
What comes out is plain data (``Lowered``): the CUDA C++ source and, per kernel entry,
grid, block, dynamic shared memory and the parameter list in the kernel's own order, each
a device pointer to one TileProgram param or a TMA descriptor (with every
``cuTensorMapEncodeTiled`` argument) over one. Structured, from TileLang's host module
(``tma_descriptor_args`` and the packed launch call), never parsed from text.

TileLang is not thread-safe: callers lower one kernel at a time (``_LOCK``).
"""
from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from tilefuse.errors import CompileError

TILELANG_VERSION = "0.1.15"
# Pass options come from the kernel module (``PASS_CONFIG``, chosen per kernel by the
# emitter); a module without one lowers with TMA and warp specialisation off (T.copy ->
# cp.async under TileLang's software pipeline).
DEFAULT_PASS_CONFIG = {"tl.disable_tma_lower": True, "tl.disable_warp_specialized": True}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class KernelParam:
    """One argument of the CUDA entry: ``kind`` "pointer" or "tensormap"; ``param`` the
    TileProgram param it points into; ``tma`` the tensor map's encode arguments."""

    name: str
    kind: str
    param: int
    tma: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Lowered:
    source: str  # CUDA C++
    entry: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_smem: int
    params: tuple[KernelParam, ...]
    programmatic: bool = False  # waits for the previous kernel itself (griddepcontrol.wait)


@functools.cache
def tilelang_version() -> str:
    """The installed TileLang's version, from its package metadata: importing TileLang
    (and torch with it) takes seconds, and a warm build needs only the cache key."""
    try:
        return importlib.metadata.version("tilelang")
    except importlib.metadata.PackageNotFoundError:
        raise CompileError(
            f"the CUDA target needs tilelang=={TILELANG_VERSION} on the compiling machine "
            "(pip install 'tilefuse[cuda]')"
        ) from None


def lower_module(path: Path, func: str, arch: str, kernel: str) -> Lowered:
    """Import ``func`` from the module at ``path`` and lower it for ``arch`` (e.g. sm_90a)."""
    tilelang_version()
    with _LOCK:
        try:
            prim, config = _load(path, func)
            return _lower(prim, arch, config)
        except CompileError:
            raise
        except Exception as e:  # TileLang reports problems as many exception types
            text = str(e).strip().splitlines()
            tail = "\n".join(text[-30:])
            raise CompileError(f"kernel {kernel}: TileLang could not lower {path}:\n{type(e).__name__}: {tail}") from None


def _load(path: Path, func: str):
    name = f"tilefuse_kernel_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise CompileError(f"cannot import kernel module {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # TileLang reads the function's source through inspect
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(name, None)
    return getattr(module, func), dict(getattr(module, "PASS_CONFIG", DEFAULT_PASS_CONFIG))


def _lower(prim, arch: str, config: dict) -> Lowered:
    import tilelang
    from tilelang import tvm
    from tvm import tirx
    from tvm.target import Target
    from tvm.tirx.stmt_functor import post_order_visit

    target = Target({"kind": "cuda", "arch": arch})
    with tvm.transform.PassContext(opt_level=3, config=config), target:
        art = tilelang.lower(prim, target=target)

    data_param = {}
    for i, p in enumerate(prim.params):
        if p in prim.buffer_map:
            data_param[prim.buffer_map[p].data.name] = i
    (host,) = list(art.host_mod.functions.values())
    tma_args = dict(host.attrs["tma_descriptor_args"]) if "tma_descriptor_args" in host.attrs else {}
    calls = []
    packed = tvm.ir.Op.get("tirx.tvm_call_packed")

    def visit(n):
        if isinstance(n, tirx.Call) and n.op.same_as(packed):
            calls.append(n)

    post_order_visit(host.body, visit)
    devices = list(art.device_mod.functions.items())
    if len(devices) != 1:
        raise CompileError(f"expected one CUDA kernel per program, TileLang made {len(devices)}")
    gv, df = devices[0]
    entry = gv.name_hint
    (call,) = [c for c in calls if str(c.args[0]).strip('"') == entry]
    host_args = list(call.args[1 : 1 + len(df.params)])
    extent = {str(k): int(v) for k, v in df.attrs["thread_extent"].items()}
    grid = (extent.get("blockIdx.x", 1), extent.get("blockIdx.y", 1), extent.get("blockIdx.z", 1))
    block = (extent.get("threadIdx.x", 1), extent.get("threadIdx.y", 1), extent.get("threadIdx.z", 1))
    smem = int(df.attrs["dyn_shared_memory_buf"]) if "dyn_shared_memory_buf" in df.attrs else 0
    params = []
    for kp, arg in zip(df.params, host_args):
        if isinstance(arg, tirx.Var) and arg in tma_args:
            params.append(_tensormap(kp.name, list(tma_args[arg]), data_param))
        elif isinstance(arg, tirx.Var) and arg.name in data_param:
            params.append(KernelParam(kp.name, "pointer", data_param[arg.name]))
        else:
            raise CompileError(f"kernel {entry}: unexpected kernel argument {kp.name} = {arg}")
    programmatic = "has_cuda_pdl_sync" in df.attrs  # TileLang's mark for T.pdl_sync
    return Lowered(art.kernel_source, entry, grid, block, smem, tuple(params), programmatic)


def _tensormap(name: str, args: list, data_param: dict[str, int]) -> KernelParam:
    kind = args[0].value if hasattr(args[0], "value") else str(args[0]).strip('"')
    if kind != "__tvm_tensormap_create_tiled":
        raise CompileError(f"TMA descriptor {name}: {kind} is not supported (tiled descriptors only)")
    dtype, rank, address = int(args[2]), int(args[3]), args[4]
    rest = [int(x) for x in args[5:]]
    dims, strides = rest[0:rank], rest[rank : 2 * rank]
    box, elem = rest[2 * rank : 3 * rank], rest[3 * rank : 4 * rank]
    interleave, swizzle, l2, oob = rest[4 * rank : 4 * rank + 4]
    tma = {
        "dtype": dtype, "rank": rank, "dims": dims,
        "strides": strides[1:],  # bytes, innermost first, without the element size
        "box": box, "element_strides": elem,
        "interleave": interleave, "swizzle": swizzle, "l2_promotion": l2, "oob_fill": oob,
    }
    return KernelParam(name, "tensormap", data_param[address.name], tma)
