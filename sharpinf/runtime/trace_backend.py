"""TraceBackend: every launch checked and counted, none run -- the host side of a step,
measured on a machine without a GPU.

Kernels are compiled for the emulator only to learn their parameter lists, so a launch is
validated exactly as the emulator validates it (argument count, pointer vs scalar, C type).
Arrays are zero-filled host arrays; nothing writes them, so a "sampled" token is 0. `run`
makes one Python call per launch, as the CUDA backend makes one cuLaunchKernel call; a
graph replay is one call, as on CUDA. What it cannot show: the driver's own cost per
launch (~2-4 us of CPU in cuLaunchKernel) and per graph launch.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from sharpinf.errors import BackendError
from sharpinf.runtime.backend import Graph, Launch
from sharpinf.runtime.emu_backend import EmuBackend


@dataclass
class TraceCounts:
    launches: int = 0  # kernel launches run eagerly
    graph_replays: int = 0
    graph_launches: int = 0  # kernel launches inside the replayed graphs
    log: list[Launch] | None = None  # every launch run (eagerly or by replay), when kept

    def reset(self, keep_log: bool = False) -> None:
        self.launches = self.graph_replays = self.graph_launches = 0
        self.log = [] if keep_log else None


class TraceGraph(Graph):
    def __init__(self, backend: "TraceBackend"):
        self._backend = backend
        self.launches: list[Launch] = []
        self._done = False

    def replay(self) -> None:
        if not self._done:
            raise BackendError("graph replayed before its capture finished")
        c = self._backend.counts
        c.graph_replays += 1
        c.graph_launches += len(self.launches)
        if c.log is not None:
            c.log.extend(self.launches)


class TraceBackend(EmuBackend):
    name = "trace"
    gpu_shapes = True  # launchers choose the grids they would on a GPU
    multiprocessors = 132  # an H100's or H200's (the launches it counts are that GPU's)

    def __init__(self):
        super().__init__(memcheck="off")  # nothing runs: plain (lazily zeroed) arrays, no guard checks
        self.counts = TraceCounts()
        self._capture: TraceGraph | None = None

    def run(self, launches: Sequence[Launch]) -> None:
        if self._capture is not None:
            self._capture.launches.extend(launches)
            return
        note = self._note
        for l in launches:
            note(l)

    def _note(self, l: Launch) -> None:
        c = self.counts
        c.launches += 1
        if c.log is not None:
            c.log.append(l)

    # -- memory: zero-filled host arrays -------------------------------------------
    def empty(self, shape, dtype) -> np.ndarray:
        return np.zeros(shape, dtype)

    @contextmanager
    def capture(self) -> Iterator[Graph]:
        if self._capture is not None:
            raise BackendError("graph capture already in progress")
        g = self._capture = TraceGraph(self)
        try:
            yield g
        finally:
            self._capture = None
        g._done = True

    def describe(self) -> dict[str, Any]:
        return {"backend": "trace", "device": "trace (launches validated and counted, not run)",
                "compiler": super().describe()["compiler"]}
