"""What every primitive is: a frozen record of parameters plus its rules.

A primitive knows its output types (``infer``), its numpy reference (``evaluate``), and
its cost alone (``flops``; bytes are the inputs' and outputs' sizes). Instances are
frozen and hashable, so equal primitives compare equal and can key caches.
"""
from __future__ import annotations

import enum
from dataclasses import fields
from typing import ClassVar, Sequence

import numpy as np

from tilefuse.ir.types import TensorType


class Kind(enum.Enum):
    """The five primitive families of DESIGN.md, in fusion-lattice order."""

    INDEX = "index"
    MAP = "map"
    REDUCE = "reduce"
    CONTRACT = "contract"
    OPAQUE = "opaque"


class Primitive:
    kind: ClassVar[Kind]
    arity: ClassVar[int | None] = None  # None: variadic
    num_outputs: ClassVar[int] = 1

    def infer(self, inputs: Sequence[TensorType]) -> tuple[TensorType, ...]:
        raise NotImplementedError

    def evaluate(self, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        raise NotImplementedError

    def flops(self, inputs: Sequence[TensorType], outputs: Sequence[TensorType]) -> int:
        raise NotImplementedError

    @property
    def name(self) -> str:
        return type(self).__name__

    def params(self) -> dict[str, object]:
        # A reduction's function is already in its name (reduce_sum, argmax, window_max).
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "fn"}  # type: ignore[arg-type]

    def __str__(self) -> str:
        ps = ", ".join(f"{k}={_fmt(v)}" for k, v in self.params().items())
        return f"{self.name}({ps})" if ps else self.name


def _fmt(v: object) -> str:
    if isinstance(v, enum.Enum):
        return v.name.lower()
    return str(v)


def check_arity(prim: Primitive, inputs: Sequence[object]) -> None:
    if prim.arity is not None and len(inputs) != prim.arity:
        raise TypeError(f"{prim.name} takes {prim.arity} inputs, got {len(inputs)}")
