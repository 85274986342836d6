"""A loaded kernel module (.so) and its entry points: parameter lists read
from the module, argument checks, argument packing and the ctypes launch."""

from __future__ import annotations

import ctypes
import re
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from sharpinf.errors import BackendError
from sharpinf.runtime.backend import Kernel
from sharpinf.runtime.emu.memcheck import FAULT_WORDS

# (kind, width) -> (numpy scalar type, struct code). 'p' is a pointer.
_SCALARS = {
    ("i", 1): (np.int8, "b"), ("i", 2): (np.int16, "h"), ("i", 4): (np.int32, "i"), ("i", 8): (np.int64, "q"),
    ("u", 1): (np.uint8, "B"), ("u", 2): (np.uint16, "H"), ("u", 4): (np.uint32, "I"), ("u", 8): (np.uint64, "Q"),
    ("f", 4): (np.float32, "f"), ("f", 8): (np.float64, "d"), ("h", 2): (np.float16, "e"), ("b", 1): (np.bool_, "?"),
}
_KIND_WORDS = {"i": "signed int", "u": "unsigned int", "f": "float", "h": "__half", "b": "bool", "B": "__nv_bfloat16", "s": "struct"}


@dataclass(frozen=True)
class Param:
    kind: str  # p i u f h b B s
    width: int

    def describe(self) -> str:
        return "pointer" if self.kind == "p" else f"{_KIND_WORDS.get(self.kind, self.kind)} ({self.width} bytes)"


class EmuKernel(Kernel):
    """One entry point; `params` lists (kind, byte width) per parameter."""

    def __init__(self, module: "Module", index: int, name: str, params: list[Param]):
        self.module, self.index, self.name, self.params = module, index, name, params
        fmt = "<"
        self._scalar_types: list[Any] = []
        self._unsupported: str | None = None  # raised at launch, so sibling kernels stay usable
        for i, p in enumerate(params):
            if p.kind == "p":
                fmt += "Q"
                self._scalar_types.append(None)
                continue
            st = _SCALARS.get((p.kind, p.width))
            if st is None:
                self._unsupported = f"kernel {name}: parameter {i} of type {p.describe()} cannot be passed from Python"
                st = (type(None), "x" * p.width)
            fmt += st[1] + "x" * ((-p.width) % 8)
            self._scalar_types.append(st[0])
        self._struct = struct.Struct(fmt)
        self._is_ptr = [p.kind == "p" for p in params]

    def __repr__(self) -> str:
        return f"<EmuKernel {self.name}({', '.join(p.describe() for p in self.params)})>"

    def pack(self, args: Sequence[Any]) -> tuple[bytes, list[tuple[int, np.ndarray]]]:
        """The packed argument buffer (pointer slots hold the arrays' data pointers), and
        (index, array) for each pointer argument."""
        if self._unsupported:
            raise BackendError(self._unsupported)
        if len(args) != len(self.params):
            raise BackendError(f"kernel {self.name}: expects {len(self.params)} arguments, got {len(args)}")
        vals: list[Any] = []
        arrays: list[tuple[int, np.ndarray]] = []
        for i, (a, want) in enumerate(zip(args, self._scalar_types)):
            if want is None:
                if type(a) is not np.ndarray:
                    raise BackendError(
                        f"kernel {self.name}: argument {i} is a pointer; pass an array, got {type(a).__name__}"
                    )
                if not a.flags.c_contiguous:
                    raise BackendError(f"kernel {self.name}: argument {i} is a non-contiguous array; pass a C-contiguous one")
                vals.append(a.ctypes.data)
                arrays.append((i, a))
            elif type(a) is want:
                vals.append(a)
            else:
                raise BackendError(self._scalar_error(i, a, want))
        return self._struct.pack(*vals), arrays

    def _scalar_error(self, i: int, a: Any, want: type) -> str:
        p = self.params[i]
        what = f"kernel {self.name}: argument {i} is a {p.describe()} scalar; pass np.{want.__name__}"
        if isinstance(a, np.ndarray):
            return f"{what}, not an array"
        if isinstance(a, (bool, int, float)):
            return f"{what}({a!r}), not a Python {type(a).__name__}"
        return f"{what}, got {type(a).__name__}"


