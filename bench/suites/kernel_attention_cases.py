"""The kernels bench's attention cases (bench/suites/kernel_variants.py): rope_kv and attention over N
sequences decoding (and the link, which needs their cache), attention over one prompt (prefill) --
each selected variant, with the scratch it declares (the registry's `scratch`, as the Workspace gives it)."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np

from bench.suites.common import BenchContext
from bench.suites.kernel_cases import Case, Selection, copies, link_cases, rand
from sharpinf.ops import attention as attn_ops
from sharpinf.ops import kv_cache as kv_ops
from sharpinf.step.buffers import StepCapacity


def scratch_of(ctx: BenchContext, v, tokens: int, rows: int) -> dict:
    """v's declared scratch for a step of `tokens` tokens and `rows` rows: {name: buffer}."""
    cap = StepCapacity(tokens, 1, rows, 1)
    return {k: b for make in v.scratch for k, b in make(ctx.backend, ctx.forward_pass().cfg, cap).items()}


def attention_variants(ctx: BenchContext, op: str, shape: str, N: int, nbytes: int, args: list, sel: Selection,
                        keys: int, flops: int = 0, window: int | None = None) -> list[Case]:
    """The selected attention variants that fit the model, over the same argument tuples (one per K/V
    copy), as layer 0 runs them (its sliding window, if any: gemma3), each in the launch shape its
    rule takes for a step whose longest context is `keys` keys (or $SHARPINF_ATTENTION_MODE's)."""
    be, cfg = ctx.backend, ctx.forward_pass().cfg
    sw = cfg.window(0)
    if sw:
        shape += f", window {sw}"
    cases = []
    for v in sel.variants_of("attention"):
        if v.why_not(cfg):
            continue
        scratch = scratch_of(ctx, v, window or N, N).get("split")  # the split frame's, as ws.split
        a0 = args[0]  # (be, kv_dtype, ..., n_tokens, n_seqs, n_heads, n_kv_heads, head_dim, ...)
        shape_of = lambda how, v=v, a0=a0, **kw: v.shape(be, a0[1], a0[11], a0[12], cfg.n_head,  # noqa: E731
                                                         cfg.n_head_kv, cfg.head_dim, keys, sw, how,
                                                         file=v.files[0], **kw)
        mode, (rule, inputs) = (shape_of(None), shape_of("auto", explain=True)) if v.shape else (None, (None, None))
        kw = dict(sliding_window=sw) | (dict(mode=mode) if mode else {})
        cases.append(Case(op, shape, v.name, N, nbytes,
                           [lambda v=v, a=a, scratch=scratch, kw=kw: v.launch(*a, scratch, **kw) for a in args],
                           flops, launch_shape=mode, rule_shape=rule,
                           rule=asdict(inputs) if inputs else None))
    return cases


