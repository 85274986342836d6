"""Emulator memcheck: device allocations with guard bytes, checked after every launch.

Guard mode (the default): each EmuBackend allocation is carved out of a larger buffer
(a GuardedBuffer, the owner of the user's view):

    [pad][GUARD_LEN guard bytes][user region, 64-aligned][GUARD_LEN guard bytes][pad]

After a launch the runtime compares the guards of that launch's array arguments with
GUARD_BYTE (emu_sched.cpp, guards_intact); a store just past either end is reported with
the kernel, the argument and the byte offsets, and the guards are refilled. Stores that
jump over a guard, stores between views of one allocation, and every out-of-bounds load
go unseen; arrays the backend did not allocate are not checked.

Strict mode: each allocation is its own mapping, PROT_NONE pages around the data:

    [PROT_NONE page][gap: guard bytes][user region][PROT_NONE page]

The region ends flush with the trailing page, so the first byte loaded or stored past
the end faults; the runtime turns the fault into a launch failure naming the block and
thread (emu_sched.cpp, on_fault), and `fault_message` maps the address to an argument.
Flush means the start is aligned only to the largest power of two dividing the size
(16 or more for any size that is a multiple of 16, the dtype's alignment at least): a
kernel making 16-byte vector loads over a buffer whose size is not a multiple of 16
may fault on a misaligned aligned-load here (reported as a general protection fault).
The start has no page beside it: a store into the gap is caught by its guard bytes, a
load there is not; a load before the start faults only once it passes the gap (a page
minus the size mod a page; no gap for whole pages). Each allocation costs a mapping and
at least three pages. The fault is recovered in process, not in a forked child: kernel
code holds no locks and a failing block is already abandoned that way (__trap), and a
child could not hand the kernel's writes back.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import os
import signal
import struct
from typing import Any

import numpy as np

from sharpinf.errors import BackendError

OFF, GUARD, STRICT = 0, 1, 2  # the runtime's LaunchCfg.memcheck codes
MODES = {"off": OFF, "on": GUARD, "strict": STRICT}  # "on": guard bytes only
GUARD_LEN = 256  # bytes of guard on each side in guard mode
GUARD_BYTE = 0xA5  # must match emu_sched.cpp
ALIGN = 64  # user region alignment, guard mode
PAGE = mmap.PAGESIZE
_PROT_NONE = 0
_SPEC = struct.Struct("<QQ")  # one guard range for the runtime: address, length


def mode_from(value: str | bool | None) -> int:
    """memcheck setting -> mode code; None reads SHARPINF_EMU_MEMCHECK (default: guard)."""
    if value is None:
        value = os.environ.get("SHARPINF_EMU_MEMCHECK", "")
    if isinstance(value, bool):
        return GUARD if value else OFF
    v = str(value).strip().lower()
    if v in ("", "1", "on", "true", "yes", "guard"):
        return GUARD
    if v in ("0", "off", "false", "no"):
        return OFF
    if v in ("2", "strict"):
        return STRICT
    raise BackendError(f"emu: unknown memcheck setting {value!r}; choose on, off or strict")


class GuardedBuffer(np.ndarray):
    """The uint8 owner of one guarded allocation; the user holds a view of its middle.

    user: (offset, nbytes) of the user region; guards: [(offset, length)] of guard bytes;
    spec: the guard ranges as the runtime reads them; lo, hi: [lo, hi) the addresses
    owned, PROT_NONE pages included; made: (shape, dtype) as allocated, for `label`."""

    user: tuple[int, int]
    guards: list[tuple[int, int]]
    spec: bytes
    lo: int
    hi: int
    made: tuple[tuple[int, ...], np.dtype]

    @property
    def label(self) -> str:
        """The allocation as the user sees it: "float32[128]", "float16[3,5]"."""
        return _label(*self.made)


def _label(shape: tuple[int, ...], dtype: np.dtype) -> str:
    return f"{dtype.name}[{','.join(map(str, shape))}]"


def _address(buf: np.ndarray) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))  # a quarter of the cost of buf.ctypes.data


def _finish(buf: GuardedBuffer, base: int, user_off: int, nbytes: int, guards: list[tuple[int, int]],
            shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    buf.user, buf.guards, buf.lo, buf.hi, buf.made = (user_off, nbytes), [g for g in guards if g[1]], base, \
        base + buf.size, (shape, dtype)
    buf.spec = b"".join([_SPEC.pack(base + o, n) for o, n in buf.guards])
    fill_guards(buf)
    # buffer= makes `buf` the view's base, so graph.py's owner walk stops at it
    return np.ndarray(shape, dtype, buffer=buf, offset=user_off)


def _guarded(shape: tuple[int, ...], dtype: np.dtype, nbytes: int) -> np.ndarray:
    buf = np.ndarray.__new__(GuardedBuffer, (ALIGN - 1 + 2 * GUARD_LEN + nbytes,), np.uint8)
    base = _address(buf)
    user_off = (-(base + GUARD_LEN)) % ALIGN + GUARD_LEN
    guards = [(user_off - GUARD_LEN, GUARD_LEN), (user_off + nbytes, GUARD_LEN)]
    return _finish(buf, base, user_off, nbytes, guards, shape, dtype)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def _strict(shape: tuple[int, ...], dtype: np.dtype, nbytes: int) -> np.ndarray:
    data = max(1, -(-nbytes // PAGE)) * PAGE
    mm = mmap.mmap(-1, data + 2 * PAGE)
    buf = np.ndarray.__new__(GuardedBuffer, (data + 2 * PAGE,), np.uint8, buffer=mm)  # base: the mmap
    base = _address(buf)
    for at in (base, base + PAGE + data):
        if _libc.mprotect(at, PAGE, _PROT_NONE) != 0:
            raise BackendError(f"emu memcheck: mprotect failed: {os.strerror(ctypes.get_errno())}")
    user_off = PAGE + data - nbytes  # flush with the trailing page
    guards = [(PAGE, user_off - PAGE)]
    return _finish(buf, base, user_off, nbytes, guards, shape, dtype)


def allocate(shape: Any, dtype: Any, mode: int) -> np.ndarray:
    """An uninitialised C-contiguous array of shape/dtype, guarded as `mode` says."""
    dtype = np.dtype(dtype)
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
    if mode == OFF:
        return np.empty(shape, dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    return (_strict if mode == STRICT else _guarded)(shape, dtype, nbytes)


def fill_guards(buf: GuardedBuffer) -> None:
    for o, n in buf.guards:
        buf[o:o + n] = GUARD_BYTE


def _what(buf: GuardedBuffer, idx: list[int], view_nbytes: int, names: list[str] | None) -> str:
    """`out` (argument 2, float32[128]) -- the parameter's name where the kernel's source tells it."""
    view = "" if view_nbytes == buf.user[1] else "a view into "
    args = f"argument {idx[0]}" if len(idx) == 1 else "arguments " + ", ".join(map(str, idx))
    named = " and ".join(f"`{names[i]}`" for i in idx) + " " if names else ""
    return f"{named}({args}, {view}{buf.label})"


def _where(buf: GuardedBuffer, first: int, last: int) -> str:
    """Bytes [first, last] relative to the start of buf's region, as elements of its dtype:
    'element 128 (byte +0 past the end)', 'elements -3..-1 (bytes -12..-1 before the start)'."""
    size, n = buf.made[1].itemsize, buf.user[1]
    e0, e1 = first // size, last // size
    elems = f"element {e0}" if e0 == e1 else f"elements {e0}..{e1}"
    if first >= n:
        a, b, side = f"+{first - n}", f"+{last - n}", "past the end"
    else:
        a, b, side = str(first), str(last), "before the start"
    span = f"byte {a}" if a == b else f"bytes {a}..{b}"
    return f"{elems} ({span} {side})"


def guard_report(kernel: str, guarded: list[tuple[list[int], GuardedBuffer, int]], names: list[str] | None = None) -> str:
    """What the launch wrote into guards of its arguments (then refilled); '' if nothing.
    guarded: (argument indices, owner, nbytes of the argument view) per owner; names: the
    kernel's parameter names, where known."""
    found = []
    for idx, buf, view_nbytes in guarded:
        u0, n = buf.user
        for o, ln in buf.guards:
            bad = np.flatnonzero(buf[o:o + ln] != GUARD_BYTE)
            if not bad.size:
                continue
            first, last = o + int(bad[0]) - u0, o + int(bad[-1]) - u0  # relative to the region's start
            side = "past the end of" if first >= n else "before the start of"
            found.append(f"memcheck: kernel {kernel} wrote {bad.size} byte{'s' * (bad.size > 1)} {side} "
                         f"{_what(buf, idx, view_nbytes, names)}: {_where(buf, first, last)}")
        fill_guards(buf)
    return "; ".join(found)


