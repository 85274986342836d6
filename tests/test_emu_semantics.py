"""Semantics of the CPU emulator of the CUDA execution model (EmuBackend):
barriers, shared memory, warp shuffles and votes, atomics, deadlock and
strict-mode reports, argument checks, graphs, isolation of crashing kernels
and the compile cache. Test kernels live in tests/kernels_emu/."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sharpinf.errors import BackendError
from sharpinf.runtime.emu import build
from sharpinf.runtime.emu.isolate import run_isolated
from sharpinf.runtime.emu_backend import EmuBackend
from asserts import assert_close, assert_same

KDIR = Path(__file__).parent / "kernels_emu"
ORDERS = ["forward", "reverse", "random"]


def src(name: str) -> str:
    return str(KDIR / name)


def line_of(name: str, mark: str) -> str:
    """'file.cu:N' for the line carrying `// MARK:<mark>`."""
    for i, line in enumerate((KDIR / name).read_text().splitlines(), 1):
        if f"MARK:{mark}" in line:
            return f"{name}:{i}"
    raise AssertionError(mark)


@pytest.fixture(params=ORDERS)
def ordered(request):
    return EmuBackend(order=request.param)


@pytest.fixture(scope="module")
def be():
    return EmuBackend()


# -- barriers and shared memory ----------------------------------------------------------------
def test_block_sum_in_every_order(ordered):
    k = ordered.kernel(src("sync.cu"), "block_sum")
    x = np.random.default_rng(0).integers(-50, 50, size=4 * 256).astype(np.float32)
    out = np.zeros(4, np.float32)
    ordered.launch(k, 4, 256, [x, out])
    assert_same(out, x.reshape(4, 256).sum(1))


def test_missing_barrier_hidden_forward_exposed_reverse():
    # without racecheck (which names this bug in either order: tests/test_emu_racecheck.py)
    fwd, rev = (EmuBackend(order=o, racecheck=False, initcheck=False) for o in ("forward", "reverse"))
    for salt in (1000, 2000):
        want = np.array([-1] + [3 * t + salt for t in range(127)], np.int32)
        out = np.zeros(128, np.int32)
        fwd.launch(fwd.kernel(src("sync.cu"), "missing_barrier"), 1, 128, [out, np.int32(salt)])
        assert_same(out, want)
    out = np.zeros(128, np.int32)
    rev.launch(rev.kernel(src("sync.cu"), "missing_barrier"), 1, 128, [out, np.int32(3000)])
    assert not np.array_equal(out, want + 1000)


@pytest.mark.parametrize("workers", [1, 2])
def test_static_shared_per_block(workers):
    b = EmuBackend(workers=workers)
    out = np.zeros(6 * 64, np.int32)
    b.launch(b.kernel(src("sync.cu"), "static_shared"), 6, 64, [out])
    assert_same(out.reshape(6, 64), np.repeat(np.arange(6) * 10 + 7, 64).reshape(6, 64))


def test_dynamic_shared_nan_poisoned_for_every_block():
    be = EmuBackend(initcheck=False)  # initcheck would name the read (tests/test_emu_racecheck.py)
    out = np.zeros(3 * 32, np.float32)
    be.launch(be.kernel(src("sync.cu"), "dyn_shared_poison"), 3, 32, [out], shared_mem=32 * 4)
    assert np.isnan(out).all()


def test_dynamic_shared_template(ordered):
    exprs = ("dyn_reverse<float>", "dyn_reverse<int>")
    for name, dt in (("dyn_reverse<float>", np.float32), ("dyn_reverse<int>", np.int32)):
        k = ordered.kernel(src("sync.cu"), name, exprs)
        x = np.arange(2 * 64).astype(dt)
        y = np.zeros_like(x)
        ordered.launch(k, 2, 64, [x, y], shared_mem=64 * 4)
        assert_same(y.reshape(2, 64), x.reshape(2, 64)[:, ::-1])


def test_syncthreads_count_and_or(be):
    pred = (np.arange(64) % 3 == 0).astype(np.int32)
    out = np.zeros(64 * 3, np.int32)
    be.launch(be.kernel(src("sync.cu"), "sync_count"), 1, 64, [pred, out])
    assert_same(out.reshape(64, 3), np.tile([pred.sum(), 0, 1], (64, 1)))


def test_two_dimensional_block(ordered):
    x = np.arange(256, dtype=np.float32)
    y = np.zeros_like(x)
    ordered.launch(ordered.kernel(src("sync.cu"), "transpose_tile"), 1, (16, 16), [x, y])
    assert_same(y.reshape(16, 16), x.reshape(16, 16).T)


def test_floats_survive_first_static_shared_access():
    # Regression: row 0 of softmax came out NaN/inf in the full reverse-order suite. With
    # -mtls-dialect=gnu2 on glibc < 2.40, the first access to a module's thread_local
    # (static __shared__) in a thread ran glibc's TLS slow path, which clobbered the xmm
    # registers g++ keeps floats in across that access; here thread 0's sum came out wrong.
    be = EmuBackend(order="forward")  # thread 0 makes the module's first TLS access
    k = be.kernel(src("tls_live.cu"), "live_across_first_shared")
    inp = np.arange(1, 13, dtype=np.float32) / 8
    out = np.zeros(32, np.float32)
    be.launch(k, 1, 32, [inp, out, np.int32(1)])
    a = inp[None, :] * np.arange(1, 33, dtype=np.float32)[:, None]
    want = (a * np.arange(1, 13, dtype=np.float32)).sum(1) + a[:, 0] + a[:, 1]
    assert_same(out, want.astype(np.float32))


def test_tls_descriptors_only_where_glibc_preserves_vector_registers():
    assert ("-mtls-dialect=gnu2" in build.BASE_FLAGS) <= build.tlsdesc_is_safe()


# -- warp shuffles and votes -----------------------------------------------------------------------
def shfl_model(a: np.ndarray, op: str, arg: int, width: int) -> np.ndarray:
    out = np.empty_like(a)
    for t in range(a.size):
        warp, l = t & ~31, t & 31
        seg = l & ~(width - 1)
        if op == "idx":
            s = seg + (arg % width)
        elif op == "up":
            s = l - arg if l - seg >= arg else l
        elif op == "down":
            s = l + arg if l - seg + arg < width else l
        else:
            s = l ^ arg
            s = l if s >= seg + width else s
        out[t] = a[warp + s]
    return out


@pytest.mark.parametrize("op", ["idx", "up", "down", "xor"])
@pytest.mark.parametrize("width", [32, 16, 8, 2])
def test_shuffles_match_cuda_semantics(be, op, width):
    k = be.kernel(src("warp.cu"), f"shfl_{op}")
    a = np.random.default_rng(1).integers(-1000, 1000, size=128).astype(np.int32)
    for arg in (0, 1, 3, 5, 17, 31):
        out = np.zeros_like(a)
        be.launch(k, 2, 64, [a, out, np.int32(arg), np.int32(width)])
        assert_same(out, shfl_model(a, op, arg, width), err_msg=f"{op} arg={arg} width={width}")


def test_votes(be):
    rng = np.random.default_rng(2)
    pred = (rng.random(96) < 0.5).astype(np.int32)
    pred[32:64] = 1  # a warp where all lanes agree
    out = np.zeros(96 * 4, np.uint32)
    be.launch(be.kernel(src("warp.cu"), "votes"), 1, 96, [pred, out])
    out = out.reshape(96, 4)
    for w in range(3):
        p = pred[w * 32:(w + 1) * 32]
        ballot = sum(1 << i for i in range(32) if p[i])
        assert_same(out[w * 32:(w + 1) * 32], np.tile([ballot, p.all(), p.any(), 0xFFFFFFFF], (32, 1)))


def test_shuffle_double_payload(be):
    x = np.random.default_rng(3).random(64)
    y = np.zeros_like(x)
    be.launch(be.kernel(src("warp.cu"), "warp_sum_double"), 1, 64, [x, y])
    assert_close(y, np.repeat(x.reshape(2, 32).sum(1), 32), rtol=1e-12)


def test_block_reduction_with_shuffles(ordered):
    x = np.random.default_rng(4).integers(-9, 9, size=3 * 256).astype(np.float32)
    out = np.zeros(3, np.float32)
    ordered.launch(ordered.kernel(src("warp.cu"), "block_sum_shfl"), 3, 256, [x, out])
    assert_same(out, x.reshape(3, 256).sum(1))



def test_the_warp_exchange_shares_every_lane_and_refuses_oversized_posts(be):
    k, out = be.kernel(src("warp.cu"), "share_bytes"), np.zeros(32, np.int32)
    be.launch(k, 1, 32, [np.array([1], np.int32), out])
    assert_same(out, (np.arange(32) + 1) % 32)
    with pytest.raises(BackendError, match=r"warp exchange .* posts 40 bytes: 1\.\.32"):
        be.launch(k, 1, 32, [np.array([40], np.int32), out])

# -- atomics and math -----------------------------------------------------------------------------
@pytest.mark.parametrize("workers", [1, 2])
def test_atomic_contention_counts_exact(workers):
    b = EmuBackend(workers=workers)
    ci = np.array([0, -1, 0], np.int32)
    cu, cl = np.zeros(1, np.uint32), np.zeros(1, np.uint64)
    cf, cd = np.zeros(1, np.float32), np.zeros(1, np.float64)
    b.launch(b.kernel(src("atomics.cu"), "atomic_counts"), 64, 256, [ci, cu, cl, cf, cd])
    n = 64 * 256
    assert ci[0] == n and cu[0] == 2 * n and cl[0] == 3 * n and cf[0] == n and cd[0] == n / 2
    assert ci[1] == n - 1 and ci[2] == -255


def test_atomic_cas_loop(be):
    x = np.random.default_rng(5).standard_normal(1000).astype(np.float32)
    m = np.array([-np.inf], np.float32)
    be.launch(be.kernel(src("atomics.cu"), "cas_max"), 8, 128, [x, m, np.int32(1000)])
    assert m[0] == x.max()


def test_float_atomicmax_does_not_compile(be):
    with pytest.raises(BackendError, match="atomicMax"):
        be.kernel(src("bad_atomic.cu"), "float_max")


def test_half_and_fast_math_standins(be):
    x = np.linspace(-1, 1, 32).astype(np.float16)
    y = np.zeros(32, np.float16)
    z = np.zeros(32, np.uint16)  # __nv_bfloat16 bits
    f = np.ones(32, np.float32)
    be.launch(be.kernel(src("atomics.cu"), "half_math"), 1, 32, [x, y, z, f])
    assert_close(y, np.exp(x.astype(np.float32)) * 2 + 1, rtol=2e-3)
    zf = (z.astype(np.uint32) << 16).view(np.float32)
    assert_close(zf, np.sqrt(x.astype(np.float32) + 4), rtol=1e-2)
    xf = x.astype(np.float32)
    assert_close(f, 2 * xf * xf + 1 + 0.5 + 0.25 + 1 + 1 + 1, rtol=2e-3)


def test_template_kernels_need_name_expressions(be):
    k = be.kernel(src("atomics.cu"), "scale_t<float>", ["scale_t<float>", "scale_t<double>"])
    x = np.arange(10, dtype=np.float32)
    be.launch(k, 1, 32, [x, np.float32(2), np.int32(10)])
    assert_same(x, np.arange(10) * 2)
    with pytest.raises(BackendError, match="name_expressions"):
        be.kernel(src("atomics.cu"), "scale_t<int>", ["scale_t<float>", "scale_t<double>"])


# -- deadlocks and strict mode ---------------------------------------------------------------------------
def _launch_expect_error(kernel_name: str, strict: bool = False, block: int = 32) -> str:
    b = EmuBackend(strict=strict)
    k = b.kernel(src("faults.cu"), kernel_name)
    try:
        b.launch(k, 1, block, [np.zeros(block, np.float32)])
    except BackendError as exc:
        return str(exc)
    return ""


def test_deadlock_shuffle_waits_for_exited_lanes():
    msg = run_isolated(_launch_expect_error, "shfl_after_exit", timeout=60)
    assert "deadlock" in msg and "kernel shfl_after_exit" in msg and "block (0,0,0)" in msg
    assert f"thread 0-15 waits at __shfl_down_sync ({str(KDIR)}/{line_of('faults.cu', 'shfl_after_exit')})" in msg


def test_deadlock_barrier_against_shuffle():
    msg = run_isolated(_launch_expect_error, "barrier_vs_shuffle", timeout=60)
    assert "deadlock" in msg
    assert f"thread 0-15 waits at __syncthreads (" in msg and line_of("faults.cu", "bvs_barrier") in msg
    assert f"thread 16-31 waits at __shfl_xor_sync (" in msg and line_of("faults.cu", "bvs_shfl") in msg


def test_early_exit_before_barrier_is_legal_but_strict_flags_it():
    b = EmuBackend()
    out = np.zeros(32, np.float32)
    b.launch(b.kernel(src("faults.cu"), "early_exit"), 1, 32, [out])
    assert out.sum() == 31 and out[5] == 0
    msg = _launch_expect_error("early_exit", strict=True)
    assert "early exit before a barrier" in msg and line_of("faults.cu", "early_exit") in msg


def test_partial_warp_shuffle_strict():
    b = EmuBackend()
    x = np.arange(64, dtype=np.float32)
    b.launch(b.kernel(src("faults.cu"), "partial_shuffle"), 1, 64, [x])
    want = np.arange(64, dtype=np.float32)
    for t in range(64):
        l = t & 31
        if l < 16:
            want[t] = t + 1 if l < 15 else t
    assert_same(x, want)
    msg = _launch_expect_error("partial_shuffle", strict=True)
    assert "partial-warp __shfl_down_sync" in msg and line_of("faults.cu", "partial") in msg


def test_divergent_barriers_strict():
    b = EmuBackend()
    out = np.zeros(32, np.float32)
    b.launch(b.kernel(src("faults.cu"), "divergent_barriers"), 1, 32, [out])
    assert (out == 2).all()
    msg = _launch_expect_error("divergent_barriers", strict=True)
    assert line_of("faults.cu", "div_a") in msg and line_of("faults.cu", "div_b") in msg


def test_trap_reports_line(be):
    k = be.kernel(src("faults.cu"), "trap_on_negative")
    be.launch(k, 1, 32, [np.ones(32, np.float32)])
    x = np.ones(32, np.float32)
    x[7] = -1
    with pytest.raises(BackendError, match=r"__trap\(\) at .*faults.cu:\d+ \(thread 7\)"):
        be.launch(k, 1, 32, [x])


def _oob():
    b = EmuBackend()
    b.launch(b.kernel(src("faults.cu"), "out_of_bounds"), 1, 32, [np.zeros(32, np.float32)])
    return "survived"


def test_out_of_bounds_kernel_isolated():
    EmuBackend().kernel(src("faults.cu"), "out_of_bounds")  # compile in the parent (cached)
    with pytest.raises(BackendError, match="crashed with SIGSEGV"):
        run_isolated(_oob, timeout=60)


def test_run_isolated_returns_and_reraises():
    assert run_isolated(lambda a, b: a + b, 2, 3) == 5
    with pytest.raises(ValueError, match="boom"):
        run_isolated(lambda: (_ for _ in ()).throw(ValueError("boom")))


# -- arguments ----------------------------------------------------------------------------------------
def test_scalar_packing_every_kind(be):
    out = np.zeros(8, np.float64)
    args = [out, np.int32(-5), np.uint32(4000000000), np.float32(1.5), np.int64(-(2**40)), np.float64(2.25),
            np.uint64(2**63), np.int16(-300), np.uint8(200)]
    be.launch(be.kernel(src("args.cu"), "store_args"), 1, 1, args)
    assert_same(out, [-5, 4000000000, 1.5, -(2**40), 2.25, 2.0**63, -300, 200])


@pytest.mark.parametrize(
    "args, match",
    [
        ([np.zeros(4, np.float32), np.float32(1)], "expects 3 arguments, got 2"),
        ([np.zeros(4, np.float32), 1.0, np.int32(4)], r"pass np.float32\(1.0\), not a Python float"),
        ([np.zeros(4, np.float32), np.float32(1), 4], r"pass np.int32\(4\), not a Python int"),
        ([np.zeros(4, np.float32), np.float32(1), np.int64(4)], "argument 2 is a signed int .4 bytes. scalar; pass np.int32"),
        ([np.zeros(4, np.float32), np.float64(1), np.int32(4)], "argument 1 is a float .4 bytes. scalar; pass np.float32"),
        ([np.zeros(4, np.float32), np.zeros(1, np.float32), np.int32(4)], "not an array"),
        ([np.float32(0), np.float32(1), np.int32(4)], "argument 0 is a pointer; pass an array"),
        ([np.zeros((4, 4), np.float32)[:, 0], np.float32(1), np.int32(4)], "non-contiguous"),
    ],
)
def test_argument_checks(be, args, match):
    with pytest.raises(BackendError, match=match):
        be.launch(be.kernel(src("args.cu"), "add_scalar"), 1, 32, args)


def test_launch_config_checks(be):
    k = be.kernel(src("args.cu"), "add_scalar")
    args = [np.zeros(4, np.float32), np.float32(1), np.int32(4)]
    with pytest.raises(BackendError, match="1 to 1024"):
        be.launch(k, 1, 2048, args)
    with pytest.raises(ValueError):
        be.launch(k, 0, 32, args)


# -- graphs ---------------------------------------------------------------------------------------------
def test_graph_capture_records_then_replays(be):
    k = be.kernel(src("args.cu"), "add_scalar")
    x = np.zeros(100, np.float32)
    with be.capture() as g:
        be.launch(k, 4, 32, [x, np.float32(1), np.int32(100)])
        be.launch(k, 4, 32, [x[10:], np.float32(2), np.int32(90)])
    assert (x == 0).all()  # captured, not run
    g.replay()
    g.replay()
    assert_same(x, np.r_[np.full(10, 2), np.full(90, 6)])


def test_graph_replay_detects_reallocated_buffer(be):
    k = be.kernel(src("args.cu"), "add_scalar")
    bufs = {"x": np.zeros(64, np.float32)}
    with be.capture() as g:
        be.launch(k, 2, 32, [bufs["x"], np.float32(1), np.int32(64)])
    bufs["x"] = np.zeros(64, np.float32)  # the bug: a new buffer after capture
    with pytest.raises(BackendError, match="argument 0 of kernel add_scalar was reallocated after capture"):
        g.replay()


# -- build ------------------------------------------------------------------------------------------------
def test_compile_cache_hit(be):
    be.kernel(src("args.cu"), "add_scalar")
    n = build.compile_count
    EmuBackend().kernel(src("args.cu"), "store_args")
    be.kernel(src("args.cu"), "add_scalar")
    assert build.compile_count == n


def test_builds_key_on_the_headers_found_not_the_folders_searched(tmp_path, monkeypatch):
    """A kernels_cu/ of links to the real files (the scaffold test's sandbox, SHARPINF_KERNELS_DIR)
    reuses the real files' builds; a header beside a source, found before kernels_cu/'s, is part of
    its build's key, and a change to it builds again."""
    import os
    import shutil

    from sharpinf.runtime.paths import kernels_dir

    real = kernels_dir()
    so = build.build_module(real / "gather.cu", ())
    links = tmp_path / "links"
    shutil.copytree(real, links, copy_function=os.symlink)
    monkeypatch.setenv("SHARPINF_KERNELS_DIR", str(links))
    monkeypatch.setattr(build, "_memo", {})  # as a new process would: the key decides
    n = build.compile_count
    assert build.build_module(links / "gather.cu", ()) == so and build.compile_count == n

    own = tmp_path / "own"  # gather.cu with a common.cuh of its own beside it
    own.mkdir()
    shutil.copy(real / "gather.cu", own)
    (own / "common.cuh").write_text((real / "common.cuh").read_text())
    first = build.build_module(own / "gather.cu", ())
    (own / "common.cuh").write_text((real / "common.cuh").read_text() + "\n#define SHARPINF_TEST_CHANGED 1\n")
    assert build.build_module(own / "gather.cu", ()) not in (so, first) and build.compile_count == n + 2

    # a <header> from kernels_cu/ (local_headers follows quoted includes only): the folders are keyed
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "k.cu").write_text('#include <extra.cuh>\nextern "C" __global__ void k(float* x) { x[0] = EXTRA; }\n')
    builds = []
    for value in ("1.0f", "2.0f"):
        d = tmp_path / f"kernels_{value[0]}"
        shutil.copytree(real, d, copy_function=os.symlink)
        (d / "extra.cuh").write_text(f"#define EXTRA {value}\n")
        monkeypatch.setenv("SHARPINF_KERNELS_DIR", str(d))
        monkeypatch.setattr(build, "_memo", {})
        builds.append(build.build_module(probe / "k.cu", ()))
    assert builds[0] != builds[1]


