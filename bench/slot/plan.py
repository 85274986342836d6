"""The slot's stages, in the order they are spent, each with its budget, and the runs inside each: the
commands, the seconds each is expected to take (the 2026-11-26 H200 run's, or an estimate where it had
none) and the most it may take. What a run's figures decide lives beside the rule it decides (the
comments at its command say where); this file says only what runs, how long, and in which order.

A run's argv holds placeholders the runner fills (`Ctx.fill`): {py} (the interpreter), {run} (this
slot's result folder, <gpu>-<date>), {results} (its parent), {llama} (a llama.cpp build, or
`committed`: peers.py then takes llama.cpp's figures from the newest committed run), {smol} (the
real SmolLM2 when its halves came, else its shape model), {xdist} (pytest-xdist's flags, when the box
has it), {ncu}."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
M8, MS = "qwen3-8b-shape:Q4_K", "smollm2-135m-shape:Q4_1"  # the two shape models (sharpinf.model.synth)
MOE = "qwen3-30b-a3b-shape:Q4_K"
ATTENTION_MODES = ("split", "walk")  # SHARPINF_ATTENTION_MODE's values (ops/attention.py), not variants
BENCH = ("{py}", "-m", "sharpinf", "bench")
KERNEL_TESTS = tuple(sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_kernels_*.py")))


@dataclass(frozen=True)
class Run:
    id: str  # a file-name word: the log's name and the state's key
    argv: tuple[str, ...]
    expected_s: float  # what it should take; a run with less left than this is skipped, and says so
    limit_s: float  # the most it may take (then it is cut, its finished rows kept)
    env: dict = field(default_factory=dict)
    ops: tuple[str, ...] = ()  # a kernels-suite run's registry ops: its --variant leaves out the gate's failures
    requires: tuple[str, ...] = ()  # runs that must have passed first (a bits check before its timings)


@dataclass(frozen=True)
class Stage:
    name: str
    budget_s: float
    runs: tuple[Run, ...]
    optional: bool = False  # only with time left after the required stages' budgets

    @property
    def expected_s(self) -> float:
        return sum(r.expected_s for r in self.runs)


def kernels(rid: str, model: str, op: str, sizes: str, prefill: str, out: str, exp: float, lim: float,
            variant: str = "", env: dict | None = None, repeats: int = 3, extra: tuple = ()) -> Run:
    """A `sharpinf bench --suite kernels` run (its ops' failed variants left out by the runner)."""
    argv = BENCH + (model, "--backend", "cuda", "--suite", "kernels", "--op", op, "--batch-sizes", sizes,
                    "--prefill-sizes", prefill, "--repeats", str(repeats)) + extra
    argv += (("--variant", variant) if variant else ()) + ("--out", "{run}/" + out)
    from bench.suites.kernel_cases import BENCH_OPS

    ops = tuple(dict.fromkeys(BENCH_OPS.get(o, o) for o in op.split(",")))
    return Run(rid, argv, exp, lim, env or {}, ops=ops)


def decode(rid: str, model: str, spec: str, sizes: str, out: str, exp: float, lim: float, env: dict | None = None,
           context: str = "") -> Run:
    argv = BENCH + (model, "--backend", "cuda", "--suite", "decode", "--kernels", spec, "--batch-sizes", sizes)
    return Run(rid, argv + (("--context", context) if context else ()) + ("--out", "{run}/" + out), exp, lim, env or {})


def stream(rid: str, model: str, spec: str, out: str, exp: float, lim: float, env: dict | None = None,
           requires: tuple[str, ...] = ()) -> Run:
    """Single-stream decode through the engine (bench/single_stream.py: graphs, then eager)."""
    return Run(rid, ("{py}", "bench/single_stream.py", "--model", model, "--backend", "cuda", "--kernels", spec,
                     "--prompt", "1", "--decode", "128", "--repeats", "3", "--out", "{run}/" + out), exp, lim, env or {},
               requires=requires)


def pytest(rid: str, files: tuple[str, ...], select: str, exp: float, lim: float, env: dict | None = None) -> Run:
    argv = ("{py}", "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "{xdist}", "--junitxml",
            "{run}/" + rid + ".xml") + (("-k", select) if select else ()) + files
    return Run(rid, argv, exp, lim, env or {})


def probe(rid: str, defines: str, model: str, op: str, variant: str, sizes: str, prefill: str, exp: float = 30,
          repeats: int = 3) -> Run:
    """The kernels compiled with a kernel's #ifndef knobs set (SHARPINF_NVRTC_OPTIONS) -- the header of the
    kernel that reads each knob says what its timing decides."""
    return kernels(rid, model, op, sizes, prefill, rid, exp, 2 * exp, variant, {"SHARPINF_NVRTC_OPTIONS": defines},
                   repeats)


def stages(gate_first: str, gate_rest: str) -> tuple[Stage, ...]:
    """Every stage, in order; gate_first / gate_rest: the -k expressions of the never-GPU-run variants' tests
    and of the others (bench/slot/gate.py)."""
    fix = {"SHARPINF_ATTENTION_MODE": "split"}  # comparable with 2026-11-26's rows (ops/attention.py's rule)
    attn = "{run}/qwen3-8b-shape-attention"
    return (
        Stage("setup", 60, (Run("models", ("{py}", "-c", "from sharpinf.model.shapes import shape_model as s; "
                                           "print(s('smollm2-135m', 'Q4_1'), s('qwen3-8b', 'Q4_K'))"), 20, 60),)),
        Stage("gate", 90, (pytest("gate-new", KERNEL_TESTS, gate_first, 35, 60),
                           pytest("gate-rest", KERNEL_TESTS, gate_rest, 45, 60))),
        # sharpinf beside llama.cpp on both shapes (bench/peers.py): pp512, tg128, decode_s1/s8/s64
        Stage("peers", 150, (Run("peers", ("{py}", "bench/gpu_check.py", "--only", "peers", "--kernels", "fast",
                                           "--llamacpp", "{llama}", "--peers-sizes", "r=3", "--out", "{results}"),
                                 120, 150),)),
        # best's thresholds (ops/matmul_mmq.py's matmul_best) at the token counts that set them
        Stage("matmul", 75, (kernels("matmul-8b", M8, "matmul", "1,8,16,64", "512", "qwen3-8b-shape-matmul", 55, 75),)),
        # matmul=tuned (ops/matmul_tuned.py; variants.py's SETS: it joins fast if it wins)
        Stage("tuned", 130, (decode("decode-8b-tuned", M8, "tuned", "1,8,64", "qwen3-8b-shape-decode-tuned", 60, 90,
                                    context="192"),
                             stream("tg-8b-tuned", M8, "tuned", "single_stream_qwen3-8b-shape_tuned.json", 40, 60))),
        # programmatic dependent launch (runtime/cuda_backend.py): its bits first, then decode off and on
        Stage("pdl", 130, (Run("pdl-check", ("{py}", "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                                             "tests/test_pdl.py", "-k", "ordinary_ones"), 20, 60, {"SHARPINF_PDL": "1"}),
                           *(stream(f"tg-pdl{p}-{m.split('-')[0]}", m, "fast", f"single_stream_{m.split(':')[0]}_pdl{p}.json",
                                    t, 2 * t, {"SHARPINF_PDL": str(p)}, ("pdl-check",))
                             for m, t in ((MS, 15), (M8, 25)) for p in (0, 1)))),
        # the attention rule's two constants (ops/attention.py's walks_pays): split and walk, fitted below
        Stage("attention", 150, (
            kernels("attn-split", M8, "attention", "1,64", "512,2048", "qwen3-8b-shape-attention", 30, 80, env=fix,
                    extra=("--context", "512")),
            kernels("attn-walk", M8, "attention", "1,64", "512,2048", "qwen3-8b-shape-attention-walk", 30, 80,
                    "split,flash", {"SHARPINF_ATTENTION_MODE": "walk"}, extra=("--context", "512")),
            *(kernels(f"attn-4k-{m}", M8, "attention", "8,64", "", f"qwen3-8b-shape-attention-4k-{m}", 20, 45,
                      "split,flash", {"SHARPINF_ATTENTION_MODE": m}, extra=("--context", "4096")) for m in ATTENTION_MODES),
            Run("walk-rule-fit", ("{py}", "bench/walk_rule_fit.py") + tuple(
                f"{attn}{s}/kernels.json" for s in ("", "-walk", "-4k-split", "-4k-walk")), 2, 30,
                requires=("attn-split", "attn-walk", "attn-4k-split", "attn-4k-walk"))), optional=True),
        # the launch floor (issue 20): SmolLM2's decode in the fast set, the fused FFN, the layer link
        Stage("floor", 100, tuple(decode(f"decode-{k}", MS, spec, "1,8", f"smollm2-135m-shape-decode-{k}", 25, 60)
                                  for k, spec in (("fast", "fast"),
                                                  ("ffn", "matmul=dp4a,ffn=fused,attention=split,rope_kv=fused,sample=radix"),
                                                  ("layer", "matmul=dp4a,link=layer,attention=split,rope_kv=fused,sample=radix"))),
              optional=True),
        # the head's sampling over 152k logits (issue 20: <= 20 us a row)
        Stage("sampling", 45, (kernels("sample-8b", M8, "sample", "1,8,64", "128", "qwen3-8b-shape-sample", 30, 60,
                                       repeats=5),), optional=True),
        # packed prefill (issue 19: 8 x 128 packed >= 4x sequential)
        Stage("prefill", 45, (Run("prefill", BENCH + (MS, "--backend", "cuda", "--suite", "prefill", "--kernels", "fast",
                                                      "--prefill-prompts", "8", "--prefill-len", "128", "--repeats", "5",
                                                      "--out", "{run}/smollm2-135m-shape-prefill"), 30, 60),),
              optional=True),
        # speculative decoding (issue 54): n-gram on code edits and draft pairs beside plain decoding (tokens/s,
        # target passes a token, identical outputs), and a verification step's cost at 2..8 tokens a sequence
        Stage("speculative", 120, (Run("speculative", BENCH + ("{smol}", "--backend", "cuda", "--suite", "speculative",
                                                               "--kernels", "fast", "--out",
                                                               "{run}/smollm2-135m-speculative"), 60, 120),),
              optional=True),
        Stage("probes", 480, probes(), optional=True),
        Stage("ncu", 240, ncu(), optional=True),
        # the MoE shape: peers beside llama.cpp, and the routed FFN in each moe variant (the registry's token ranges)
        Stage("moe", 300, (Run("models-moe", ("{py}", "-c", "from sharpinf.model.shapes import shape_model as s; "
                                              f"print(s('qwen3-30b-a3b', 'Q4_K'))"), 60, 120),
                           Run("peers-moe", ("{py}", "bench/gpu_check.py", "--only", "peers", "--kernels", "fast",
                                             "--llamacpp", "{llama}", "--peers-models", MOE, "--peers-sizes", "r=2",
                                             "--out", "{run}/moe"), 150, 240, requires=("models-moe",)),
                           kernels("moe-kernels", MOE, "moe", "1,8,64", "512", "qwen3-30b-a3b-shape-moe", 60, 120,
                                   "grouped,gemv,mmq")), optional=True),
        Stage("oracles", 240, (Run("oracles", ("{py}", "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                                               "{xdist}", "--junitxml", "{run}/oracles.xml",
                                               "tests/test_forward_oracles.py"), 180, 240),), optional=True),
    )


def probes() -> tuple[Run, ...]:
    """The same kernels compiled another way (each knob's #ifndef header says what its timing decides), then
    the 8B decode on gemv, the fused kernels' launches and PDL in the kernels and decode suites."""
    co = tuple(probe(f"gemv-co{lv}", f"-DGV_COALESCE={lv}", "{smol}", "matmul", "dp4a,gemv", "1,8", "16", 20, 5)
               for lv in (0, 1, 2))
    bounds = tuple(kernels(f"link-bounds-{m.split('-')[0]}", m, "ffn,link", "1,8", "", f"{m.split(':')[0]}-link-bounds",
                           25, 60, env={"SHARPINF_NVRTC_OPTIONS": "-DLK_MIN_BLOCKS=0 -DFFN_MIN_BLOCKS=8"}) for m in (MS, M8))
    return (
        probe("mmq-r128", "-DMQ_GROUP_SHARED=1 -DMQ_MIN_BLOCKS_1=4", M8, "matmul", "dp4a,mmq", "64", "512"),
        probe("mmq-i2f", "-DDP_I2F_CVT=1", M8, "matmul", "dp4a,mmq", "64", "512"),
        probe("dp4a-g0", "-DDP_FIXED_G=0", M8, "matmul", "dp4a,gemv", "1,8", "16"),
        probe("dp4a-break", "-DDP_TILE_BREAK=1", M8, "matmul", "dp4a", "1,8", "", 20),
        probe("gemv-u2", "-DGV_U=2", M8, "matmul", "gemv", "1,4,8", "16", 20),
        *co,
        probe("gemv-co2-8b", "-DGV_COALESCE=2", M8, "matmul", "gemv", "1,8", "16", 20),
        decode("decode-8b-gemv", M8, "matmul=gemv,attention=split,rope_kv=fused,sample=radix", "1,8",
               "qwen3-8b-shape-decode-gemv", 30, 60, context="192"),
        kernels("link-smol", MS, "ffn,link", "1,8", "128", "smollm2-135m-shape-link", 25, 60, repeats=5),
        kernels("link-8b", M8, "ffn,link", "1,8", "", "qwen3-8b-shape-link", 25, 60),
        *bounds,
        kernels("matvec-pdl", M8, "matmul", "1,8", "", "qwen3-8b-shape-matmul-pdl", 20, 45, "dp4a,gemv",
                {"SHARPINF_PDL": "1"}),
        decode("decode-fast-pdl", MS, "fast", "1,8", "smollm2-135m-shape-decode-fast-pdl", 25, 60, {"SHARPINF_PDL": "1"}),
        decode("decode-fast-g0", MS, "fast", "1,8", "smollm2-135m-shape-decode-fast-g0", 25, 60,
               {"SHARPINF_NVRTC_OPTIONS": "-DDP_FIXED_G=0"}),
    )


def ncu() -> tuple[Run, ...]:
    """Nsight Compute's counters of the kernels the next kernel work is about (bench/ncu_targets.py)."""
    head = ("{ncu}", "--clock-control", "none", "--profile-from-start", "off", "-k")
    big = head + ("regex:^((matmul|gate_up)_(dp4a|mmq|mmq_narrow)_q4_k(_g16|_g32)?|attention_split_.*)$",
                  *(x for s in ("SpeedOfLight", "LaunchStats", "Occupancy", "SchedulerStats", "WarpStateStats",
                                "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis") for x in ("--section", s)),
                  "{py}", "bench/ncu_targets.py", M8, "--backend", "cuda", "--op", "matmul,ffn_in,attention",
                  "--variant", "dp4a,mmq,mmq_narrow,split", "--decode", "1,64", "--prefill", "512", "--context", "512")
    small = head + ("regex:^(matmul|gate_up)_dp4a_q(4_1|8_0)(_g16|_g32)?$",
                    *(x for s in ("SpeedOfLight", "MemoryWorkloadAnalysis", "SchedulerStats", "WarpStateStats")
                      for x in ("--section", s)),
                    "{py}", "bench/ncu_targets.py", MS, "--backend", "cuda", "--op", "matmul,ffn_in", "--variant", "dp4a",
                    "--decode", "1", "--prefill", "")
    return (Run("ncu-8b", big, 150, 180), Run("ncu-smol", small, 40, 60))