FAULT_WORDS = 11  # the runtime's fault record, see emu_sched.cpp (Fault)


def fault_message(kernel: str, fault: Any, block_dim: tuple[int, int, int],
                  guarded: list[tuple[list[int], GuardedBuffer, int]], names: list[str] | None = None) -> str:
    """A strict-mode fault record -> 'memcheck: kernel K, block (..), thread T read past the end of `x`
    (argument i, float32[256]): element 256 (byte +0 past the end)'."""
    _, addr, access, bx, by, bz, lin, tx, ty, tz, sig = (int(v) for v in fault)
    thread = f"{lin}" if block_dim[1:] == (1, 1) else f"{lin} ({tx},{ty},{tz})"
    who = f"memcheck: kernel {kernel}, block ({bx},{by},{bz}), thread {thread}"
    verb = ("read", "wrote", "accessed")[min(access, 2)]
    for idx, buf, view_nbytes in guarded:
        if not buf.lo <= addr < buf.hi:
            continue
        off = addr - (buf.lo + buf.user[0])  # relative to the region's start
        side = "past the end of" if off >= buf.user[1] else "before the start of"
        return f"{who} {verb} {side} {_what(buf, idx, view_nbytes, names)}: {_where(buf, off, off)}"
    what = "SIGBUS" if sig == signal.SIGBUS else "SIGSEGV"
    if access == 2 and addr == 0:
        return f"{who}: {what} (a general protection fault: a misaligned vector access or a non-canonical address?)"
    return f"{who} {verb} at address {addr:#x} ({what}): not next to any argument of this launch (a wild pointer?)"
