"""Benchmark models of real models' shapes: tiled random weights of the real sizes (synth.py's tile_rows),
cached on disk -- for the kernels and peers suites, never for oracles."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from . import quants
from .synth import _cache_dir, write_synthetic_model

# Real models' shapes for benchmarks (write_synthetic_model(..., **SHAPES[name], tile_rows=64)).
SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m": dict(arch="llama", n_layer=30, n_embd=576, n_head=9, n_head_kv=3, n_ff=1536, n_vocab=49152,
                         context_length=8192, rope_theta=100000.0),
    "qwen3-8b": dict(arch="qwen3", n_layer=36, n_embd=4096, n_head=32, n_head_kv=8, n_ff=12288, n_vocab=151936,
                     head_dim=128, context_length=40960, rope_theta=1000000.0, tied=False, rms_eps=1e-6),
    # 30.5 B parameters, 3.3 B active: 128 experts of 768, 8 a token (feed_forward_length as the real file's)
    "qwen3-30b-a3b": dict(arch="qwen3moe", n_layer=48, n_embd=2048, n_head=32, n_head_kv=4, n_ff=6144,
                          n_expert=128, n_expert_used=8, n_ff_exp=768, n_vocab=151936, head_dim=128,
                          context_length=40960, rope_theta=1000000.0, tied=False, rms_eps=1e-6),
    # 20.9 B parameters, 3.6 B active: 32 MXFP4 experts of 2880, 4 a token; windows of 128 on every other layer
    "gpt-oss-20b": dict(arch="gpt-oss", n_layer=24, n_embd=2880, n_head=64, n_head_kv=8, n_ff=2880, n_expert=32,
                        n_expert_used=4, n_ff_exp=2880, n_vocab=201088, head_dim=64, context_length=131072,
                        rope_theta=150000.0, sliding_window=128),
}


def check_shape_type(name: str, qtype: str) -> None:
    """ValueError where SHAPES[name]'s rows (n_embd, the FFN's, the attention's q_dim) do not fit qtype's
    blocks, or qtype is no supported type -- what writing the model would refuse, said before it starts."""
    spec = SHAPES[name]
    t = quants.qtype_from_name(qtype)
    for n in (spec["n_embd"], spec["n_ff"], spec.get("n_ff_exp", spec["n_ff"]),
              spec["n_head"] * spec.get("head_dim", spec["n_embd"] // spec["n_head"])):
        quants.row_bytes(t, n)


def shape_model(name: str, qtype: str, directory: str | Path | None = None) -> Path:
    """A benchmark model of a real model's shape (SHAPES) in qtype, tiled weights, cached on disk."""
    spec = dict(SHAPES[name])
    arch = spec.pop("arch")
    path = Path(directory or _cache_dir()) / f"{name}-shape-{qtype.lower()}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        write_synthetic_model(tmp, arch, qtype, tile_rows=64, **spec)
        os.replace(tmp, path)
    return path
