"""How a built kernel is launched, as typed records with one JSON form.

A code generator says how its kernel must be started; the plan writes that into its
manifest, checks it at load, and a runtime (or the onnxruntime libraries, through the
``.tfk`` descriptors ``ort/stitch.py`` writes) starts the kernel from it. Every one of
them reads the same record, so the manifest's format lives here once: ``encode`` gives
the manifest's ``launch`` object, ``decode_cpu`` / ``decode_cuda`` read it back, checking
each number against what CUDA allows, so that a corrupt plan is a PlanError naming the
field rather than a driver failure or a launch out of bounds.

A CPU kernel parallelises itself: ``CpuLaunch`` records its tile threads and grid for
people, and no runtime reads it. A CUDA kernel is started with ``cuLaunchKernel(Ex)``:
``CudaLaunch`` holds its entry, grid, block, dynamic shared memory, whether it waits for
the previous kernel itself (programmatic stream serialisation), and per kernel argument
the TileProgram param it covers, passed as a device pointer or as a TMA descriptor
encoded over that pointer with the recorded ``cuTensorMapEncodeTiled`` arguments.

Data only, imported by the plan and (through ``tilefuse.backends``) cheaply anywhere.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeVar, overload

MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)
MAX_THREADS = 1024
MAX_SHARED_BYTES = 1 << 20  # above any GPU's shared memory per block (sm_90: 227 KiB)
MAX_TMA_RANK = 5
TMA_ENUMS = ("dtype", "interleave", "swizzle", "l2_promotion", "oob_fill")  # CUDA enums: small ints

T = TypeVar("T")


class LaunchRecord:
    """What every target family's launch record offers: its manifest form."""

    def encode(self) -> dict[str, object]:
        raise NotImplementedError


@dataclass(frozen=True)
class CpuLaunch(LaunchRecord):
    """A C kernel's tile threads and grid (``grid`` None where it was not recorded)."""

    threads: int
    grid: tuple[int, ...] | None = None

    def encode(self) -> dict[str, object]:
        out: dict[str, object] = {"threads": self.threads}
        if self.grid is not None:
            out["grid"] = list(self.grid)
        return out


@dataclass(frozen=True)
class TensorMap:
    """A tiled TMA descriptor's ``cuTensorMapEncodeTiled`` arguments, less the address:
    ``dims`` and ``box`` innermost first, ``strides`` in bytes for every dimension but the
    innermost, the enums as the driver numbers them."""

    dtype: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    element_strides: tuple[int, ...]
    interleave: int
    swizzle: int
    l2_promotion: int
    oob_fill: int

    def __post_init__(self) -> None:
        rank = len(self.dims)
        if not 1 <= rank <= MAX_TMA_RANK or (len(self.strides), len(self.box), len(self.element_strides)) != (
                rank - 1, rank, rank):
            raise ValueError(f"a rank {rank} tensor map needs {rank - 1} strides and {rank} box and element strides, "
                             f"got {self}")

    @property
    def rank(self) -> int:
        return len(self.dims)

    def encode(self) -> dict[str, object]:
        return {"dtype": self.dtype, "rank": self.rank, "dims": list(self.dims), "strides": list(self.strides),
                "box": list(self.box), "element_strides": list(self.element_strides), "interleave": self.interleave,
                "swizzle": self.swizzle, "l2_promotion": self.l2_promotion, "oob_fill": self.oob_fill}


@dataclass(frozen=True)
class KernelArg:
    """One argument of a CUDA entry: param ``param``'s device pointer, or a TMA descriptor
    over it where ``tma`` is given; ``name`` is the entry's own name for it (messages)."""

    name: str
    param: int
    tma: TensorMap | None = None

    @property
    def kind(self) -> str:
        return "pointer" if self.tma is None else "tensormap"

    def encode(self) -> dict[str, object]:
        return {"name": self.name, "kind": self.kind, "param": self.param,
                "tma": {} if self.tma is None else self.tma.encode()}


@dataclass(frozen=True)
class CudaLaunch(LaunchRecord):
    """How to start a CUDA kernel; ``arch`` is what it was compiled for."""

    entry: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple[KernelArg, ...]
    dynamic_smem: int = 0
    programmatic: bool = False  # waits for the previous kernel itself (griddepcontrol.wait)
    arch: str = ""

    def __post_init__(self) -> None:
        if len(self.grid) != 3 or len(self.block) != 3:
            raise ValueError(f"{self.entry}: grid and block need 3 dimensions, got {self.grid} and {self.block}")

    def encode(self) -> dict[str, object]:
        return {"entry": self.entry, "grid": list(self.grid), "block": list(self.block),
                "dynamic_smem": self.dynamic_smem, "arch": self.arch, "programmatic": self.programmatic,
                "args": [a.encode() for a in self.args]}


