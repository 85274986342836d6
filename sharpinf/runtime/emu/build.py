"""g++ builds for the emulator, cached by content hash.

A kernel module is one translation unit: cuda_emu.h (force-included), the
kernel source (with dynamic shared memory rewritten and each static __shared__
array registered, #line keeping the real file:line), then a trailer registering
each entry point. The source and the local headers it includes are written,
rewritten alike, into one build folder, so the includes find the rewritten ones.
A checked module (racecheck/initcheck) is compiled with -fsanitize=thread and
linked without its runtime: g++ calls __tsan_readN/__tsan_writeN before each
memory access, and the emulator's runtime answers them (emu_racecheck.cpp). It links against the
shared runtime library (scheduler + fibers, one per cache key, found through
rpath $ORIGIN), so all modules share one TLS block and one fiber-stack pool.
The key covers the source, every local header it includes, the emulator's own
files, the flags, the g++ version and the CPU (because of -march=native).
The headers every module starts with (cuda_emu.h, which reads CUDA's cuda_fp16.h and
cuda_bf16.h, and emu_entry.h's <string> and <tuple>: ~40k lines) are precompiled once
per set of flags (precompiled_header): parsing them took 0.3-0.5 s of every module's build
(CPU time, g++ 12: rmsnorm.cu 0.6 -> 0.35 s, attention.cu 2.8 -> 2.45 s)."""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from sharpinf.errors import BackendError
from sharpinf.runtime import paths
from sharpinf.runtime.emu import EMU_DIR
from sharpinf.runtime.emu.source import (angle_includes_in, local_headers, register_static_shared, rewrite_dynamic_shared,
                                         scanned_entry_names)

RUNTIME_SOURCES = ("emu_sched.cpp", "emu_fiber.cpp", "emu_racecheck.cpp")
# A checked build: every load and store calls __tsan_{read,write}N (the runtime's shared-memory
# checker answers; ThreadSanitizer's own runtime is never linked), reads and writes apart -- ASan's
# instrumentation merges a read and a write of one address, which would hide the write of
# `s[t] += ...`; line tables so reports can name file:line, and nothing more (variable tracking,
# which -g1 does not use, was a third of a big module's g++ time).
CHECKED_FLAGS = ["-fsanitize=thread", "--param", "tsan-distinguish-volatile=0",
                 "--param", "tsan-instrument-func-entry-exit=0", "-g1", "-gdwarf-4",
                 "-gno-statement-frontiers", "-gno-variable-location-views", "-fno-var-tracking",
                 "-fno-var-tracking-assignments", "-DSHARPINF_EMU_RACECHECK"]
# The runtime (fiber switches, warp exchanges: every kernel's hot path) at -O2; kernel modules at -O1:
# g++ takes half the time on the big template-heavy files (attention_flash.cu: 22 -> 12 s, checked
# 41 -> 18 s) and the tests run them as fast (forward oracles within run-to-run noise; checked kernel
# tests a little faster); CI builds every module cold.
RUNTIME_OPT, KERNEL_OPT = "-O2", "-O1"
# Kernel modules throw nothing (a failing thread leaves by a fiber switch): without exception tables
# g++ builds them in ~15% less time (kernels_cu/ cold: 279 -> 239 s of CPU).
KERNEL_FLAGS = [KERNEL_OPT, "-fno-exceptions"]
BASE_FLAGS = ["-march=native", "-fPIC", "-std=c++17", "-fno-strict-aliasing", "-fvisibility=hidden"]


def _glibc_version() -> tuple[int, int]:
    try:
        name, ver = os.confstr("CS_GNU_LIBC_VERSION").split()  # "glibc 2.36"
        major, minor = ver.split(".")[:2]
        return (int(major), int(minor)) if name == "glibc" else (0, 0)
    except (AttributeError, ValueError, OSError):
        return (0, 0)


def tlsdesc_is_safe() -> bool:
    """Whether -mtls-dialect=gnu2 (TLS descriptors) is safe with this C library.

    g++ assumes a TLS descriptor call preserves every register but %rax, vector
    registers included, and keeps floats live in xmm registers across it. Before
    glibc 2.40 (BZ #31372) the slow path of _dl_tlsdesc_dynamic - the first access
    to a dlopen'ed module's TLS in a thread, or the first after another dlopen -
    calls __tls_get_addr -> malloc/memcpy/memset, which clobber xmm registers: a
    kernel storing a float to a static __shared__ array (thread_local here) could
    store garbage, depending on how many modules the process had loaded."""
    return _glibc_version() >= (2, 40)


