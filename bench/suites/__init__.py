"""Benchmark suites: `sharpinf bench` (see sharpinf/cli/bench_cmd.py) or run_suites() from Python.

    throughput  requests with Poisson arrivals through the engine: tok/s, TTFT, ITL, KV, prefix cache
    decode      one decode step vs batch size B: weights read once per step for all B sequences;
                ratios: the step at B = 1, 8, 64 and B = 64 / B = 1
    prefill     S prompts in one packed step vs one step each; ratios: one prompt's tokens/s at 512
                and 2048 tokens, 8 x 128 packed vs sequential
    chunking    decoders' inter-token gaps while a long prompt arrives, chunked prefill on vs off
    kernels     each variant of each op (simple vs fast) on the model's shapes, N = 1, 8, 64:
                time, achieved GB/s beside the measured device bandwidth, ptxas registers/spills
    serve       a bounded load generator against `sharpinf serve` on loopback: req/s, tok/s, TTFT,
                TPOT, ITL, end-to-end (mean, p50, p90, p99), failures -- as vLLM's serving benchmark
    speculative n-gram and draft-model speculation beside plain decoding: guesses kept, target passes a
                token, tokens/s, identical outputs; a verification step's cost at 2..8 tokens a sequence
    host        the host's share of an engine step, on the trace backend (launches counted, not run):
                launches and microseconds per step, eager and with CUDA graphs; bytes per kernel

Each suite writes DIR/<suite>.json (device, backend, model, config, results) and DIR/<suite>.png.
"""

from __future__ import annotations

from bench.suites import (chunking_latency, decode_scaling, host_cost, kernel_variants, prefill_packing,
                            serve_load, speculative, throughput)

SUITES = {m.SUITE: m for m in (throughput, decode_scaling, prefill_packing, chunking_latency, kernel_variants,
                               host_cost, serve_load, speculative)}