# -- decoding ---------------------------------------------------------------------------
class Fields(Protocol):
    """Typed access to a manifest's objects, each failure a PlanError naming the manifest
    and the field (``plan.manifest.Decoder``)."""

    def fail(self, where: str, msg: str) -> Exception: ...
    @overload
    def get(self, d: dict, key: str, typ: type[T], where: str) -> T: ...
    @overload
    def get(self, d: dict, key: str, typ: type | tuple[type, ...], where: str) -> object: ...
    def integer(self, d: dict, key: str, where: str, lo: int = 0, hi: int = ...) -> int: ...
    def ints(self, d: dict, key: str, where: str, hi: int = ..., max_len: int = ...) -> tuple[int, ...]: ...
    def items(self, d: dict, key: str, where: str) -> list[tuple[dict, str]]: ...
    def obj(self, x: object, where: str) -> dict: ...


def decode_cpu(dec: Fields, d: dict, where: str, n_params: int, symbol: str) -> CpuLaunch:
    """The CPU record of a manifest's ``launch`` object (nothing reads it at run time, so
    only its form is checked)."""
    threads = dec.integer(d, "threads", where, lo=1)
    return CpuLaunch(threads, dec.ints(d, "grid", where) if "grid" in d else None)


def decode_cuda(dec: Fields, d: dict, where: str, n_params: int, symbol: str) -> CudaLaunch:
    """The CUDA record of a manifest's ``launch`` object, for a kernel of ``n_params``
    params whose entry is ``symbol``: every number within CUDA's limits."""
    entry = dec.get(d, "entry", str, where)
    if entry != symbol:
        raise dec.fail(f"{where}.entry", f"{entry!r:.60} is not the kernel's symbol {symbol!r}")
    grid = _dims(dec, d, "grid", where, MAX_GRID)
    block = _dims(dec, d, "block", where, MAX_BLOCK)
    if block[0] * block[1] * block[2] > MAX_THREADS:
        raise dec.fail(f"{where}.block", f"{list(block)} is over {MAX_THREADS} threads")
    smem = dec.integer(d, "dynamic_smem", where, hi=MAX_SHARED_BYTES) if "dynamic_smem" in d else 0
    programmatic = dec.get(d, "programmatic", bool, where) if "programmatic" in d else False
    arch = dec.get(d, "arch", str, where) if "arch" in d else ""
    args = []
    for a, aw in dec.items(d, "args", f"{where}."):
        name = dec.get(a, "name", str, aw)
        param = dec.integer(a, "param", aw, hi=n_params - 1)
        kind = dec.get(a, "kind", str, aw)
        tma: TensorMap | None
        if kind == "tensormap":
            tma = _tensormap(dec, dec.obj(dec.get(a, "tma", dict, aw), f"{aw}.tma"), f"{aw}.tma")
        elif kind == "pointer":
            tma = None
        else:
            raise dec.fail(f"{aw}.kind", f"expected 'pointer' or 'tensormap', got {kind!r:.60}")
        args.append(KernelArg(name, param, tma))
    return CudaLaunch(entry, grid, block, tuple(args), smem, programmatic, arch)


def _dims(dec: Fields, d: dict, key: str, where: str, limits: tuple[int, int, int]) -> tuple[int, int, int]:
    """A grid or block: 3 dimensions, each in [1, its limit]."""
    xs = dec.ints(d, key, where, max_len=3)
    if len(xs) != 3 or not all(1 <= x <= hi for x, hi in zip(xs, limits)):
        raise dec.fail(f"{where}.{key}", f"expected 3 dimensions in [1, {list(limits)}], got {list(xs)}")
    return xs[0], xs[1], xs[2]


def _tensormap(dec: Fields, t: dict, where: str) -> TensorMap:
    rank = dec.integer(t, "rank", where, lo=1, hi=MAX_TMA_RANK)
    xs = {}
    for key, length, lo in (("dims", rank, 1), ("strides", rank - 1, 0), ("box", rank, 1), ("element_strides", rank, 1)):
        xs[key] = dec.ints(t, key, where, hi=2**63 - 1, max_len=MAX_TMA_RANK)
        if len(xs[key]) != length or any(x < lo for x in xs[key]):
            raise dec.fail(f"{where}.{key}", f"expected {length} integers of at least {lo}, got {list(xs[key])}")
    enums = {key: dec.integer(t, key, where, hi=255) for key in TMA_ENUMS}
    return TensorMap(dtype=enums["dtype"], dims=xs["dims"], strides=xs["strides"], box=xs["box"],
                     element_strides=xs["element_strides"], interleave=enums["interleave"], swizzle=enums["swizzle"],
                     l2_promotion=enums["l2_promotion"], oob_fill=enums["oob_fill"])
