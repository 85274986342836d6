"""Kernel objects cached per backend, so launchers can ask for them on every call."""

from __future__ import annotations

import weakref

from sharpinf.runtime.backend import Backend, Kernel

_cache: "weakref.WeakKeyDictionary[Backend, dict[tuple[str, str], Kernel]]" = weakref.WeakKeyDictionary()


class WantedKernel(Kernel):
    """What kernel() hands out inside backend.collecting(): a name, nothing compiled."""

    def __init__(self, filename: str, name: str):
        self.filename, self.name = filename, name


def kernel(be: Backend, filename: str, name: str) -> Kernel:
    if be.collect(filename, name):
        return WantedKernel(filename, name)
    per_backend = _cache.setdefault(be, {})
    key = (filename, name)
    k = per_backend.get(key)
    if k is None:
        k = per_backend[key] = be.kernel(filename, name)
    return k


def one_wave(be: Backend, k: Kernel, blocks: int, threads: int) -> int:
    """A grid of `blocks`, at most as many as the device holds at once: what a cooperative kernel
    (its grid barriers) or a streaming one (each warp walking many rows) launches. Inside
    backend.collecting() nothing is compiled to ask: `blocks` as given."""
    return blocks if isinstance(k, WantedKernel) else min(blocks, be.resident_blocks(k, threads))

