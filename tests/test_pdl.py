"""Programmatic dependent launch without a GPU: the PTX contract checker (pdl_check.py) on hand-written
PTX and on NVRTC's, and pdl_launch.py's ctypes structures against cuda.h. That every kernels_cu entry
keeps the contract is test_nvrtc_compile.py's (it reads the compiles it already makes)."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess

import numpy as np
import pytest

from sharpinf.runtime.paths import cuda_include_dirs, kernels_dir, pip_nvrtc_library
from sharpinf.runtime.pdl_check import entry_verdicts

HEAD = """
.visible .entry k(
\t.param .u64 k_param_0,
\t.param .u32 k_param_1
)
.maxntid 128, 1, 1
{
\t.reg .pred \t%p<3>;
\t.reg .b64 \t%rd<9>;
\t.shared .align 4 .b8 tile[512];

\tld.param.u64 \t%rd1, [k_param_0];
\tmov.u32 \t%r1, %ctaid.x;
\t// begin inline asm
\t{
\t.reg .pred p;
\tsetp.ne.u32 p, %r1, 0;
\t@p cp.async.bulk.prefetch.L2.global [%rd1], %r1;
\t}
\t// end inline asm
\tprefetch.global.L2 \t[%rd1];
\tst.shared.u32 \t[tile], %r1;
"""
TAIL = """\t// begin inline asm
\tgriddepcontrol.launch_dependents;
\t// end inline asm
\tgriddepcontrol.wait;
\tld.global.u32 \t%r2, [%rd1];
$L__BB0_2:
\t@%p2 bra \t$L__BB0_2;
\tret;
}
"""


def test_an_entry_that_waits_before_touching_global_memory_keeps_the_contract():
    """Before the wait: parameters, arithmetic, shared memory, prefetches, labels (-G's debug labels; a
    label is reached only by a branch). After it, anything -- loads, branches, exits."""
    assert entry_verdicts(HEAD + TAIL) == {"k": None}
    assert entry_verdicts(HEAD.replace("\tmov.u32", "$L__func_begin0:\n\tmov.u32") + TAIL) == {"k": None}
    # -G's directives without a `;` are lines of their own, not part of the next statement
    debug = (HEAD + TAIL).replace("\tgriddepcontrol.wait;", "\t.loc\t1 80 5\n\tgriddepcontrol.wait;")
    assert entry_verdicts(debug) == {"k": None}
    hidden = HEAD + "\t.loc\t1 79 5\n\tld.global.u32 %r9, [%rd1];\n" + TAIL
    assert entry_verdicts(hidden) == {"k": "ld.global.u32 %r9, [%rd1]: not known safe before griddepcontrol.wait"}
    # an if/else of index arithmetic: branches forward to labels before the wait
    diamond = ("\t@%p1 bra \t$L__BB0_2;\n\tbra.uni \t$L__BB0_1;\n$L__BB0_2:\n\tmov.u32 \t%r5, 32;\n"
               "\tbra.uni \t$L__BB0_3;\n$L__BB0_1:\n\tclz.b32 \t%r5, %r1;\n$L__BB0_3:\n")
    assert entry_verdicts(HEAD + diamond + TAIL) == {"k": None}


UNSAFE = "not known safe before griddepcontrol.wait"
NOT_FORWARD = "a branch not forward to a label before griddepcontrol.wait"
EXITS = "an exit before griddepcontrol.wait"


@pytest.mark.parametrize("line, bad, why", [
    ("ld.global.nc.u32 \t%r2, [%rd1];", "ld.global.nc.u32 %r2, [%rd1]", UNSAFE),
    ("ld.u32 \t%r2, [%rd1];", "ld.u32 %r2, [%rd1]", UNSAFE),  # generic: may be global
    ("ld.relaxed.gpu.global.u32 %r3, [%rd1];", "ld.relaxed.gpu.global.u32 %r3, [%rd1]", UNSAFE),
    ("ldu.global.u32 %r3, [%rd1];", "ldu.global.u32 %r3, [%rd1]", UNSAFE),
    ("ld.global.v2.u32 {%r2, %r3}, [%rd1];", "ld.global.v2.u32 {%r2, %r3}, [%rd1]", UNSAFE),
    ("st.global.f32 \t[%rd1], %f1;", "st.global.f32 [%rd1], %f1", UNSAFE),
    ("atom.global.add.u32 \t%r2, [%rd1], 1;", "atom.global.add.u32 %r2, [%rd1], 1", UNSAFE),
    ("red.global.add.f32 \t[%rd1], %f1;", "red.global.add.f32 [%rd1], %f1", UNSAFE),
    ("cp.async.cg.shared.global [tile], [%rd1], 16;", "cp.async.cg.shared.global [tile], [%rd1], 16", UNSAFE),
    ("discard.global.L2 [%rd1], 128;", "discard.global.L2 [%rd1], 128", UNSAFE),  # drops what a kernel wrote
    ("prefetch.global.L1 [%rd1];", "prefetch.global.L1 [%rd1]", UNSAFE),  # L1 is not coherent
    ("mov.u32 %r1, 0; ld.global.u32 %r3, [%rd1];", "ld.global.u32 %r3, [%rd1]", UNSAFE),  # two on a line
    ("{ .reg .pred q; setp.ne.u32 q, %r1, 0; @q st.global.u32 [%rd1], %r1; }", "@q st.global.u32 [%rd1], %r1",
     UNSAFE),  # an inline asm scope on one line
    ("$L__X: ld.global.u32 %r3, [%rd1];", "ld.global.u32 %r3, [%rd1]", UNSAFE),  # behind a label
    ("call.uni \tf, (%rd1);", "call.uni f, (%rd1)", UNSAFE),
    ("trap;", "trap", UNSAFE),
    # an exit: a grid whose threads all left before their wait could end before the kernel ahead of it
    ("@%p1 ret;", "@%p1 ret", EXITS),
    ("ret;", "ret", EXITS),
    ("exit;", "exit", EXITS),
    ("@%p1 bra \t$L__BB0_2;", "@%p1 bra $L__BB0_2", NOT_FORWARD),  # past the wait
    ("bra.uni \t$L__BB0_2;", "bra.uni $L__BB0_2", NOT_FORWARD),
    ("$L__BB0_0:\n\t@%p1 bra \t$L__BB0_0;", "@%p1 bra $L__BB0_0", NOT_FORWARD),  # back: a loop before the wait
    ("@%p1 bra \t$L__elsewhere;", "@%p1 bra $L__elsewhere", NOT_FORWARD),
])
def test_what_breaks_the_contract_is_named(line, bad, why):
    ptx = HEAD + "\t" + line + "\n" + TAIL
    assert entry_verdicts(ptx) == {"k": f"{bad}: {why}"}


def test_an_entry_without_a_wait_or_with_a_predicated_one_breaks_it():
    no_wait = (HEAD + TAIL).replace("\tgriddepcontrol.wait;\n", "")
    assert entry_verdicts(no_wait) == {"k": "no griddepcontrol.wait in the entry"}
    assert entry_verdicts(HEAD + "}\n") == {"k": "no griddepcontrol.wait in the entry"}
    guarded = (HEAD + TAIL).replace("\tgriddepcontrol.wait;", "\t@%p1 griddepcontrol.wait;")
    assert entry_verdicts(guarded) == {"k": "@%p1 griddepcontrol.wait: a predicated wait (some threads pass it)"}


def test_every_entry_of_a_module_is_judged():
    two = HEAD + TAIL + (HEAD + TAIL).replace(".entry k(", ".entry k2(").replace("\tgriddepcontrol.wait;\n", "")
    v = entry_verdicts(two)
    assert v["k"] is None and v["k2"] is not None


SOURCE = r"""// a test kernel
#include "common.cuh"
SHARPINF_ENTRY(by_macro, (const float* x, float* y), y[threadIdx.x] = x[threadIdx.x])
extern "C" __global__ void by_hand(const float* __restrict__ x, float* y) {
    sharpinf_pdl_enter();
    y[threadIdx.x] = x[threadIdx.x];
}
extern "C" __global__ void prefetches(const float* __restrict__ w, float* y, long long n) {
    sharpinf_pdl_trigger();
    sharpinf_prefetch_l2(w + 256 * blockIdx.x, n);
    sharpinf_pdl_wait();
    y[threadIdx.x] = w[threadIdx.x];
}
extern "C" __global__ void loads_first(const float* __restrict__ x, float* y) {
    const float v = x[threadIdx.x];
    sharpinf_pdl_enter();
    y[threadIdx.x] = v;
}
extern "C" __global__ void never_waits(const float* x, float* y) { y[threadIdx.x] = x[threadIdx.x]; }
extern "C" __global__ void leaves_first(const float* __restrict__ x, float* y, int n) {
    if (blockIdx.x * blockDim.x + threadIdx.x >= n) return;
    sharpinf_pdl_enter();
    y[threadIdx.x] = x[threadIdx.x];
}
"""


@pytest.mark.skipif(pip_nvrtc_library() is None, reason="pip install nvidia-cuda-nvrtc-cu12")
def test_nvrtc_ptx_is_judged_per_entry(tmp_path, monkeypatch):
    """The real compiler's PTX, through nvrtc_check's compile (which the NVRTC test uses for every
    kernels_cu file): the macro's entry, a hand-written one and one that prefetches before its wait
    keep the contract; a load read before the wait (NVVM keeps it there: the wait is a memory clobber),
    an entry with no wait and one whose threads may leave before it break it. sm_80 has no PDL: no
    verdicts."""
    from sharpinf.runtime.nvrtc_check import check_file

    monkeypatch.setenv("SHARPINF_NVRTC_CACHE", "0")
    src = tmp_path / "pdl_probe.cu"
    src.write_text(SOURCE)
    sm80, sm90 = check_file(src, ("sm_80", "sm_90"))
    assert sm80.ok and sm90.ok, sm90.log
    assert sm80.pdl is None
    assert {k for k, v in sm90.pdl.items() if v is None} == {"by_macro", "by_hand", "prefetches"}
    assert sm90.pdl["loads_first"].startswith("ld.global") and sm90.pdl["loads_first"].endswith(UNSAFE)
    assert sm90.pdl["never_waits"] == "no griddepcontrol.wait in the entry"
    # NVVM writes the early return as a branch past the wait, or as a predicated `ret`: refused either way
    assert sm90.pdl["leaves_first"].endswith((NOT_FORWARD, EXITS)), sm90.pdl["leaves_first"]


def test_the_launch_structures_match_cuda_h(tmp_path):
    """pdl_launch's ctypes CUlaunchConfig and CUlaunchAttribute have cuda.h's sizes and offsets, and
    the attribute id is cuda.h's (g++ against the CUDA headers: the driver reads these bytes)."""
    from sharpinf.runtime.pdl_launch import PROGRAMMATIC_STREAM_SERIALIZATION, LaunchAttribute, LaunchConfig

    gxx = shutil.which("g++")
    headers = [d for d in cuda_include_dirs() if (d / "cuda.h").is_file()]
    if gxx is None or not headers:
        pytest.skip("needs g++ and cuda.h")
    fields = [f for f, _ in LaunchConfig._fields_]
    prog = tmp_path / "layout.cpp"
    prog.write_text('#include <cstdio>\n#include <cstddef>\n#include "cuda.h"\nint main() {\n'
                    '  std::printf("%zu %zu %zu %d\\n", sizeof(CUlaunchConfig), sizeof(CUlaunchAttribute),'
                    ' offsetof(CUlaunchAttribute, value),'
                    ' (int)CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);\n'
                    + "".join(f'  std::printf("%zu\\n", offsetof(CUlaunchConfig, {f}));\n' for f in fields)
                    + "}\n")
    exe = tmp_path / "layout"
    subprocess.run([gxx, f"-I{headers[0]}", str(prog), "-o", str(exe)], check=True, capture_output=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    size_cfg, size_attr, value_at, attr_id, *offsets = map(int, out)
    assert (size_cfg, size_attr, value_at, attr_id) == (ctypes.sizeof(LaunchConfig), ctypes.sizeof(LaunchAttribute),
                                                        LaunchAttribute.value.offset, PROGRAMMATIC_STREAM_SERIALIZATION)
    assert offsets == [getattr(LaunchConfig, f).offset for f in fields]


def test_kernels_dir_entries_written_by_hand_enter_first():
    """A quick source-level guard beside the PTX proof: every `extern "C" __global__` written out by
    hand in kernels_cu/ calls sharpinf_pdl_enter() (the macro entries get it from SHARPINF_ENTRY_ATTRS)."""
    import re

    missing = []
    for src in sorted(kernels_dir().glob("*.cu")):
        text = src.read_text()
        for m in re.finditer(r'extern "C" __global__ void[^{]*\{', text):
            if not text[m.end():m.end() + 200].lstrip().startswith("sharpinf_pdl_enter();"):
                missing.append(f"{src.name}: {text[m.start():m.end()][:60]}")
    assert not missing


@pytest.mark.skipif(pip_nvrtc_library() is None, reason="pip install nvidia-cuda-nvrtc-cu12")
@pytest.mark.parametrize("name, matrices, sfx", [("matmul_dp4a", 1, ""), ("gate_up_dp4a", 2, ""),
                                                 ("matmul_gemv", 1, "_t1"), ("gate_up_gemv", 2, "_t8")])
def test_the_matvecs_ask_for_their_rows_before_they_wait(name, matrices, sfx):
    """The build the backend makes with SHARPINF_PDL=1 (-DSHARPINF_PDL_PREFETCH=1, optimized, sm_90): each
    kind of decode-matvec entry (dp4a's and gemv's) (float weights; G at run time; G 16 and 32 compiled in) keeps the
    contract and issues its bulk L2 prefetch -- one a matrix -- before its wait; the default build has
    none. (Every entry's contract in the default build: test_nvrtc_compile.py.)"""
    from sharpinf.runtime.cuda_source import selection_defines
    from sharpinf.runtime.nvrtc_check import Nvrtc, compile_options
    from sharpinf.runtime.pdl_check import _bodies, entry_verdicts

    nv = Nvrtc()
    src = kernels_dir() / f"{name}.cu"
    entries = [f"{name}_{t}{sfx}{g}" for t, g in (("f16", ""), ("q4_0", ""), ("q4_1", "_g16"), ("q4_k", "_g32"),
                                                   ("q6_k", "_g32"))]
    # make test: an entry of each kind; make test-all: every entry (with the NVRTC test's optimized builds of
    # every file, the whole of what a PDL run executes is then checked)
    full = os.environ.get("SHARPINF_TEST_TIER") == "all"
    opts = compile_options("sm_90", [src.parent], nv.major) + ([] if full else list(selection_defines(entries)))
    for define, want in (("-DSHARPINF_PDL_PREFETCH=1", matrices), ("-DSHARPINF_PDL_PREFETCH=0", 0)):
        ok, log, ptx = nv.compile(src.read_text(), src.name, opts + [define], ptx=True)
        assert ok, log
        text = ptx.rstrip(b"\0").decode()
        verdicts = entry_verdicts(text)  # the wanted entries, and those their names' prefixes select
        assert set(verdicts) >= set(entries) and not [k for k, v in verdicts.items() if v is not None]
        for entry, body in _bodies(text).items():
            before = body[:next(i for i, line in enumerate(body) if line.startswith("griddepcontrol.wait"))]
            assert sum("cp.async.bulk.prefetch.L2.global" in line for line in before) == want, (entry, define)


@pytest.mark.gpu
@pytest.mark.parametrize("kernels", ["fast", "matmul=dp4a,link=layer,attention=split,rope_kv=fused"])
def test_pdl_launches_give_the_bits_of_ordinary_ones(monkeypatch, kernels):
    """On a GPU from sm_90 (skipped elsewhere): a forward pass whose kernels start early (SHARPINF_PDL=1:
    a kernel's blocks placed while the one before it runs; the matvecs' L2 prefetch compiled in) gives
    the logits and tokens of ordinary launches, eager and replayed from graphs, step by step through
    prefill, chunked, mixed and decode steps -- a kernel that read its inputs before its wait would
    read them half-written. The link variant's cooperative launches stay ordinary among them."""
    from sharpinf.model.loader import load_model
    from sharpinf.model.synth import synthetic_model
    from oracles.graph_oracle import _Driver, oracle_graph_vs_eager, standard_schedule
    from sharpinf.runtime.cuda_backend import CudaBackend
    from sharpinf.step.forward import ForwardPass

    monkeypatch.delenv("SHARPINF_PDL", raising=False)
    off = CudaBackend()
    monkeypatch.setenv("SHARPINF_PDL", "1")
    on = CudaBackend()
    if on.describe()["pdl"] != "on":
        pytest.skip(on.describe()["pdl"])
    model = load_model(synthetic_model("qwen3", "Q4_K", n_embd=256))
    fp_on, fp_off = ForwardPass(model, on, kernels=kernels), ForwardPass(model, off, kernels=kernels)
    sched = standard_schedule(fp_on.cfg.n_vocab)
    r = oracle_graph_vs_eager(fp_on, sched, block_size=4)
    assert r.passed, r.detail
    cap = sched.capacity()
    runs = []
    for fp in (fp_on, fp_off):
        eager = fp.with_own_buffers(cap)
        eager.exact_shapes = True
        d = _Driver(eager, sched, "f16", 4, 0)
        runs.append([d.step(st) for st in sched.steps])
    for i, ((l_on, s_on), (l_off, s_off)) in enumerate(zip(*runs)):
        assert np.array_equal(l_on.view(np.uint32), l_off.view(np.uint32)), f"step {i}: logits differ"
        assert np.array_equal(s_on, s_off), f"step {i}: sampled {s_on} vs {s_off}"
