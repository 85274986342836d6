"""Launch chosen kernel-bench cases once each, for a profiler (Nsight Compute) to read.

    ncu --clock-control none --profile-from-start off [-k regex:NAMES] [--section ...] \\
        python3 bench/ncu_targets.py MODEL [--op matmul,ffn_in] [--variant mmq,mmq_narrow] \\
            [--decode 1,64] [--prefill 512] [--prefill-attention 512] [--context 512]

The cases are `sharpinf bench --suite kernels`'s (bench.suites.kernel_variants.case_groups: the
model's layer-0 shapes, random data of the right form), but where the bench replays each case in a
graph hundreds of times, this runs each selected case's launch exactly once, after one warm-up
pass of all of them (the kernels compiled, the first-launch costs paid), between
cudaProfilerStart and cudaProfilerStop: a profiler told to wait for them (ncu --profile-from-start
off) sees one launch per (case, N), in the order printed, and nothing else but the cases' own
extra launches (filter those with -k). --op names bench ops exactly (matmul: the projections and
the LM head, ffn_in: gate + up + activation, attention, rope_kv, sample, moe, norm); a baseline
is launched only when --variant names it.
The profiler's numbers are per launch: stall reasons (WarpStateStats), issue slots
(SchedulerStats), pipes (ComputeWorkloadAnalysis), bytes (MemoryWorkloadAnalysis), occupancy.
"""

from __future__ import annotations

import argparse
from contextlib import contextmanager


def _ints(s: str) -> list[int]:
    try:
        out = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"expected a comma list of token counts, got {s!r}") from None
    if any(n < 1 for n in out):
        raise SystemExit(f"token counts are >= 1, got {s!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="registered name, .gguf path, or SHAPE-shape:TYPE (qwen3-8b-shape:Q4_K)")
    ap.add_argument("--op", default="matmul,ffn_in", help="bench ops to launch (exactly these; comma list)")
    ap.add_argument("--variant", default="dp4a,mmq,mmq_narrow", help="variants to launch (comma list)")
    ap.add_argument("--decode", default="1,64", help="decode token counts (comma list; '' for none)")
    ap.add_argument("--prefill", default="512", help="prefill GEMM token counts (comma list; '' for none)")
    ap.add_argument("--prefill-attention", default="", help="prompt lengths for prefill attention (comma list)")
    ap.add_argument("--context", type=int, default=512, help="decode attention: keys a sequence has")
    ap.add_argument("--kv-dtype", default="f16")
    ap.add_argument("--backend", default="auto", help="cuda, emu, or auto")
    a = ap.parse_args(argv)

    from bench.suites.common import BenchContext, resolve_bench_model
    from bench.suites.kernel_variants import Selection, case_groups
    from sharpinf.model.loader import load_model
    from sharpinf.runtime.select import get_backend

    ops = {o.strip() for o in a.op.split(",") if o.strip()}
    variants = {v.strip() for v in a.variant.split(",") if v.strip()}
    sel = Selection.parse(",".join(sorted(ops)), ",".join(sorted(variants)))
    be = get_backend(a.backend)
    path, label = resolve_bench_model(a.model)
    ctx = BenchContext(be, load_model(path), label, out_dir=None, kernels="fast")
    groups = case_groups(ctx, sel, _ints(a.decode), a.context, a.kv_dtype, _ints(a.prefill), _ints(a.prefill_attention))
    chosen = [(phase, N, c) for phase, N, make in groups for c in make() if c.op in ops and c.variant in variants]
    if not chosen:
        raise SystemExit("no case matches --op/--variant at these token counts (a variant serves only some N: "
                         "`sharpinf kernels list`)")
    for _, _, c in chosen:  # warm-up: compile, first-launch costs
        c.calls[0]()
    be.synchronize()
    print("launching once each (the profiled order):", flush=True)
    with _profiled(be):
        for phase, N, c in chosen:
            c.calls[0]()
            be.synchronize()
            print(f"  {phase:7s} N={N:<5d} {c.op:9s} {c.variant:11s} {c.shape}", flush=True)
    return 0


@contextmanager
def _profiled(be):
    """cudaProfilerStart/Stop around the launches (on the cuda backend): under `ncu --profile-from-start
    off` only they are profiled, not the warm-up or the cases' set-up kernels."""
    rt = None
    if be.name == "cuda":
        import cupy

        rt = cupy.cuda.runtime
        rt.profilerStart()
    try:
        yield
    finally:
        if rt is not None:
            rt.profilerStop()


if __name__ == "__main__":
    raise SystemExit(main())
