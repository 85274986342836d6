"""Graph capture for the emulator. As on CUDA, launches inside `capture()` are
recorded, not run; replay re-runs them with the recorded pointers. Each array
argument's owning buffer is held by weak reference, so replaying after that
buffer was freed or replaced raises instead of touching dead memory."""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from sharpinf.errors import BackendError
from sharpinf.runtime.backend import Graph


def _owner(a: np.ndarray) -> np.ndarray:
    """The ndarray that owns a view's memory (views die young; owners matter)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


@dataclass
class _Launch:
    kernel: Any
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int
    packed: bytes
    refs: list[tuple[int, Any, int]]  # (arg index, weakref to owner, owner data pointer)


class EmuGraph(Graph):
    def __init__(self, run: Callable[[_Launch], None]):
        self._run = run
        self.launches: list[_Launch] = []

    def record(self, kernel, grid, block, shared, packed, arrays: list[tuple[int, np.ndarray]]) -> None:
        refs = []
        for i, a in arrays:
            o = _owner(a)
            refs.append((i, weakref.ref(o), o.ctypes.data))
        self.launches.append(_Launch(kernel, grid, block, shared, packed, refs))

    def replay(self) -> None:
        for l in self.launches:
            for i, ref, ptr in l.refs:
                o = ref()
                if o is None or o.ctypes.data != ptr:
                    raise BackendError(
                        f"graph replay: argument {i} of kernel {l.kernel.name} was reallocated after capture"
                    )
        for l in self.launches:
            self._run(l)


@contextmanager
def capturing(owner, run) -> Iterator[EmuGraph]:
    """Sets owner._graph for the `with` body; launches go to the graph."""
    if owner._graph is not None:
        raise BackendError("graph capture already in progress")
    g = EmuGraph(run)
    owner._graph = g
    try:
        yield g
    finally:
        owner._graph = None
