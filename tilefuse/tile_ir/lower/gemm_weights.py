"""How a product's weight is bound to its kernel: as it is, or as a constant derived
from it at compile time (the weights are known), in the layout the tiles read.

- a convolution's weight that only it reads: a [K, M] copy (weight tiles are contiguous
  rows; K steps padded to the matrix unit's depth carry zero rows), or on a host whose
  convolution takes channels as rows, its [Cout, K] view (``conv_rows.fills``), a pointwise
  one's in the product core's row blocks (``row_blocks.py``) where its target asks;
- sibling products' weights side by side (one packed operand, ``patterns/gemm.py``);
- a product's [K, N] weight padded to whole column tiles of 16-byte vectors;
- a host product's weight as panels (``panels.py``).

The choice is the builder's (``gemm_epilogue._Builder``: its tiles, device and match);
this module packs and records it: ``b.packed`` (the one packed operand), ``b.panel_bufs``,
and the kernel's params, bindings and index sites.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tilefuse.ir.dtypes import DType
from tilefuse.ir.graph import Value
from tilefuse.ir.prims import Conv, MatMul
from tilefuse.ir.types import TensorType
from tilefuse.tile_ir import row_blocks
from tilefuse.tile_ir.ir import Buffer, Scope
from tilefuse.tile_ir.lower import conv_winograd, panels
from tilefuse.tile_ir.lower.params import DROP, kernel_params

if TYPE_CHECKING:
    from tilefuse.tile_ir.lower.gemm_epilogue import _Builder


def bind_params(b: _Builder) -> tuple[list[Buffer], dict[int, Buffer]]:
    """Kernel params and the values bound to them. A weight may be bound as a derived
    constant (``b.packed``): a convolution's as a [K, M] copy (weight tiles are
    contiguous rows), sibling products' side by side, a product's padded to whole
    column tiles (rows of whole 16-byte vectors), or a host product's as panels
    (``panels.py``)."""
    b.packed = None
    w = b.c.inputs[1] if isinstance(b.c.op, Conv) else None
    weights = [c.inputs[1] for c in b.cs]

    def bind(k: int, v: Value, data: np.ndarray, tag: str, value_tag: str) -> tuple[Value, Buffer]:
        data.setflags(write=False)
        dtype = DType.from_numpy(data.dtype)  # an integer product's int32 weight packs as int8 or int16
        b.packed = Buffer(f"in{k}_{tag}", dtype, data.shape, Scope.GLOBAL)
        return Value(f"{v.name}.{value_tag}", TensorType(dtype, data.shape), data=data), b.packed

    def pack(k: int, v: Value) -> tuple[Value, Buffer] | None:
        if v is w and b.winograd is not None:  # [36, Cout, Cin]: turned for minimal filtering
            return bind(k, v, conv_winograd.weight(v.data, b.winograd), "wino43", "winograd43")  # type: ignore[arg-type]
        if v is w and packs_conv_rows(b):  # [Cout, K]: a weight tile's rows are runs of K
            rows = np.ascontiguousarray(v.data.reshape(v.type.shape[0], -1))  # type: ignore[union-attr]
            if b.row_blocks:  # ... stored as the product core's register blocks of each tile
                return bind(k, v, row_blocks.pack(rows, b.row_blocks), "blocks", f"rowblocks{b.row_blocks}")
            return bind(k, v, rows, "rows", "rows")
        if v is not w or not packs_conv_weight(b):
            return None
        kxm = np.ascontiguousarray(v.data.reshape(v.type.shape[0], -1).T)  # type: ignore[union-attr]
        if b.k_steps is None:
            return bind(k, v, kxm, "kxm", "kxm")
        real, depth = b.k_steps  # each K step's rows, then zero rows to the tile's depth
        steps = -(-kxm.shape[0] // real)
        padded = np.zeros((steps, depth, kxm.shape[1]), kxm.dtype)
        for s in range(steps):
            rows = kxm[s * real:(s + 1) * real]
            padded[s, :rows.shape[0]] = rows
        return bind(k, v, padded.reshape(steps * depth, -1), f"kxm{depth}", f"kxm{real}of{depth}")

    def pack_siblings(k: int, v: Value) -> tuple[Value, Buffer] | str | None:
        if not any(v is w for w in weights):
            return None
        if v is not weights[0]:
            return DROP  # read through the packed weight
        packed = np.concatenate([w.data for w in weights], axis=1)
        return bind(k, v, packed, "siblings", f"siblings{len(weights)}")

    def pad(k: int, v: Value) -> tuple[Value, Buffer] | None:
        if v is not b.c.inputs[1]:
            return None
        padded = np.zeros((v.type.shape[0], b.pad_to), v.data.dtype)  # type: ignore[union-attr]
        padded[:, :b.n] = v.data
        return bind(k, v, padded, "padded", f"padded{b.pad_to}")

    b.panel_bufs = {}

    def panel(k: int, v: Value) -> tuple[Value, Buffer] | None:
        columns = panels.columns(b, v)
        if not columns:
            return None
        integer = panels.integer_panels(b) if b.acc_dtype is DType.INT32 else None
        data = panels.pack(panels.matrix(b, v), b.panel_width, columns, integer)
        bound = bind(k, v, data, f"panels{b.panel_width}", f"panels{b.panel_width}x{columns}")
        b.panel_bufs[id(v)] = bound[1]
        return bound

    substitute = (panel if b.panel_width else pack_siblings if b.sibling_of is not None
                  else pad if b.pad_to else pack)
    kp = kernel_params(b.group, substitute)
    b.bindings = kp.bindings
    b.sites = kp.sites
    return kp.params, kp.buffers


def packs_conv_weight(b: _Builder) -> bool:
    """A convolution whose constant weight only it reads: bound as a [K, M] copy."""
    w = b.c.inputs[1]
    return (isinstance(b.c.op, Conv) and not b.flip and w.is_constant
            and sum(x is w for n in b.group.nodes for x in n.inputs) == 1)


def packs_conv_rows(b: _Builder) -> bool:
    """A host's channel-rows convolution (not depthwise) whose constant weight only it
    reads: bound as its [Cout, K] view, so a weight tile fills by runs of whole K
    steps (``conv_rows.fills``), not by runs of a kernel row (3 of a 3 x 3)."""
    w = b.c.inputs[1]
    return (isinstance(b.c.op, Conv) and b.flip and not b.depthwise and w.is_constant
            and not b.target.device.max_block_threads
            and sum(x is w for n in b.group.nodes for x in n.inputs) == 1)


def pads_weight(b: _Builder) -> bool:
    """A single product by a constant [K, N] weight read only by it, on a target whose
    tiles load with 16-byte copies, where N elements are not whole 16-byte vectors."""
    c = b.c
    if b.mma_rows <= 1 or len(b.cs) > 1 or b.first is not None or not isinstance(c.op, MatMul):
        return False
    w = c.inputs[1]
    uses = sum(x is w for n in b.group.nodes for x in n.inputs)
    return (w.is_constant and w.type.rank == 2 and uses == 1
            and (b.n * w.type.dtype.itemsize) % 16 != 0)
