"""Register placement: which fragment tiles of a GPU program live in registers.

A lowering puts per-thread tiles in fragment scope; whether TileLang can hold one in
registers depends on the statements that use it and on the block's threads:

- a product's accumulator where the product runs on tensor cores (half-float tiles in the
  MMA shapes, m16 n8 k16, or float32 ones the product may round to TF32, k8; split evenly
  over the block's warps), and, where the options allow, its A operand held as a fragment
  when the rows split into 64 per warpgroup (wgmma reads A from registers in the
  accumulator's layout: attention's P);
- both tiles of a tile reduction of power-of-two shape that splits over the threads (its
  result's per-row vectors too: attention's running max and sum, with ``register_rows``);
- with ``fma_registers`` (a number of elements, 0: never), the accumulator of an exact
  product (an FMA loop: float32 tiles not rounded to TF32, or shapes no MMA takes) whose
  tile splits evenly over the threads and leaves each at most that many elements: each thread accumulates its own
  elements, reading the operand tiles from shared memory.

Every other fragment tile is held in shared memory, where any thread may read any element.
The pass writes the answer into ``TileProgram.registers``, and on each product and tile
reduction the form it takes (``Gemm.tensor_cores``, ``ReduceTile.registers``); the CUDA
printer allocates and prints what the program says, and the verifier checks the forms
(``check_placement``).
"""
from __future__ import annotations

from dataclasses import replace

from tilefuse.device import Device
from tilefuse.errors import GraphError
from tilefuse.ir.dtypes import DType
from tilefuse.ir.prims import ReduceFn
from tilefuse.tile_ir.ir import Buffer, Gemm, If, Loop, ReduceTile, Scope, Stmt, TileProgram, statements

HALF = frozenset({DType.FLOAT16, DType.BFLOAT16})
# tile reductions TileLang has register forms of (T.reduce_sum / _max / _min)
REGISTER_REDUCTIONS = frozenset({ReduceFn.SUM, ReduceFn.MAX, ReduceFn.MIN})


def place_registers(program: TileProgram, device: Device, register_rows: bool = True,
                    fma_registers: int = 0) -> TileProgram:
    """``program`` with ``registers`` set for its block (devices with blocks only);
    ``register_rows``, ``fma_registers``: the code generator's options of those names
    (CudaOptions)."""
    if not device.max_block_threads:
        return program
    body = _forms(program.body, program.threads)
    registers = register_buffers(body, program.threads, program.allocs, register_rows, fma_registers)
    return replace(program, body=body, registers=registers)


def _forms(stmts: tuple[Stmt, ...], threads: int) -> tuple[Stmt, ...]:
    """``stmts`` with each product's and tile reduction's form set for ``threads``."""
    out: list[Stmt] = []
    for s in stmts:
        if isinstance(s, Gemm):
            s = replace(s, tensor_cores=tensor_core(s, threads))
        elif isinstance(s, ReduceTile):
            s = replace(s, registers=fragment_reduce(s, threads))
        elif isinstance(s, (Loop, If)):
            s = replace(s, body=_forms(s.body, threads))
        out.append(s)
    return tuple(out)


def check_placement(p: TileProgram) -> None:
    """Raise GraphError where a product is marked for tensor cores, or a tile reduction for
    registers, that cannot take that form on the program's block, or whose tiles are not
    register fragments; or where register tiles are not fragments."""
    fragments = {b.name for b in p.allocs if b.scope is Scope.FRAGMENT}
    if not p.registers <= fragments:
        raise GraphError(f"kernel {p.name}: registers {sorted(p.registers - fragments)} are not fragment tiles")
    for s in statements(p.body):
        if isinstance(s, Gemm) and s.tensor_cores and not (tensor_core(s, p.threads) and s.c.name in p.registers):
            raise GraphError(f"kernel {p.name}: the product into {s.c.name} cannot run on tensor cores on "
                             f"{p.threads} threads with its accumulator in registers")
        if isinstance(s, ReduceTile) and s.registers and not (
                fragment_reduce(s, p.threads) and {s.src.name, s.dst.name} <= p.registers):
            raise GraphError(f"kernel {p.name}: the reduction of {s.src.name} has no register form on {p.threads} threads")


def register_buffers(stmts: tuple[Stmt, ...], threads: int, allocs: tuple[Buffer, ...] = (),
                     register_rows: bool = True, fma_registers: int = 0) -> frozenset[str]:
    """Names of the fragment tiles held in registers on a block of ``threads``, for
    statements whose forms are set (``_forms``)."""
    out: set[str] = set()
    rows: set[tuple[int, ...]] = set()
    for s in statements(stmts):
        if isinstance(s, Gemm) and s.tensor_cores:
            out.add(s.c.name)
            if register_rows and s.a.scope is Scope.FRAGMENT and not s.trans_a and warpgroup_rows(s, threads):
                out.add(s.a.name)
        elif isinstance(s, Gemm) and fma_registers and fma_accumulator(s, threads, fma_registers):
            out.add(s.c.name)
        elif isinstance(s, ReduceTile) and s.registers:
            out |= {s.src.name, s.dst.name}
            rows.add(s.dst.shape)
    if register_rows:
        out |= {b.name for b in allocs if b.scope is Scope.FRAGMENT and len(b.shape) == 1 and b.shape in rows}
    return frozenset(out)


def tensor_core(g: Gemm, threads: int) -> bool:
    """Half-float tiles in the shapes the MMA instructions take (m16 n8 k16), or float32
    tiles the product may round to TF32 (k8), split evenly over the block's warps;
    anything else is an exact FMA loop."""
    m, n = g.c.shape
    k = g.a.shape[0] if g.trans_a else g.a.shape[1]
    warps = max(1, threads // 32)
    split = any(m % (16 * wm) == 0 and n % (8 * (warps // wm)) == 0 for wm in range(1, warps + 1) if warps % wm == 0)
    half = g.a.dtype in HALF and k % 16 == 0
    tf32 = g.tf32 and g.a.dtype is DType.FLOAT32 and k % 8 == 0
    return (half or tf32) and g.b.dtype is g.a.dtype and threads % 32 == 0 and split


def fma_accumulator(g: Gemm, threads: int, most: int) -> bool:
    """An exact product whose fragment accumulator splits evenly over ``threads``, at most
    ``most`` elements each: each thread's FMA loop accumulates its own."""
    size = g.c.shape[0] * g.c.shape[1]
    return (not g.tensor_cores and g.c.scope is Scope.FRAGMENT and size % threads == 0
            and size // threads <= most)


def warpgroup_rows(g: Gemm, threads: int) -> bool:
    """A half-float product whose rows split into 64 per warpgroup: wgmma, where an A
    operand in registers has the accumulator's layout (what rounding P from the scores
    needs). The m16 MMA path lays its A fragments out differently (TileLang refuses the
    element-wise nest between them)."""
    groups = threads // 128
    return g.a.dtype in HALF and threads % 128 == 0 and g.c.shape[0] % (64 * groups) == 0


def fragment_reduce(r: ReduceTile, threads: int) -> bool:
    """TileLang's register reductions lay a tile out over the threads evenly only for
    power-of-two tiles (seen: an 8 x 768 tile on 128 threads has no layout)."""
    rows, cols = r.src.shape
    pow2 = all(x & (x - 1) == 0 for x in (rows, cols))
    return r.fn in REGISTER_REDUCTIONS and pow2 and (rows * cols) % threads == 0
