"""Prepared launches and graph capture for the emulator.

A prepared emulator launch keeps its packed argument bytes (real data pointers) and,
for each array argument, a weak reference to the array owning the memory plus the
owner's data pointer (and, for owners with memcheck guards, their guard ranges, which
the runtime checks after the launch: memcheck.py). Running it after that owner was freed
or replaced raises instead of touching dead memory: the bug a CUDA graph (or a reused
launch plan) would hit silently on a GPU, where the old pointer is baked in. As on
CUDA, `run` inside `capture()` records the launches instead of running them; replay
runs the record.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from sharpinf.errors import BackendError
from sharpinf.runtime.backend import Graph, Launch
from sharpinf.runtime.emu.memcheck import GuardedBuffer


def _owner(a: np.ndarray) -> np.ndarray:
    """The ndarray that owns a view's memory (views die young; owners matter)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


@dataclass(eq=False)
class EmuHandle:
    packed: bytes
    refs: list[tuple[int, Any, int]]  # (arg index, weakref to owner, owner data pointer)
    guarded: list[tuple[list[int], Any, int]]  # per GuardedBuffer owner: (arg indices, weakref, view nbytes)
    guards: bytes  # those owners' guard ranges, as the runtime reads them (GuardedBuffer.spec)


def make_handle(packed: bytes, arrays: list[tuple[int, np.ndarray]]) -> EmuHandle:
    refs: list[tuple[int, Any, int]] = []
    guarded: list[tuple[list[int], Any, int]] = []
    spec = b""
    for i, a in arrays:
        o = _owner(a)
        ref = weakref.ref(o)
        refs.append((i, ref, o.ctypes.data))
        if type(o) is GuardedBuffer:
            for g in guarded:
                if g[1]() is o:  # the same owner again
                    g[0].append(i)
                    break
            else:
                guarded.append(([i], ref, a.nbytes))
                spec += o.spec
    return EmuHandle(packed, refs, guarded, spec)


def check_alive(launches: Sequence[Launch], what: str) -> None:
    for l in launches:
        for i, ref, ptr in l.handle.refs:
            o = ref()
            if o is None or o.ctypes.data != ptr:
                raise BackendError(f"{what}: argument {i} of kernel {l.name} was reallocated after capture")


class EmuGraph(Graph):
    def __init__(self, run: Callable[[Sequence[Launch]], None]):
        self._run = run
        self.launches: list[Launch] = []

    def replay(self) -> None:
        check_alive(self.launches, "graph replay")
        self._run(self.launches)


@contextmanager
def capturing(owner, run) -> Iterator[EmuGraph]:
    """Sets owner._graph for the `with` body; runs go to the graph."""
    if owner._graph is not None:
        raise BackendError("graph capture already in progress")
    g = EmuGraph(run)
    owner._graph = g
    try:
        yield g
    finally:
        owner._graph = None
