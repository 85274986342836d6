"""Launcher for kernels_cu/layer_dp4a.cu: a decode step's work between two attentions as one
cooperative launch -- the layer whose attention just ran (its o-projection into x, its FFN norm and
FFN) and the next layer up to its attention (its norm, QKV, QK-norm, RoPE and KV append). Either
half may run alone. Bit-identical to the dp4a path's separate launches (the kernel's header says why).

It declines -- returns False, launching nothing -- where it does not serve: steps of more than one
token tile (8), matrices of more than one type or of a float type, a head shape rope_kv.cu refuses.
Its pre half runs rope_kv.cu's arithmetic (rope_kv_token.cuh): its registry entry (link=layer)
requires rope_kv=fused.
The caller then runs the separate launches (step/kernels.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sharpinf.model import quants
from sharpinf.ops.launch import kernel, one_wave
from sharpinf.ops.matmul import check_n_in, kernel_suffix
from sharpinf.ops.matmul_dp4a import (ACTS, EMU_ROW_BLOCKS, MAX_ROW_BLOCKS, TILE_TOKENS, fused_entry_name, group_lanes,
                                     launch_shape)
from sharpinf.ops.quant_act import Q8Act
from sharpinf.ops.rope import STYLES

LINK_FILE = "layer_dp4a.cu"
KV_KINDS = {"f32": 0, "f16": 1, "bf16": 2, "q8_0": 3}  # the kernel's kv_kind
FLOAT_TYPES = (quants.F32, quants.F16, quants.BF16)
I32, F32 = np.int32, np.float32


@dataclass
class LinkPost:
    """The layer whose attention just ran: x += att Wo^T, then x += FFN(rmsnorm(x) * ffn_norm)."""

    qtypes: tuple[int, ...]  # of wo, gate, up, down
    wo: Any
    att: Q8Act  # the attention output in q8_1
    ffn_norm: Any
    w_gate: Any
    w_up: Any
    w_down: Any


@dataclass
class LinkPre:
    """The next layer up to its attention: qkv = rmsnorm(x) * attn_norm Wqkv^T (+ bqkv), then
    (q_norm, k_norm given) QK-norm, RoPE of Q and K, K and V into the cache."""

    qtype: int
    attn_norm: Any
    wqkv: Any
    bqkv: Any
    q_norm: Any
    k_norm: Any
    k_cache: Any
    v_cache: Any
    rope_freqs: Any  # the layer's RoPE table (float64 [head_dim/2], on the device)
    rope_mscale: float


@dataclass
class LinkStep:
    """What both halves share: the step's residual stream and scratch, its slots, its shapes."""

    x: Any  # float [n_tokens, n_embd]
    xq: Q8Act  # the FFN norm's output, [n_tokens, n_embd]
    pq: Q8Act  # the attention norm's (its own buffer: the kernel never rewrites what it has read), [n_tokens, n_embd]
    h: Any  # float [n_tokens, n_ff] (None: a model with no dense FFN, whose links are pre halves only)
    hq: Q8Act | None  # its q8_1
    qkv: Any  # float [n_tokens, q_dim + 2 kv_dim]
    positions: Any
    slots: Any
    bar: Any  # u32 [2], zeroed once
    kv_dtype: str
    n_tokens: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    eps: float
    rope_style: str
    act: str
    temp_scale: float = 0.0  # the queries' attention temperature (ops/rope.py; 0: none)
    temp_floor: int = 0


def link_scratch(be, cfg, cap) -> dict:
    """The registry's scratch of link=layer (besides the grid barrier): its attention norm's q8_1 output,
    a buffer of its own."""
    return {"linkq": Q8Act.empty(be, cap.tokens, cfg.n_embd)}


def _declines(post: LinkPost | None, pre: LinkPre | None, s: LinkStep) -> bool:
    types = set(post.qtypes if post else ()) | ({pre.qtype} if pre else set())
    rope_ok = (s.head_dim % 2 == 0 and s.head_dim <= 256 and (s.kv_dtype != "q8_0" or s.head_dim % 32 == 0)
               and s.rope_style in STYLES and (pre is None or (pre.q_norm is None) == (pre.k_norm is None)))
    return (s.n_tokens < 1 or s.n_tokens > TILE_TOKENS or len(types) != 1 or types <= set(FLOAT_TYPES)
            or types & set(quants.BASE_ONLY)
            or (pre is not None and (not rope_ok or s.kv_dtype not in KV_KINDS))
            or (post is not None and (s.h is None or s.hq is None)))


