"""The converter registry: one converter per (domain, ONNX op) and opset range.

Converters register with a decorator::

    @converter("Softmax", since=13)
    def softmax(ctx: NodeContext) -> Values: ...

Ranges for one op may not overlap; that is checked when the converter is registered
(so at import time). ``tilefuse ops`` and the README's op table read this registry.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:
    from tilefuse.frontend.context import NodeContext
    from tilefuse.ir.graph import Value

ONNX_DOMAIN = ""
Converter = Callable[["NodeContext"], "Sequence[Value | None] | Value"]


@dataclass(frozen=True)
class Entry:
    domain: str
    op_type: str
    since: int
    until: int | None  # inclusive; None = up to the newest opset
    fn: Converter
    note: str = ""

    def covers(self, opset: int) -> bool:
        return self.since <= opset and (self.until is None or opset <= self.until)


_REGISTRY: dict[tuple[str, str], list[Entry]] = {}


def converter(
    op_type: str, *, since: int = 1, until: int | None = None, domain: str = ONNX_DOMAIN, note: str = ""
) -> Callable[[Converter], Converter]:
    def register(fn: Converter) -> Converter:
        entry = Entry(domain, op_type, since, until, fn, note)
        entries = _REGISTRY.setdefault((domain, op_type), [])
        for other in entries:
            hi, other_hi = entry.until or 10**9, other.until or 10**9
            if entry.since <= other_hi and other.since <= hi:
                raise RuntimeError(f"overlapping opset ranges for {domain or 'ai.onnx'}::{op_type}")
        entries.append(entry)
        entries.sort(key=lambda e: e.since)
        return fn

    return register


def lookup(domain: str, op_type: str, opset: int) -> Entry | None:
    domain = ONNX_DOMAIN if domain == "ai.onnx" else domain
    for entry in _REGISTRY.get((domain, op_type), []):
        if entry.covers(opset):
            return entry
    return None


def known(domain: str, op_type: str) -> bool:
    domain = ONNX_DOMAIN if domain == "ai.onnx" else domain
    return (domain, op_type) in _REGISTRY


def entries() -> list[Entry]:
    """Every registered converter, sorted by domain and op."""
    _load_converters()
    return sorted((e for es in _REGISTRY.values() for e in es), key=lambda e: (e.domain, e.op_type, e.since))


def _load_converters() -> None:
    import tilefuse.frontend.converters  # noqa: F401  (registers on import)