def prefill_attention_cases(ctx: BenchContext, P: int, kv_dtype: str, rng, sel: Selection) -> list[Case]:
    """One prompt of P tokens attending causally from position 0 (its K/V already in the cache)."""
    if "attention" not in sel.ops:
        return []
    be, cfg = ctx.backend, ctx.forward_pass().cfg
    bs = 16
    nblk = -(-P // bs)
    shape_kv, dt = kv_ops.kv_cache_shape(kv_dtype, nblk, bs, cfg.n_head_kv, cfg.head_dim)
    k_cache, v_cache = (be.upload(kv_ops.encode_kv(kv_dtype, rng.standard_normal(
        (shape_kv[0], cfg.n_head_kv, cfg.head_dim)).astype(np.float32))) for _ in range(2))
    qkv_w = cfg.q_dim + 2 * cfg.kv_dim
    qkv = rand(be, rng, P, qkv_w, scale=0.5)
    positions, cu = be.upload(np.arange(P, dtype=np.int32)), be.upload(np.array([0, P], np.int32))
    tables = be.upload(np.arange(nblk, dtype=np.int32)[None, :])
    kv_bytes = int(np.prod(shape_kv)) * np.dtype(dt).itemsize
    nbytes = 2 * kv_bytes + 8 * P * cfg.q_dim
    out = be.empty((P, cfg.q_dim), np.float32)
    kvs = list(zip(copies(be, k_cache, nbytes // 2), copies(be, v_cache, nbytes // 2)))
    args = [(be, kv_dtype, qkv, qkv_w, kc, vc, tables, nblk, cu, positions, out, P, 1, cfg.n_head, cfg.n_head_kv,
             cfg.head_dim, bs, cfg.kq_scale) for kc, vc in kvs]
    flops = 4 * (P * (P + 1) // 2) * cfg.n_head * cfg.head_dim
    return attention_variants(ctx, "attention", f"prefill 1 x {P} tokens, KV {kv_dtype}", P, nbytes, args, sel,
                               P, flops, window=attn_ops.SPLIT_WINDOW)


def rope_attention_cases(ctx: BenchContext, N: int, context: int, kv_dtype: str, rng, sel: Selection) -> list[Case]:
    """rope + KV append (+ qk-norm), and attention: N sequences, each decoding at `context`."""
    if not {"rope_kv", "attention", "link"} & sel.ops:
        return []
    be, fp = ctx.backend, ctx.forward_pass()
    cfg, L = fp.cfg, fp.layers[0]
    cases: list[Case] = []
    bs = 16
    per_seq = -(-(context + 1) // bs)
    shape_kv, dt = kv_ops.kv_cache_shape(kv_dtype, N * per_seq + 1, bs, cfg.n_head_kv, cfg.head_dim)
    slots_total = shape_kv[0]
    k_cache, v_cache = (be.upload(kv_ops.encode_kv(kv_dtype, rng.standard_normal(
        (slots_total, cfg.n_head_kv, cfg.head_dim)).astype(np.float32))) for _ in range(2))
    qkv_w = cfg.q_dim + 2 * cfg.kv_dim
    qkv = rand(be, rng, N, qkv_w, scale=0.5)
    positions = be.upload(np.full(N, context, np.int32))
    slots = be.upload((np.arange(N) * per_seq * bs + context).astype(np.int32))
    tables = be.upload(np.arange(N * per_seq, dtype=np.int32).reshape(N, per_seq))
    cu = be.upload(np.arange(N + 1, dtype=np.int32))
    kv_elt = int(np.prod(shape_kv[1:])) * np.dtype(dt).itemsize  # bytes of one slot's K (or V)
    rope_bytes = 4 * N * qkv_w + 4 * N * (cfg.q_dim + cfg.kv_dim) + 2 * N * kv_elt

    rope_args = (be, kv_dtype, qkv, qkv_w, positions, slots, L.q_norm, L.k_norm, k_cache, v_cache, N, cfg.n_head,
                 cfg.n_head_kv, cfg.head_dim, L.rope_freqs, cfg.rms_eps, cfg.rope_style)
    if "rope_kv" in sel.ops:
        cases += [Case("rope_kv", f"{N} tokens", v.name, N, rope_bytes,
                        [lambda v=v: v.launch(*rope_args, mscale=L.rope_mscale, temp_scale=cfg.attn_temp_scale,
                                             temp_floor=cfg.n_ctx_orig)]) for v in sel.variants_of("rope_kv")]
    cases += link_cases(ctx, N, kv_dtype, rng, sel, qkv, positions, slots, k_cache, v_cache)
    if "attention" not in sel.ops:
        return cases
    out = be.empty((N, cfg.q_dim), np.float32)
    att_bytes = 2 * N * (context + 1) * kv_elt + 8 * N * cfg.q_dim
    kvs = list(zip(copies(be, k_cache, att_bytes // 2), copies(be, v_cache, att_bytes // 2)))
    args = [(be, kv_dtype, qkv, qkv_w, kc, vc, tables, per_seq, cu, positions, out, N, N, cfg.n_head,
             cfg.n_head_kv, cfg.head_dim, bs, cfg.kq_scale) for kc, vc in kvs]
    shape = f"{N} seqs x {context + 1} keys, KV {kv_dtype}"
    return cases + attention_variants(ctx, "attention", shape, N, att_bytes, args, sel, context + 1)


