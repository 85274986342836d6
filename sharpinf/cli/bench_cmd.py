"""`sharpinf bench [MODEL]`: the benchmark suites (throughput, decode, prefill, chunking, kernels, host, serve,
speculative).

Each suite shows a progress bar and a results table, and writes DIR/<suite>.json and
DIR/<suite>.png (DIR defaults to ~/.cache/bench/suites/<backend>/, outside the source tree:
committed results are written only where --out says, e.g. bench/results/...). With --json the tables go to
stderr and stdout gets one JSON object: {"suites": {name: result}}.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.text import Text

from sharpinf.cli.app import app
from sharpinf.cli.common import KERNELS_HELP
from sharpinf.errors import SharpinfError

SUITE_NAMES = ("throughput", "decode", "prefill", "chunking", "kernels", "host", "serve", "speculative")


def _parse_suites(text: str) -> list[str]:
    names = [s.strip().lower() for s in text.split(",") if s.strip()]
    if not names or names == ["all"]:
        return list(SUITE_NAMES)
    bad = [n for n in names if n not in SUITE_NAMES]
    if bad:
        raise SharpinfError(f"unknown suite(s) {', '.join(bad)}: choose all or any of {', '.join(SUITE_NAMES)}")
    return names


def _parse_range(text: str | None, what: str) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        parts = [int(p) for p in text.replace(":", "-").split("-")]
    except ValueError:
        raise SharpinfError(f"{what} must be N or LO-HI, got {text!r}") from None
    lo, hi = (parts[0], parts[0]) if len(parts) == 1 else (parts[0], parts[1]) if len(parts) == 2 else (0, -1)
    if not 1 <= lo <= hi:
        raise SharpinfError(f"{what} must be N or LO-HI with 1 <= LO <= HI, got {text!r}")
    return lo, hi


@app.command()
def bench(
    model: str = typer.Argument(None, help="Registered name or .gguf path (default: synthetic llama Q8_0, "
                                           "n_embd=128, 2 layers; 'synth' names it too); SHAPE-shape:TYPE (e.g. "
                                           "qwen3-8b-shape:Q4_K) a benchmark model of a real model's shape."),
    backend: str = typer.Option("auto", "--backend", help="emu, cuda, or auto."),
    suite: str = typer.Option("all", "--suite", help="all, or any of throughput,decode,prefill,chunking,kernels,host,serve,speculative "
                              "(comma list). kernels: every variant of every op on the model's shapes, GB/s beside "
                              "the device bandwidth. host: the host's share of an engine step on the trace backend "
                              "(kernels counted, not run), whatever --backend says. serve: a bounded load test of "
                              "`sharpinf serve` on loopback (req/s, tok/s, TTFT, TPOT, ITL, failures). speculative: n-gram "
                              "and draft-model speculation beside plain decoding (guesses kept, target passes a token, "
                              "tok/s, identical outputs) and a verification step's cost at 2..8 tokens a sequence."),
    kernels: str = typer.Option("auto", "--kernels", help=KERNELS_HELP + " (every suite but kernels, which runs all)"),
    out: Path = typer.Option(None, "--out", help="Results folder (default ~/.cache/bench/suites/<backend>/; "
                             "--out bench/results/... to add results to the repository)."),
    op: str = typer.Option(None, "--op", help="kernels: only these ops (comma list): the registry's matmul, ffn "
                           "(a decode step's FFN fused; dense models), link (all between two attentions in one "
                           "launch; dense models), attention, rope_kv, moe (MoE models), sample (the head's "
                           "sampling), or the bench's own norm and ffn_in (gate+up; matmul stands for norm, matmul "
                           "and ffn_in)."),
    variant: str = typer.Option(None, "--variant", help="kernels: only these variants (comma list; the op's baseline "
                                "is timed too, for the speedup). `sharpinf kernels list` names them."),
    json_out: bool = typer.Option(False, "--json", help="Print all results as one JSON object on stdout."),
    quick: bool = typer.Option(False, "--quick", help="Small sizes: a smoke run (tests use it)."),
    requests: int = typer.Option(None, "--requests", help="throughput, serve: number of requests."),
    prompt_len: str = typer.Option(None, "--prompt-len", help="throughput, serve: prompt length N or LO-HI."),
    output_len: str = typer.Option(None, "--output-len", help="throughput, serve: output length N or LO-HI; "
                            "speculative: tokens a request (HI)."),
    rate: float = typer.Option(None, "--rate", help="throughput: Poisson arrival rate (0 or inf: all at once)."),
    rate_unit: str = typer.Option("step", "--rate-unit", help="throughput: rate per engine 'step' or per 's'."),
    max_batched_tokens: int = typer.Option(None, "--max-batched-tokens", help="throughput, host, serve: per-step token budget."),
    num_blocks: int = typer.Option(None, "--num-blocks", help="throughput, serve: KV pool blocks (default: sized by the engine)."),
    batch_sizes: str = typer.Option(None, "--batch-sizes", help="decode, speculative (its step cost): comma list of "
                                    "B, e.g. 1,2,4,8; kernels: "
                                    "the token counts N (default 1,8,64)."),
    context: int = typer.Option(None, "--context", help="decode, kernels, speculative (its step "
                             "cost): context length of every sequence."),
    prefill_prompts: int = typer.Option(None, "--prefill-prompts", help="prefill: number of prompts S."),
    prefill_sizes: str = typer.Option(None, "--prefill-sizes", help="kernels: comma list of prefill sizes, the "
                                      "GEMMs' and moe's N and the prompt lengths of prefill attention (on a GPU by "
                                      "default 128,512,2048 and 512,2048,8192); '' or none: no prefill rows."),
    prefill_len: int = typer.Option(None, "--prefill-len", help="prefill: tokens per prompt."),
    budget: int = typer.Option(None, "--budget", help="chunking: per-step token budget."),
    long_mult: int = typer.Option(None, "--long-mult", help="chunking: long prompt = this x the budget."),
    repeats: int = typer.Option(None, "--repeats", help="decode/prefill/kernels/speculative: timed repeats."),
    concurrency: int = typer.Option(None, "--concurrency", help="serve: requests in flight at once; speculative: "
                                   "the streams beside 1."),
    seed: int = typer.Option(0, "--seed", help="Seed of the prompts and arrivals."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Check the arguments (suites, sizes, --kernels, --op, "
                                 "--variant, the model's name) and print each suite's settings, loading no model "
                                 "and starting no backend: a long command line proved before a GPU runs it."),
):
    """Benchmarks of the engine and the forward pass, with tables, JSON and plots."""
    from bench.suites import SUITES
    from bench.suites.common import BenchContext, dumps, finish_rows, resolve_bench_model, write_json
    from sharpinf.model.loader import load_model
    from sharpinf.cli.common import backend_named, kernels_spec, make_console

    names = _parse_suites(suite)
    kernels = kernels_spec(kernels)
    if rate_unit not in ("step", "s"):
        raise SharpinfError(f"--rate-unit must be 'step' or 's', got {rate_unit!r}")
    for name, v in (("--requests", requests), ("--max-batched-tokens", max_batched_tokens), ("--num-blocks", num_blocks),
                    ("--context", context), ("--prefill-prompts", prefill_prompts), ("--prefill-len", prefill_len),
                    ("--budget", budget), ("--long-mult", long_mult), ("--repeats", repeats),
                    ("--concurrency", concurrency)):
        if v is not None and v < 1:
            raise SharpinfError(f"{name} must be >= 1, got {v}")
    if rate is not None and rate < 0:
        raise SharpinfError(f"--rate must be >= 0, got {rate}")
    psizes = None
    if prefill_sizes is not None and prefill_sizes.strip().lower() in ("", "none"):
        psizes = []
    elif prefill_sizes is not None:
        try:
            psizes = sorted({int(b) for b in prefill_sizes.split(",") if b.strip()})
        except ValueError:
            raise SharpinfError(f"--prefill-sizes must be a comma list of integers, got {prefill_sizes!r}") from None
        if not psizes or psizes[0] < 1:
            raise SharpinfError(f"--prefill-sizes must be integers >= 1, got {prefill_sizes!r}")
    bsizes = None
    if batch_sizes is not None:
        try:
            bsizes = sorted({int(b) for b in batch_sizes.split(",") if b.strip()})
        except ValueError:
            raise SharpinfError(f"--batch-sizes must be a comma list of integers, got {batch_sizes!r}") from None
        if not bsizes or bsizes[0] < 1:
            raise SharpinfError(f"--batch-sizes must be integers >= 1, got {batch_sizes!r}")
    plen, olen = _parse_range(prompt_len, "--prompt-len"), _parse_range(output_len, "--output-len")

    console = make_console(stderr=json_out)
    if (op or variant) and "kernels" not in names:
        raise SharpinfError("--op and --variant select cases of --suite kernels")
    if "kernels" in names:
        from bench.suites.kernel_variants import Selection

        Selection.parse(op, variant)  # a bad --op or --variant: one line, before anything loads
    overrides = {
        "throughput": dict(requests=requests, prompt_len=plen, output_len=olen, rate=rate, rate_unit=rate_unit,
                           max_num_batched_tokens=max_batched_tokens, num_blocks=num_blocks),
        "decode": dict(batch_sizes=bsizes, context=context, repeats=repeats),
        "prefill": dict(prompts=prefill_prompts, prompt_len=prefill_len, repeats=repeats),
        "chunking": dict(budget=budget, long_mult=long_mult),
        "kernels": dict(tokens=bsizes, context=context, repeats=repeats, prefill=psizes, prefill_context=psizes,
                        ops=op, variants=variant),
        "host": dict(budget=max_batched_tokens),
        "speculative": dict(max_tokens=olen[1] if olen else None, step_batch=bsizes, context=context, repeats=repeats,
                            streams=sorted({1, concurrency}) if concurrency else None),
        "serve": dict(requests=requests, concurrency=concurrency, prompt_len=plen, output_len=olen,
                      max_num_batched_tokens=max_batched_tokens, num_blocks=num_blocks),
    }
    if dry_run:
        _dry_run(console, json_out, model, backend, names, overrides, quick, op)
        return
    be = backend_named(backend)
    path, label = resolve_bench_model(model)
    loaded = load_model(path)
    from sharpinf.runtime.paths import cache_dir

    out_dir = Path(out) if out is not None else cache_dir("bench") / be.name
    ctx = BenchContext(be, loaded, label, out_dir, quick=quick, console=console, seed=seed, kernels=kernels)
    on_gpu = ctx.on_gpu
    pdl = " with programmatic dependent launch" if be.describe().get("pdl") == "on" else ""  # SHARPINF_PDL=1
    console.print(Text.assemble(("sharpinf bench", "bold"), f" {label} on {be.name}{pdl} -> {out_dir}/  suites: "
                                f"{', '.join(names)}" + (" (quick)" if quick else "")))
    docs = {}
    for name in names:
        mod = SUITES[name]
        kw = _settings(name, on_gpu, quick, overrides)
        t0 = time.perf_counter()
        try:
            doc = mod.run(ctx, **kw)
        except ValueError as exc:  # sizes that cannot fit this model
            raise SharpinfError(f"{name}: {exc}") from None
        doc["wall_s"] = time.perf_counter() - t0
        json_path = write_json(out_dir / f"{name}.json", doc)
        finish_rows(json_path)
        png = mod.plot(doc, out_dir / f"{name}.png")
        console.print(mod.table(doc))
        console.print(f"  wrote {json_path}" + (f" and {png}" if png else " (no plot: matplotlib not installed)")
                      + f"  [{doc['wall_s']:.1f} s]")
        docs[name] = doc
    if json_out:
        print(dumps({"suites": docs}))


def _settings(name: str, on_gpu: bool, quick: bool, overrides: dict) -> dict:
    """A suite's settings: its defaults on that backend, the command line's over them."""
    from bench.suites import SUITES

    kw = SUITES[name].defaults(on_gpu, quick)
    kw.update({k: v for k, v in overrides[name].items() if v is not None})
    return kw


def _dry_run(console, json_out: bool, model: str | None, backend: str, names: list[str], overrides: dict,
             quick: bool, op: str | None) -> None:
    """--dry-run: the model's name and the backend's checked without loading or starting either, then each
    suite's settings (_settings) and, for a shape model, the checks the suites make of them."""
    from bench.suites.common import SHAPE_MARK, SYNTH_NAME, check_context, dumps, parse_shape
    from bench.suites.kernel_variants import check_ops
    from sharpinf.runtime.select import NAMES

    if backend.strip().lower() not in NAMES:
        raise SharpinfError(f"unknown backend {backend!r}; choose one of {', '.join(NAMES)}")
    context_length = None  # known without loading for the shape models only
    if model is not None and SHAPE_MARK in model:
        from sharpinf.model.shapes import SHAPES, check_shape_type

        shape, qtype = parse_shape(model)
        try:
            check_shape_type(shape, qtype)
        except ValueError as exc:
            raise SharpinfError(f"{model}: {exc}") from None
        if "kernels" in names:
            check_ops(op, SHAPES[shape].get("n_expert", 0) > 0)
        context_length = SHAPES[shape]["context_length"]
    elif model is not None and model != SYNTH_NAME:
        from sharpinf.model.registry import REGISTRY, unknown_model

        if model not in REGISTRY and not Path(model).expanduser().is_file():
            raise unknown_model(model)
    chosen = backend.strip().lower()
    if chosen == "auto":  # what auto would take here, probed as the backend would, nothing started
        from sharpinf.runtime.cuda_probe import cuda_status

        chosen = "cuda" if cuda_status()[0] else "emu"
    plan = {name: _settings(name, chosen == "cuda", quick, overrides) for name in names}
    for name in ("kernels", "decode"):
        if context_length and name in plan:  # the suites' own check, made before loading
            try:
                check_context(context_length, plan[name]["context"], plan[name].get("prefill_context", ()))
            except ValueError as exc:
                raise SharpinfError(f"{name}: {exc}") from None
    if json_out:
        print(dumps({"dry_run": plan}))
        return
    console.print(Text.assemble(("sharpinf bench --dry-run", "bold"), f" {model or SYNTH_NAME} on {chosen}: "
                                "the arguments hold; nothing loaded, nothing run"))
    for name, kw in plan.items():
        console.print(f"  {name}: " + ", ".join(f"{k}={v}" for k, v in kw.items()), markup=False)