@pytest.mark.parametrize("checked", [False, True], ids=["plain", "checked"])
def test_modules_read_the_emulators_headers_precompiled(tmp_path, checked):
    """g++ reads cuda_emu.h and emu_entry.h from the precompiled header made for the module's own
    flags (-H marks a PCH it used with '!', one it found and refused with 'x'): a PCH made with
    other options (the checked build's sanitizer and defines) would be refused, silently, and every
    module would parse ~40k lines of headers again."""
    import subprocess

    if not build.precompiles():
        pytest.skip(f"no precompiled headers with {build.gxx_version()}")
    f = tmp_path / "pch_probe.cu"
    f.write_text(f'extern "C" __global__ void k(float* x) {{ x[0] = {int(checked)}.0f; }}\n')
    so = build.build_module(f, (), checked)
    args = (so.with_suffix(".src") / "compile").read_text().splitlines()
    pch = [a for a in args if a.endswith("sharpinf_emu_pre.h")]
    assert len(pch) == 1 and Path(pch[0] + ".gch").is_file()
    out = subprocess.run([build.cxx(), *args, "-H", "-Winvalid-pch", "-o", str(tmp_path / "k.o")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert f"! {pch[0]}.gch" in out.stderr.splitlines(), out.stderr[:2000]
    assert "cuda_fp16.h" not in out.stderr  # read from the PCH, not parsed


def test_compile_error_carries_gxx_log(be, tmp_path):
    f = tmp_path / "broken.cu"
    f.write_text('extern "C" __global__ void broken(float* x) { x[0] = undefined_name; }\n')
    with pytest.raises(BackendError, match="undefined_name"):
        be.kernel(str(f), "broken")


def test_describe(be):
    d = be.describe()
    assert d["compiler"].startswith(("g++", "c++")) or "GCC" in d["compiler"]
    assert {"cache_dir", "order", "strict", "workers"} <= d.keys()


def test_settings_from_environment(monkeypatch):
    monkeypatch.setenv("SHARPINF_EMU_ORDER", "reverse")
    monkeypatch.setenv("SHARPINF_EMU_STRICT", "1")
    monkeypatch.setenv("SHARPINF_EMU_WORKERS", "2")
    b = EmuBackend()
    assert (b.order, b.strict, b.workers) == ("reverse", True, 2)
    with pytest.raises(BackendError, match="unknown thread order"):
        EmuBackend(order="sideways")


def test_get_backend_returns_emu(emu):
    assert isinstance(emu, EmuBackend)


def test_namespace_scope_dynamic_shared_keeps_line_numbers(be):
    x = np.arange(32, dtype=np.float32)
    with pytest.raises(BackendError, match=line_of("sync.cu", "after_ns_dyn")):
        be.launch(be.kernel(src("sync.cu"), "ns_dyn_rotate"), 1, 32, [x], shared_mem=128)
    assert x[0] == 1  # thread 0 read its neighbour's slot, then trapped (ending the block)


def test_edited_source_is_rebuilt(be, tmp_path):
    f = tmp_path / "edit.cu"
    body = 'extern "C" __global__ void setv(int* x) {{ x[threadIdx.x] = {}; }}\n'
    x = np.zeros(4, np.int32)
    f.write_text(body.format(7))
    be.launch(be.kernel(str(f), "setv"), 1, 4, [x])
    assert (x == 7).all()
    f.write_text(body.format(1234))
    be.launch(be.kernel(str(f), "setv"), 1, 4, [x])
    assert (x == 1234).all()


def _block_sum_with_workers():
    b = EmuBackend(workers=2)
    x = np.ones(8 * 256, np.float32)
    out = np.zeros(8, np.float32)
    b.launch(b.kernel(src("sync.cu"), "block_sum"), 8, 256, [x, out])
    return out.tolist()


def test_worker_pool_survives_fork():
    assert _block_sum_with_workers() == [256.0] * 8  # starts helper threads here
    assert run_isolated(_block_sum_with_workers, timeout=60) == [256.0] * 8


def test_device_assert_raises_instead_of_aborting(be):
    k = be.kernel(src("faults.cu"), "assert_positive")
    x = np.ones(32, np.float32)
    be.launch(k, 1, 32, [x])
    x[3] = -2
    with pytest.raises(BackendError, match=r"assertion `x\[threadIdx.x\] > 0.0f` failed at .*" + line_of("faults.cu", "assert")):
        be.launch(k, 1, 32, [x])


def test_a_typed_file_is_built_per_weight_type(tmp_path):
    """A file of GB_ENTRIES families is built once per weight type a launch asks for (GB_ONE_TYPE,
    source.module_type): each build holds that type's entries and the hand-written ones, and every
    entry still runs with its own type's code."""
    from sharpinf.runtime.emu.module import Module
    from sharpinf.runtime.emu.source import module_type
    from sharpinf.runtime.emu_backend import EmuBackend

    f = tmp_path / "typed.cu"
    f.write_text('#include "ggml_blocks.cuh"\n'
                 "template <int QT> __device__ void put_type(float* y) { y[0] = (float)QT; }\n"
                 "GB_ENTRIES(put, , (float* y), put_type, y)\n"
                 'extern "C" __global__ void plain(float* y) { y[0] = -1.0f; }\n')
    assert [module_type(f, n) for n in ("put_q4_0", "put_q6_k_g16", "put_mxfp4", "plain")] == ["q4_0", "q6_k", "mxfp4", ""]
    from sharpinf.runtime.paths import kernels_dir

    assert module_type(kernels_dir() / "attention.cu", "attention_f16_d64") is None  # built whole
    be = EmuBackend()
    y = be.zeros((1,), np.float32)
    for name, want in (("put_q4_0", 2.0), ("put_q6_k", 14.0), ("put_f16", 1.0), ("plain", -1.0)):
        be.launch(be.kernel(str(f), name), 1, 1, (y,))
        assert y[0] == want, name
    assert set(Module(build.build_module(f, (), False, "q4_0")).kernels) == {"put_q4_0", "plain"}
    assert set(Module(build.build_module(f, (), False, "")).kernels) == {"plain"}