def _entry(qtype: int, has_post: bool, q_dim: int, s: LinkStep) -> str:
    """The kernel's entry: with the row loops' G compiled in (_g<GE>_<GF>, matmul_dp4a.FUSED_G) where the
    o-projection's rows of q_dim (when the post half runs) share n_embd's G."""
    if has_post and group_lanes(q_dim) != group_lanes(s.n_embd):
        return f"layer_dp4a_{kernel_suffix(qtype)}"
    return fused_entry_name("layer_dp4a", qtype, s.n_embd, s.n_ff)


def layer_dp4a(be, post: LinkPost | None, pre: LinkPre | None, s: LinkStep, file: str = LINK_FILE) -> bool:
    """One cooperative launch of layer_dp4a.cu for post, pre or both (see the module's docstring);
    False where it does not serve."""
    if post is None and pre is None:
        raise ValueError("layer_dp4a: neither half given")
    if _declines(post, pre, s):
        return False
    qtype = post.qtypes[0] if post else pre.qtype
    q_dim, kv_dim = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
    qkv_w = q_dim + 2 * kv_dim
    check_n_in(qtype, s.n_embd)
    products = []  # (n_out, n_in) of each phase's matvec: the grid covers the largest
    if post is not None:
        check_n_in(qtype, q_dim)
        check_n_in(qtype, s.n_ff)
        products += [(s.n_embd, q_dim), (s.n_ff, s.n_embd), (s.n_embd, s.n_ff)]
    if pre is not None:
        products.append((qkv_w, s.n_embd))
    k = kernel(be, file, _entry(qtype, post is not None, q_dim, s))
    cap = MAX_ROW_BLOCKS if be.gpu_shapes else EMU_ROW_BLOCKS
    rows_grid = max(launch_shape(s.n_tokens, n_out, n_in, cap)[0][0] for n_out, n_in in products)
    _, block = launch_shape(s.n_tokens, s.n_embd, s.n_embd, cap)
    grid = one_wave(be, k, rows_grid, block)
    o, p, any_ = post, pre, s.x  # a half not run: its pointers are never read
    args = (o.wo if o else any_, *(o.att.parts() if o else (any_, any_, any_)),
            o.ffn_norm if o else any_, o.w_gate if o else any_, o.w_up if o else any_, o.w_down if o else any_,
            p.attn_norm if p else any_, p.wqkv if p else any_,
            p.bqkv if p is not None and p.bqkv is not None else any_, s.qkv, s.positions, s.slots,
            p.q_norm if p is not None and p.q_norm is not None else any_,
            p.k_norm if p is not None and p.k_norm is not None else any_,
            p.k_cache if p else any_, p.v_cache if p else any_,
            s.x, *s.xq.parts(), *s.pq.parts(), any_ if s.h is None else s.h, *(s.xq if s.hq is None else s.hq).parts(), s.bar,
            I32(s.n_tokens), I32(s.n_embd), I32(s.n_ff), I32(s.n_head), I32(s.n_head_kv), I32(s.head_dim),
            p.rope_freqs if p else any_, F32(p.rope_mscale if p else 1.0), F32(s.temp_scale), I32(s.temp_floor),
            F32(s.eps), I32(s.rope_style == "neox"),
            I32(p is not None and p.q_norm is not None), I32(p is not None and p.bqkv is not None),
            I32(ACTS[s.act]), I32(KV_KINDS.get(s.kv_dtype, 0)), I32(post is not None), I32(pre is not None))
    wbytes = sum(quants.row_bytes(qtype, n_in) * n_out for n_out, n_in in products)
    act_bytes = 4 * s.n_tokens * (2 * s.n_embd + s.n_ff + qkv_w)
    be.launch(k, grid, block, args, io=(wbytes + act_bytes, act_bytes), cooperative=True)
    return True
