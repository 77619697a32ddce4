"""The one exception hierarchy of tilefuse.

Each error carries its context once, added where it is known (the ONNX node, the
input name, the kernel). The CLI prints ``str(error)`` on one line and exits 2.
"""
from __future__ import annotations

from dataclasses import dataclass


class TilefuseError(Exception):
    """Base of every error tilefuse raises on purpose."""


class ModelLoadError(TilefuseError):
    """The model file cannot be read: missing, truncated, not ONNX, invalid, unsafe."""


@dataclass(frozen=True)
class UnsupportedOp:
    domain: str
    op_type: str
    opset: int
    nodes: tuple[str, ...]
    reason: str = ""

    def __str__(self) -> str:
        domain = self.domain or "ai.onnx"
        names = ", ".join(self.nodes[:5]) + (f", ... ({len(self.nodes)} nodes)" if len(self.nodes) > 5 else "")
        why = f" [{self.reason}]" if self.reason and self.reason != "no converter" else ""
        return f"{domain}::{self.op_type} (opset {self.opset}) at {names}{why}"


class UnsupportedOpError(TilefuseError):
    """The model uses ops tilefuse does not support; lists every one."""

    def __init__(self, ops: list[UnsupportedOp]) -> None:
        self.ops = ops
        listing = "; ".join(str(op) for op in ops)
        super().__init__(f"{len(ops)} unsupported op type(s): {listing}")


class ShapeError(TilefuseError):
    """A shape is unknown, unbound or inconsistent."""


class InputError(TilefuseError):
    """Inputs given by the user do not match the model: names, shapes, dtypes."""


class ConversionError(TilefuseError):
    """An ONNX node could not be converted to primitives (its name and op in the message)."""


class GraphError(TilefuseError):
    """The graph IR broke an invariant: a bug in tilefuse, never the user's fault."""


class ExecutionError(TilefuseError):
    """A step failed while running (for example an index out of range in a gather)."""


class CompileError(TilefuseError):
    """A kernel failed to compile: kernel name, source path and compiler output."""


class PlanError(TilefuseError):
    """A plan is corrupt, of another version, or does not match its files."""