class Module:
    """A loaded kernel .so."""

    def __init__(self, path: Path):
        self.path = path
        lib = ctypes.CDLL(str(path))
        lib.sharpinf_emu_count.restype = ctypes.c_int
        lib.sharpinf_emu_name.restype = ctypes.c_char_p
        lib.sharpinf_emu_name.argtypes = [ctypes.c_int]
        lib.sharpinf_emu_sig.restype = ctypes.c_char_p
        lib.sharpinf_emu_sig.argtypes = [ctypes.c_int]
        u = ctypes.c_uint
        self._launch = lib.sharpinf_emu_launch
        self._launch.restype = ctypes.c_int
        self._launch.argtypes = [ctypes.c_int, u, u, u, u, u, u, ctypes.c_ulonglong, ctypes.c_char_p,
                                 ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_ulonglong,
                                 ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int,
                                 ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        self._err = ctypes.create_string_buffer(16384)
        self.fault = (ctypes.c_ulonglong * FAULT_WORDS)()  # strict memcheck's fault record (memcheck.py)
        self._fault_ptr = ctypes.addressof(self.fault)
        self.lib = lib
        self.kernels: dict[str, EmuKernel] = {}
        for i in range(lib.sharpinf_emu_count()):
            name = lib.sharpinf_emu_name(i).decode()
            sig = lib.sharpinf_emu_sig(i).decode()
            params = [Param(s[0], int(s[1:])) for s in sig.split(",")] if sig else []
            self.kernels[name] = EmuKernel(self, i, name, params)

    def launch(self, k: EmuKernel, grid, block, shared: int, packed: bytes, order: int, strict: bool,
               workers: int, seed: int, memcheck: int = 0, guards: bytes = b"", check: int = 0,
               cooperative: bool = False) -> int:
        """0, else bit 0: the launch failed (error(), and `fault` in strict memcheck);
        bit 1: a guard range of `guards` (address, length pairs) was overwritten.
        check: shared-memory checks, bit 0 racecheck, bit 1 initcheck (a checked build only);
        cooperative: every block resident at once, each on its own OS thread (emu_sched.cpp)."""
        return self._launch(k.index, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared, packed,
                            order, strict, workers, seed, self._err, 16384, memcheck, guards, len(guards) >> 4,
                            self._fault_ptr, check, int(cooperative))

    def error(self) -> str:
        """The failed launch's message, code addresses turned into file:line."""
        return symbolize(self._err.value.decode(errors="replace"))


_PC = re.compile(r"\[\[pc:(.+?)\+0x([0-9a-f]+)\]\]")


def symbolize(msg: str) -> str:
    """[[pc:MODULE+0xOFF]] (emu_racecheck.cpp) -> file:line of that code, by addr2line on the module's
    line tables (a checked build has them); the raw offset when addr2line cannot tell."""
    hits = _PC.findall(msg)
    if not hits:
        return msg
    lines: dict[tuple[str, str], str] = {}
    for so, off in dict.fromkeys(hits):
        # the return address is the instruction after the hook's call: step back into the call
        where = _addr2line(so, int(off, 16) - 1)
        lines[(so, off)] = where or f"{Path(so).name}+0x{off}"
    return _PC.sub(lambda m: lines[(m.group(1), m.group(2))], msg)


def _addr2line(so: str, off: int) -> str | None:
    try:
        out = subprocess.run(["addr2line", "-e", so, "-i", f"{off:#x}"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    # one "file:line [(discriminator n)]" per inlined frame, innermost first
    frames = [ln.split(" (")[0].strip() for ln in out.splitlines()]
    frames = [f"{Path(f.rsplit(':', 1)[0]).name}:{f.rsplit(':', 1)[1]}" for f in frames
              if ":" in f and not f.startswith("??") and not f.endswith(":0")]
    if not frames:
        return None
    # the access itself, and the kernel source line it is inlined into (not the emulator's launch glue)
    inner = frames[0]
    outer = next((f for f in reversed(frames) if not f.startswith(("emu_entry.h", "cuda_emu", "<"))), inner)
    return inner if inner == outer else f"{inner} (in {outer})"
