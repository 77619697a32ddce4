"""The launch data a runtime reads from a kernel's manifest entry, checked at load.

A CPU kernel parallelises itself: its runtime reads nothing of ``launch`` (any object
passes). The CUDA runtime launches from it: the entry, grid, block, dynamic shared
memory, and per kernel argument a param's pointer or a TMA descriptor over it, with the
arguments of ``cuTensorMapEncodeTiled`` (see codegen/cuda/tilelang_lower.py). Each is
checked here against CUDA's own limits, so that a corrupt number is a PlanError naming
the field instead of a driver failure or a launch out of bounds.
"""
from __future__ import annotations

from typing import Protocol

from tilefuse.errors import PlanError

MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)
MAX_THREADS = 1024
MAX_SHARED_BYTES = 1 << 20  # above any GPU's shared memory per block (sm_90: 227 KiB)
MAX_TMA_RANK = 5
TMA_FIELDS = ("dtype", "interleave", "swizzle", "l2_promotion", "oob_fill")  # CUDA enums: small ints


class _Fields(Protocol):
    def fail(self, where: str, msg: str) -> PlanError: ...
    def get(self, d: dict, key: str, typ: type | tuple[type, ...], where: str) -> object: ...
    def integer(self, d: dict, key: str, where: str, lo: int = 0, hi: int = ...) -> int: ...
    def ints(self, d: dict, key: str, where: str, hi: int = ..., max_len: int = ...) -> tuple[int, ...]: ...
    def items(self, d: dict, key: str, where: str) -> list[tuple[dict, str]]: ...
    def obj(self, x: object, where: str) -> dict: ...


def check_launch(dec: _Fields, family: str, launch: dict, where: str, n_params: int, symbol: str) -> None:
    """PlanError (through ``dec``, which names the manifest) for launch data the
    ``family``'s runtime cannot use."""
    if family == "cuda":
        _cuda(dec, launch, where, n_params, symbol)


def _cuda(dec: _Fields, launch: dict, where: str, n_params: int, symbol: str) -> None:
    if dec.get(launch, "entry", str, where) != symbol:
        raise dec.fail(f"{where}.entry", f"{launch['entry']!r:.60} is not the kernel's symbol {symbol!r}")
    for key, limits in (("grid", MAX_GRID), ("block", MAX_BLOCK)):
        dims = dec.ints(launch, key, where, max_len=3)
        if len(dims) != 3 or not all(1 <= d <= hi for d, hi in zip(dims, limits)):
            raise dec.fail(f"{where}.{key}", f"expected 3 dimensions in [1, {list(limits)}], got {list(dims)}")
    block = launch["block"]
    if block[0] * block[1] * block[2] > MAX_THREADS:
        raise dec.fail(f"{where}.block", f"{block} is over {MAX_THREADS} threads")
    if "dynamic_smem" in launch:
        dec.integer(launch, "dynamic_smem", where, hi=MAX_SHARED_BYTES)
    if "programmatic" in launch:
        dec.get(launch, "programmatic", bool, where)
    for arg, aw in dec.items(launch, "args", f"{where}."):
        dec.get(arg, "name", str, aw)
        dec.integer(arg, "param", aw, hi=n_params - 1)
        kind = dec.get(arg, "kind", str, aw)
        if kind == "tensormap":
            _tma(dec, dec.obj(dec.get(arg, "tma", dict, aw), f"{aw}.tma"), f"{aw}.tma")
        elif kind != "pointer":
            raise dec.fail(f"{aw}.kind", f"expected 'pointer' or 'tensormap', got {kind!r:.60}")


def _tma(dec: _Fields, t: dict, where: str) -> None:
    rank = dec.integer(t, "rank", where, lo=1, hi=MAX_TMA_RANK)
    for key, length, lo in (("dims", rank, 1), ("strides", rank - 1, 0), ("box", rank, 1), ("element_strides", rank, 1)):
        xs = dec.ints(t, key, where, hi=2**63 - 1, max_len=MAX_TMA_RANK)
        if len(xs) != length or any(x < lo for x in xs):
            raise dec.fail(f"{where}.{key}", f"expected {length} integers of at least {lo}, got {list(xs)}")
    for key in TMA_FIELDS:
        dec.integer(t, key, where, hi=255)
