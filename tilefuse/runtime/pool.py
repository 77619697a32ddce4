"""A pool of arenas: each concurrent ``run`` gets one of its own, reused afterwards.

Arenas are never shared between runs in flight, so runs on one session from several
threads cannot see each other's intermediates. The pool grows to the largest number of
runs ever in flight at once and keeps those arenas for reuse (allocating and first
touching a large arena on every run would cost page faults each time).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Generic, Iterator, TypeVar

import numpy as np

from tilefuse.plan.model import ALIGN

T = TypeVar("T")


class ArenaPool(Generic[T]):
    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._free: list[T] = []
        self._lock = threading.Lock()

    @contextmanager
    def take(self) -> Iterator[T]:
        """An arena for the duration of the ``with`` block; its contents are undefined."""
        with self._lock:
            arena = self._free.pop() if self._free else None
        if arena is None:
            arena = self._make()  # outside the lock: allocation may be slow
        try:
            yield arena
        finally:
            with self._lock:
                self._free.append(arena)

    def get(self) -> T:
        """An arena to use until ``put`` back (``take`` without a context manager)."""
        with self._lock:
            if self._free:
                return self._free.pop()
        return self._make()  # outside the lock: allocation may be slow

    def put(self, arena: T) -> None:
        with self._lock:
            self._free.append(arena)

    def __len__(self) -> int:
        return len(self._free)


def aligned_empty(nbytes: int) -> np.ndarray:
    """Uninitialised uint8 memory whose first byte is ALIGN-aligned (the slice keeps its
    over-allocated base alive)."""
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start : start + nbytes]