if platform.machine() in ("x86_64", "AMD64") and tlsdesc_is_safe():
    # TLS descriptors: threadIdx & co. live in TLS of a dlopen'ed module; this
    # makes each access a cheap indirect call instead of __tls_get_addr. Older
    # glibc gets the classic __tls_get_addr sequence: an ordinary call, so the
    # compiler treats the vector registers as clobbered (see tlsdesc_is_safe).
    BASE_FLAGS.append("-mtls-dialect=gnu2")

_lock = threading.Lock()
compile_count = 0  # g++ invocations in this process (tests check cache hits)


def cxx() -> str:
    return os.environ.get("CXX", "g++")


@functools.cache
def gxx_version() -> str:
    try:
        out = subprocess.run([cxx(), "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise BackendError(f"emu backend: cannot run {cxx()} ({exc}); install g++") from exc
    return out.splitlines()[0].strip()


@functools.cache
def _cpu_id() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags")):
                return line
    except OSError:
        pass
    return platform.processor()


def _local_dirs(src_dir: Path | None) -> list[Path]:
    """The folders of a kernel's local headers: its own, then kernels_cu/."""
    dirs = [src_dir] if src_dir is not None else []
    try:
        dirs.append(paths.kernels_dir())
    except BackendError:
        pass
    return dirs


def include_flags(src_dir: Path | None, local: bool = True) -> list[str]:
    """-I for: the source's folder, kernels_cu/ (local: a kernel's headers), the CUDA headers, then
    our shims (crt/host_defines.h, nv/target) for CUDA header sets that lack them."""
    dirs = [*(_local_dirs(src_dir) if local else []), EMU_DIR, *paths.cuda_include_dirs(), EMU_DIR / "shim"]
    return [f"-I{d}" for d in dict.fromkeys(dirs)]


@functools.cache
def _emu_files_digest() -> str:
    h = hashlib.sha256()
    for f in sorted(EMU_DIR.rglob("*")):
        # the runtime's sources, and the Python that rewrites kernel sources (build.py, source.py)
        if f.is_file() and (f.suffix in (".h", ".cpp", "") or f.name in ("build.py", "source.py")) \
                and "__pycache__" not in f.parts:
            h.update(f.relative_to(EMU_DIR).as_posix().encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def _key(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for p in (_emu_files_digest(), gxx_version(), _cpu_id(), platform.machine(), *parts):
        h.update(p if isinstance(p, bytes) else p.encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


def _run_gxx(args: list[str], what: str) -> None:
    global compile_count
    compile_count += 1
    proc = subprocess.run([cxx(), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        log = (proc.stderr + proc.stdout).strip()
        raise BackendError(f"emu: g++ failed to compile {what}:\n{log}")


def _atomic_build(out: Path, build) -> Path:
    """Build into a temp name and rename, so concurrent processes never load a half-written file
    (and, under paths.one_builder, never build it twice)."""
    if out.exists():
        return out
    with paths.one_builder(out):
        if out.exists():  # another process built it while this one waited
            return out
        return _build_aside(out, build)


def _build_aside(out: Path, build) -> Path:
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=out.suffix)
    os.close(fd)
    try:
        build(Path(tmp))
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _write_sources(folder: Path, src: Path, text: str, headers: list[Path], name_expressions: tuple[str, ...],
                   cflags: list[str]) -> Path:
    """The translation unit and the local headers it includes, rewritten for g++, in `folder`
    (made aside and renamed, like every build product), with the flags that compile it (for
    preprocess_module); returns the unit's path. The unit is the rewritten source (<stem>.body.cpp)
    then the trailer of its entry points, found by preprocessing the source (_scan_entries)."""
    if not folder.exists():
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=folder.name + "."))
        try:
            flags = [f"-I{folder}", *cflags]
            (tmp / "cflags").write_text("\n".join(flags))
            for h in headers:
                (tmp / h.name).write_text(f'#line 1 "{h}"\n' + register_static_shared(h.read_text()))
            body = register_static_shared(rewrite_dynamic_shared(text, str(src)))
            (tmp / f"{src.stem}.body.cpp").write_text(f'#line 1 "{src}"\n' + body)
            found = _scan_entries(tmp / f"{src.stem}.body.cpp", [f"-I{tmp}", *cflags])
            names = found + [n for n in name_expressions if n not in found]
            if not names:
                raise BackendError(f'emu: {src.name} has no extern "C" __global__ kernels and no name_expressions')
            (tmp / f"{src.stem}.cpp").write_text(f'#include "{src.stem}.body.cpp"\n' + _trailer(names))
            try:
                os.rename(tmp, folder)
            except OSError:  # another process made it first
                pass
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return folder / f"{src.stem}.cpp"


def runtime_library(cache: Path) -> Path:
    """The shared runtime (scheduler + fibers) every kernel module links against."""
    flags = [RUNTIME_OPT, *BASE_FLAGS, *include_flags(None, local=False)]
    out = cache / f"libsharpinf-emu-rt-{_key(*RUNTIME_SOURCES, *flags)}.so"
    srcs = [str(EMU_DIR / n) for n in RUNTIME_SOURCES]
    return _atomic_build(out, lambda tmp: _run_gxx([*flags, "-shared", *srcs, "-pthread", "-Wl,-z,defs", "-o", str(tmp)],
                                                   "the emulator runtime"))


# What every kernel module includes first; emu_entry.h is the trailer's (its <string> and <tuple>).
PCH_HEADERS = ("cuda_emu.h", "emu_entry.h")
_pch: dict[Path, Path | None] = {}  # precompiled_header's answers in this process (a failed build is not tried again)


def precompiles() -> bool:
    """Whether the compiler is GCC (whose -include reads NAME.gch beside NAME when it fits)."""
    return "GCC" in gxx_version() or "g++" in gxx_version()


def precompiled_header(cache: Path, flags: list[str]) -> Path | None:
    """A header including PCH_HEADERS, beside its g++ precompiled form (.gch), built once for
    `flags` (a kernel module's compile flags without the local -I's: the PCH must be made with the
    options that use it); a module's compile names it in -include, and g++ reads the .gch instead of
    parsing the headers. None where the compiler is not GCC (clang names its PCH otherwise) or the
    build fails: then modules include cuda_emu.h as text, as before."""
    if not precompiles():
        return None
    folder = cache / f"pch-{_key('pch', *flags)}"
    if folder not in _pch:
        _pch[folder] = _build_pch(folder, flags)
    return _pch[folder]


def _build_pch(folder: Path, flags: list[str]) -> Path | None:
    header = folder / "sharpinf_emu_pre.h"
    if (folder / "ok").exists():
        return header
    with paths.one_builder(folder):
        if (folder / "ok").exists():  # another process built it while this one waited
            return header
        folder.mkdir(exist_ok=True)
        header.write_text("".join(f'#include "{h}"\n' for h in PCH_HEADERS))
        try:
            _build_aside(header.with_name(header.name + ".gch"),
                         lambda tmp: _run_gxx([*flags, "-x", "c++-header", str(header), "-o", str(tmp)],
                                              "the emulator's precompiled header"))
        except BackendError:
            return None
        (folder / "ok").touch()  # last: a folder without it is rebuilt
    return header


def _trailer(names: list[str]) -> str:
    entries = ",\n  ".join(f'::sharpinf_emu::make_entry<&{n}>("{n}")' for n in names)
    return (
        '\n#line 1 "<sharpinf-emu-trailer>"\n#include "emu_entry.h"\n'
        f"static ::sharpinf_emu::Entry sharpinf_emu_entries[] = {{\n  {entries}\n}};\n"
        "SHARPINF_EMU_EXPORTS(sharpinf_emu_entries)\n"
    )


# (src, name_expressions, checked) -> (stamps of src + its headers, result): kernel() may be
# called per launch, and hashing every file each time costs ~0.5 ms.
_memo: dict[tuple[Path, tuple[str, ...], bool, str | None], tuple[list[tuple[Path, int, int]], Path]] = {}


def _stamps(files: list[Path]) -> list[tuple[Path, int, int]] | None:
    try:
        return [(f, (st := f.stat()).st_mtime_ns, st.st_size) for f in files]
    except OSError:
        return None


def stamps_of(src: Path, name_expressions: tuple[str, ...], checked: bool = False,
              weight_type: str | None = None) -> list[tuple[Path, int, int]]:
    """What build_module last saw of src and its headers (for callers' own caches)."""
    hit = _memo.get((src.resolve(), name_expressions, checked, weight_type))
    return hit[0] if hit else []


def fresh(stamps: list[tuple[Path, int, int]]) -> bool:
    return bool(stamps) and _stamps([f for f, _, _ in stamps]) == stamps


def build_module(src: Path, name_expressions: tuple[str, ...], checked: bool = False,
                 weight_type: str | None = None) -> Path:
    """The cached shared object for `src` (its entry points: Module reads them from it); `checked`:
    built for the shared-memory checks (racecheck, initcheck); `weight_type` (module_type): only that
    type's entries of a typed file ("": none of its typed ones)."""
    src = src.resolve()
    memo_key = (src, name_expressions, checked, weight_type)
    hit = _memo.get(memo_key)
    if hit is not None and _stamps([f for f, _, _ in hit[0]]) == hit[0] and hit[1].exists():
        return hit[1]
    if not src.is_file():
        raise BackendError(f"emu: kernel source not found: {src}")
    text = src.read_text()
    incs = include_flags(src.parent)
    headers = local_headers(src, [Path(f[2:]) for f in incs])
    flags = [*KERNEL_FLAGS, *BASE_FLAGS, *(CHECKED_FLAGS if checked else []), "-include", "cuda_emu.h", "-DSHARPINF_EMU"]
    if weight_type is not None:
        flags += ["-DGB_ONE_TYPE", *([f"-DGB_TYPE_{weight_type}=1"] if weight_type else [])]
    # the source's folder and kernels_cu/ serve only local headers, keyed by resolved path and bytes
    # (not as flags): a kernels_cu/ of links to the real files (the scaffold test's) reuses their builds.
    # A <header> found there is not followed by local_headers: then the folders are keyed too.
    angle = angle_includes_in([src, *headers], _local_dirs(src.parent))
    key = _key(str(src), text, *(h.read_bytes() for h in headers), *(str(h) for h in headers), *flags,
               *include_flags(src.parent, local=angle), *name_expressions)
    cache = paths.cache_dir("emu")
    out = cache / f"{src.stem}-{key}.so"
    stamps = _stamps([src, *headers]) or []
    if out.exists():
        _memo[memo_key] = (stamps, out)
        return out
    with _lock, paths.one_builder(out):
        if out.exists():  # another process built it while this one waited
            _memo[memo_key] = (stamps, out)
            return out
        rt = runtime_library(cache)
        pp_flags = [f for f in flags if f.startswith(("-D", "-include", "-std", "cuda_emu"))] + incs  # no codegen
        tu = _write_sources(cache / f"{src.stem}-{key}.src", src, text, headers, name_expressions, pp_flags)
        # the same build with the headers precompiled (the key is the text build's: the bits are the same)
        pre = precompiled_header(cache, [f for f in flags if f not in ("-include", "cuda_emu.h")]
                                 + include_flags(None, local=False))
        if pre is not None:
            flags = [str(pre) if f == "cuda_emu.h" else f for f in flags]
        link = ["-shared", f"-L{cache}", f"-l:{rt.name}", "-Wl,-rpath,$ORIGIN", "-Wl,-z,defs"]
        unit = [*flags, f"-I{tu.parent}", *incs, str(tu)]
        (tu.parent / "compile").write_text("\n".join([*unit, "-c"]))  # how it was compiled (tests read it)
        # (this process holds out's lock: build aside and rename, no second lock)
        if checked:  # compile and link apart: g++ would link libtsan with -fsanitize=thread
            obj = tu.with_suffix(".o")
            _build_aside(obj, lambda tmp: _run_gxx([*unit, "-c", "-o", str(tmp)], src.name))
            _build_aside(out, lambda tmp: _run_gxx([str(obj), *link, "-o", str(tmp)], src.name))
        else:
            _build_aside(out, lambda tmp: _run_gxx([*unit, *link, "-o", str(tmp)], src.name))
    _memo[memo_key] = (stamps, out)
    return out


def preprocess_module(so: Path) -> str:
    """The translation unit of a built module as g++ sees it after the preprocessor (signature.py
    reads kernels' parameter names from it)."""
    folder = so.with_suffix(".src")
    tu = next(folder.glob("*.body.cpp"))
    cflags = [f for f in (folder / "cflags").read_text().splitlines() if f]
    out = subprocess.run([cxx(), *cflags, "-E", "-P", str(tu)], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise ValueError(f"preprocessing {tu} failed")
    return out.stdout


def _scan_entries(body: Path, cflags: list[str]) -> list[str]:
    """The entry points of a rewritten source: g++ preprocesses it with __global__ kept visible
    (SHARPINF_EMU_SCAN), so macro-made families count as written-out entries do."""
    out = subprocess.run([cxx(), *cflags, "-DSHARPINF_EMU_SCAN", "-E", "-P", str(body)], capture_output=True, text=True)
    if out.returncode != 0:
        log = (out.stderr + out.stdout).strip()
        raise BackendError(f"emu: g++ failed to preprocess {body.name}:\n{log}")
    return scanned_entry_names(out.stdout)
