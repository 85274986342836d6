"""The mixture-of-experts FFN (qwen3moe, gpt-oss): the NumPy twins of its kernels.

    logits = h W_inp^T (+ b)               [T, n_expert], float32, one dot per (token, expert); gpt-oss's bias
    p      = softmax(logits)               over all experts (llama.cpp's build_moe_ffn: softmax, then top-k)
    ids    = the k largest p, best first   ties: the lower expert id wins (and ranks first)
    w      = p[ids] / max(sum p[ids], 2^-14)   the sum in rank order; llama.cpp clamps it at the
                                               smallest normal f16 (qwen3moe always renormalises)
             gating "topk_softmax" (gpt-oss): ids = the k largest logits, w = softmax over those k
    y_r    = glu(h Wg[ids_r]^T + bg, h Wu[ids_r]^T + bu) Wd[ids_r]^T + bd   each chosen expert's gated FFN
                                               (glu: act(g) * u, or gpt-oss's clamped SwiGLU; the biases gpt-oss's)
    x     += ((w_0 y_0 + w_1 y_1) + w_2 y_2) + ...                  in rank order, never arrival order

The rank-order sum is what makes the result one number per token whatever the batch: which
expert a token's slot r holds depends only on that token's router logits.

Launchers (a pair p = t * k + r is token t's r-th expert):
    route          moe_route.cu: router, softmax, top-k, weights (float or q8_1 input); with split=True
                   moe_route_split.cu's (the grouped variants'): the same ids and weights, the router's
                   experts spread over blocks and the selection done by a whole block
    moe_simple     the `simple` variant: route, moe_ffn.cu's gate_up and down over the pairs, combine
    moe_grouped    the `fast` variant: route (q8_1), moe_dp4a.cu's counting sort by expert, gate_up and
                   down over each expert's tiles of pairs (dp4a), quantize_q8_1 between, combine
    moe_tensor     the `mmq` variant (the tensor set's): as moe_grouped, with tiles of 64 pairs on int8
                   tensor cores (moe_mmq.cu) for steps of MMQ_MIN_TOKENS or more; the same bits
    moe_gemv       the `gemv` variant: as moe_grouped, for steps of up to GEMV_MAX_TOKENS tokens one tile an
                   expert on matmul_gemv's row stream (moe_gemv.cu: several weight chunks in flight a lane);
                   larger steps moe_grouped itself; the same bits
Every launch shape depends on the token count only (the tiles are bounded, not counted on the host),
so a plan or a CUDA graph recorded once serves every routing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sharpinf.model import quants
from sharpinf.model.config import MOE_MAX_EXPERTS
from sharpinf.ops.launch import kernel, one_wave
from sharpinf.ops.matmul import check_n_in, kernel_suffix
from sharpinf.ops.matmul_dp4a import ACTS, entry_name, group_lanes
from sharpinf.ops.matmul_gemv import MAX_TOKENS as GEMV_MAX_TOKENS, tile_for
from sharpinf.ops.matmul_gemv import supports as gemv_supports
from sharpinf.ops.matmul_mma import supports
from sharpinf.ops.matmul_mmq import MIN_TOKENS as MMQ_MIN_TOKENS
from sharpinf.ops.mmq_tiles import MMQ_TILE, TILE, max_tiles, split_launches, tiles_capacity
from sharpinf.ops.quant_act import Q8Act, quantize_q8_1

I32, F32 = np.int32, np.float32
# MMQ_MIN_TOKENS (matmul_mmq.MIN_TOKENS): smaller steps stay on dp4a tiles; GEMV_MAX_TOKENS
# (matmul_gemv.MAX_TOKENS, moe_gemv.cu's largest compiled token count): larger ones go to moe_grouped.
# The registry's moe=mmq min_tokens and moe=gemv max_tokens name these.
WARPS = 4
GATING = {"softmax": 0, "topk_softmax": 1}  # moe_router.cuh's MOE_GATING_SOFTMAX, MOE_GATING_TOPK_SOFTMAX
EMU_ROW_BLOCKS = 64  # the emulator pays per thread: fewer, longer-lived warps (as matmul_dp4a.py)
MAX_ROW_BLOCKS = 4096


@dataclass
class DeviceExperts:
    """One MoE layer's weights on the device: the router (float32) and the stacked experts as GGUF stores them;
    gpt-oss's biases (float32, None where the model has none) and its gating."""

    router: Any  # f32 [n_expert, n_embd]
    gate: Any  # raw [n_expert * n_ff_exp, row_bytes]: expert e's row j is row e * n_ff_exp + j
    up: Any
    down: Any  # raw [n_expert * n_embd, row_bytes(n_ff_exp)]
    gate_up_qtype: int  # gate and up share a type (the kernels read both with one decoder)
    down_qtype: int
    n_expert: int
    n_used: int
    n_ff: int  # one expert's inner size
    n_embd: int
    router_bias: Any = None  # f32 [n_expert]: added to the logits
    gate_up_bias: Any = None  # f32 [n_expert, n_ff, 2]: row j's gate bias, then its up bias (moe_args.cuh)
    down_bias: Any = None  # f32 [n_expert, n_embd]
    gating: str = "softmax"  # GATING's: how the router's k are chosen and weighted








@dataclass
class MoeScratch:
    """The routing and the pairs' activations of one step (Workspace.moe): [pairs = tokens * k, ...].
    The routing is kept per layer (a few MiB at most), so after a step every layer's choice of experts
    can be read back: the kernel-vs-reference oracle explains a near-tie routing flip with it."""

    ids: Any  # i32 [n_layer, P]
    wts: Any  # f32 [n_layer, P]
    g: Any  # f32 [P, n_ff]: act(gate) * up of each pair
    y: Any  # f32 [P, n_embd]: each pair's expert output
    gq: Q8Act | None = None  # q8_1 of g (grouped)
    order: Any = None  # i32 [P]: the pairs sorted by expert (grouped)
    tiles: Any = None  # i32 [3, max_tiles] (grouped)
    logits: Any = None  # f32 [tokens, n_expert]: the split router's logits (grouped)
    tickets: Any = None  # i32 [tokens]: its last-block tickets, zero between launches (grouped)

    @property
    def nbytes(self) -> int:
        """Device bytes held (Workspace.nbytes counts them)."""
        arrays = [self.ids, self.wts, self.g, self.y, self.order, self.tiles, self.logits, self.tickets]
        arrays += [self.gq.q, self.gq.d, self.gq.s] if self.gq is not None else []
        return sum(int(a.nbytes) for a in arrays if a is not None)

    @classmethod
    def alloc(cls, be, n_tokens: int, n_used: int, n_ff: int, n_embd: int, n_expert: int, grouped: bool,
              n_layer: int = 1) -> "MoeScratch":
        P = n_tokens * n_used
        s = cls(be.empty((n_layer, P), I32), be.empty((n_layer, P), F32), be.empty((P, n_ff), F32),
                be.empty((P, n_embd), F32))
        if grouped:
            s.gq, s.order = Q8Act.empty(be, P, n_ff), be.empty((P,), I32)
            s.tiles = be.empty((3, tiles_capacity(P, n_expert, n_used)), I32)
            s.logits, s.tickets = be.empty((n_tokens, n_expert), F32), be.zeros((n_tokens,), I32)
        return s


def route(be, E: DeviceExperts, s: MoeScratch, n_tokens: int, x_f=None, x_q: Q8Act | None = None,
          layer: int = 0, split: bool = False) -> None:
    """s.ids[layer], s.wts[layer] = the router's k experts and weights for each token, from float rows
    or their q8_1; split: by moe_route_split.cu (a grouped scratch holds its logits and tickets)."""
    if not 0 < E.n_used <= E.n_expert <= MOE_MAX_EXPERTS:  # moe_route.cu and moe_sort hold the experts in shared memory
        raise ValueError(f"moe route: k = {E.n_used} with {E.n_expert} experts (at most {MOE_MAX_EXPERTS})")
    br, has_bias = _bias(E.router_bias, E.router)
    tail = (s.ids[layer], s.wts[layer], I32(E.n_expert), I32(E.n_used), I32(E.n_embd), has_bias, I32(GATING[E.gating]))
    io = (4 * E.n_expert * E.n_embd + 4 * n_tokens * E.n_embd, 8 * n_tokens * E.n_used)
    x = (x_q.q, x_q.d) if x_q is not None else (x_f,)
    entry = "q8" if x_q is not None else "f32"
    if split:
        if s.logits is None:
            raise ValueError("moe route split: the scratch holds no logits (MoeScratch.alloc(grouped=True) makes them)")
        be.launch(kernel(be, "moe_route_split.cu", f"moe_route_split_{entry}"), (n_tokens, -(-E.n_expert // WARPS)),
                  32 * WARPS, x + (E.router, br, s.logits, s.tickets) + tail, io=io)
    else:
        be.launch(kernel(be, "moe_route.cu", f"moe_route_{entry}"), n_tokens, 128, x + (E.router, br) + tail, io=io)


def _bias(bias, stand_in) -> tuple:
    """A kernel's (bias pointer, has_bias): a model without the bias passes any array, never read (has_bias 0)."""
    return (stand_in, I32(0)) if bias is None else (bias, I32(1))


def combine(be, s: MoeScratch, x, n_tokens: int, k: int, n: int, layer: int = 0, down_bias=None) -> None:
    """x += each token's k pair outputs (+ each one's down_bias row, gpt-oss), weighted, in rank order
    (moe_ffn.cu's moe_combine)."""
    total = n_tokens * n
    be.launch(kernel(be, "moe_ffn.cu", "moe_combine"), max(1, min(-(-total // 256), 1024)), 256,
              (s.y, s.wts[layer], x, I32(n_tokens), I32(k), I32(n), s.ids[layer], *_bias(down_bias, s.y)),
              io=(4 * total * (k + 1) + 4 * n_tokens * k, 4 * total))


def moe_simple(be, E: DeviceExperts, x, s: MoeScratch, n_tokens: int, x_f=None, x_q: Q8Act | None = None,
               act: str = "silu", layer: int = 0, file: str = "moe_ffn.cu") -> None:
    """x += the MoE FFN of the normed rows x_f (float: the readable path), one warp per (pair, row)."""
    if x_f is None:
        raise ValueError("moe simple reads float activations (the simple matmuls' norm writes them)")
    route(be, E, s, n_tokens, x_f=x_f, layer=layer)
    P, gt, dt, ids = n_tokens * E.n_used, E.gate_up_qtype, E.down_qtype, s.ids[layer]
    check_n_in(gt, E.n_embd)
    check_n_in(dt, E.n_ff)
    be.launch(kernel(be, file, f"moe_gate_up_{kernel_suffix(gt)}"), (-(-E.n_ff // WARPS), P), 32 * WARPS,
              (E.gate, E.up, x_f, ids, s.g, I32(P), I32(E.n_used), I32(E.n_ff), I32(E.n_embd), I32(ACTS[act]),
               *_bias(E.gate_up_bias, s.g)),
              io=(2 * P * E.n_ff * quants.row_bytes(gt, E.n_embd), 4 * P * E.n_ff))
    be.launch(kernel(be, file, f"moe_down_{kernel_suffix(dt)}"), (-(-E.n_embd // WARPS), P), 32 * WARPS,
              (E.down, s.g, ids, s.y, I32(P), I32(E.n_embd), I32(E.n_ff)),
              io=(P * E.n_embd * quants.row_bytes(dt, E.n_ff), 4 * P * E.n_embd))
    combine(be, s, x, n_tokens, E.n_used, E.n_embd, layer, E.down_bias)


def _row_blocks(be, n_out: int, n_in: int) -> int:
    return min(-(-n_out // (WARPS * (32 // group_lanes(n_in)))), MAX_ROW_BLOCKS if be.gpu_shapes else EMU_ROW_BLOCKS)


def _grouped_ffn(be, E: DeviceExperts, x, s: MoeScratch, n_tokens: int, x_q: Q8Act | None, act: str, layer: int,
                 name: str, tile: int, gate_up, down, sort_file: str = "moe_dp4a.cu") -> None:
    """What every grouped variant runs: route (q8_1), the pairs counting-sorted by expert into tiles of
    up to `tile`, gate+up, quantize_q8_1, down, combine. gate_up(args, io, mt) and down(args, io, mt)
    launch the variant's two kernels on moe_args.cuh's arguments, gate+up's biases last (the down's join
    in the combine; io: the bytes a launch reads and writes, for the profile)."""
    if x_q is None or s.tiles is None:
        raise ValueError(f"{name} reads q8_1 activations and a grouped MoeScratch")
    route(be, E, s, n_tokens, x_q=x_q, layer=layer, split=True)
    P, gt, dt = n_tokens * E.n_used, E.gate_up_qtype, E.down_qtype
    check_n_in(gt, E.n_embd)
    check_n_in(dt, E.n_ff)
    mt = max_tiles(P, E.n_expert, tile)
    sort_pairs(be, s, P, E.n_expert, mt, tile, layer, sort_file)
    used = min(E.n_expert, P)  # the experts a step can choose
    gate_up((E.gate, E.up, x_q.q, x_q.d, x_q.s, s.order, s.tiles, s.g, I32(E.n_used), I32(E.n_ff), I32(E.n_embd),
             I32(mt), I32(ACTS[act]), *_bias(E.gate_up_bias, s.g)),
            (2 * used * E.n_ff * quants.row_bytes(gt, E.n_embd), 4 * P * E.n_ff), mt)
    quantize_q8_1(be, s.g, s.gq, P, E.n_ff)
    down((E.down, s.gq.q, s.gq.d, s.gq.s, s.order, s.tiles, s.y, I32(E.n_embd), I32(E.n_ff), I32(mt)),
         (used * E.n_embd * quants.row_bytes(dt, E.n_ff), 4 * P * E.n_embd), mt)
    combine(be, s, x, n_tokens, E.n_used, E.n_embd, layer, E.down_bias)


def moe_grouped(be, E: DeviceExperts, x, s: MoeScratch, n_tokens: int, x_f=None, x_q: Q8Act | None = None,
                act: str = "silu", layer: int = 0, file: str = "moe_dp4a.cu") -> None:
    """x += the MoE FFN of the normed rows in q8_1 (x_q), each expert's weights read once per tile of
    up to 8 of the pairs that chose it."""
    def launch(prefix: str, n_out: int, n_in: int, qtype: int):
        return lambda args, io, mt: be.launch(kernel(be, file, entry_name(prefix, qtype, n_in)),
                                              (_row_blocks(be, n_out, n_in), mt), 32 * WARPS, args, io=io)

    _grouped_ffn(be, E, x, s, n_tokens, x_q, act, layer, "moe_grouped", TILE,
                 launch("moe_gate_up_dp4a", E.n_ff, E.n_embd, E.gate_up_qtype),
                 launch("moe_down_dp4a", E.n_embd, E.n_ff, E.down_qtype), sort_file=file)


def moe_gemv(be, E: DeviceExperts, x, s: MoeScratch, n_tokens: int, x_f=None, x_q: Q8Act | None = None,
             act: str = "silu", layer: int = 0, file: str = "moe_gemv.cu") -> None:
    """x += the MoE FFN of the normed rows in q8_1 (x_q): as moe_grouped, for a step of up to
    GEMV_MAX_TOKENS tokens with one tile an expert (NT >= the step's tokens: a token's k experts are k
    different ones, so max_tiles(P, n_expert, NT) <= tiles_capacity) on matmul_gemv's row stream
    (`file`), larger steps (and the types gemv does not compile) moe_grouped itself. The same bits."""
    if n_tokens > GEMV_MAX_TOKENS or not (gemv_supports(E.gate_up_qtype) and gemv_supports(E.down_qtype)):
        return moe_grouped(be, E, x, s, n_tokens, x_f=x_f, x_q=x_q, act=act, layer=layer)
    nt, used = tile_for(n_tokens), min(E.n_expert, n_tokens * E.n_used)

    def launch(prefix: str, n_out: int, n_in: int, qtype: int):
        # the row blocks of one wave of the device, spread over the tiles a step can fill (an expert
        # each): each warp streams several rows (gemv_rows.cuh); the tiles past the last exit at once
        def run(args, io, mt):
            k = kernel(be, file, entry_name(prefix, qtype, n_in, f"_t{nt}"))
            rows = -(-n_out // (WARPS * (32 // group_lanes(n_in))))
            blocks = min(rows, max(1, -(-one_wave(be, k, rows * used, 32 * WARPS) // used)))
            be.launch(k, (blocks, mt), 32 * WARPS, args, io=io)
        return run

    _grouped_ffn(be, E, x, s, n_tokens, x_q, act, layer, "moe_gemv", nt,
                 launch("moe_gate_up_gemv", E.n_ff, E.n_embd, E.gate_up_qtype),
                 launch("moe_down_gemv", E.n_embd, E.n_ff, E.down_qtype))


def sort_pairs(be, s: MoeScratch, P: int, n_expert: int, mt: int, tile: int, layer: int = 0,
               file: str = "moe_dp4a.cu") -> None:
    """s.order, s.tiles: the pairs counting-sorted by expert, cut into tiles of up to `tile` (moe_sort)."""
    be.launch(kernel(be, file, "moe_sort"), 1, 256,
              (s.ids[layer], s.order, s.tiles, I32(P), I32(n_expert), I32(mt), I32(tile)), io=(4 * P, 4 * P + 12 * mt))


def moe_tensor(be, E: DeviceExperts, x, s: MoeScratch, n_tokens: int, x_f=None, x_q: Q8Act | None = None,
               act: str = "silu", layer: int = 0, file: str = "moe_mmq.cu") -> None:
    """x += the MoE FFN of the normed rows in q8_1 (x_q): as moe_grouped, with each expert's pairs in
    tiles of up to 64 on int8 tensor cores (`file`) -- weights read once per 64 pairs -- for steps of
    MMQ_MIN_TOKENS tokens or more with quantized experts; otherwise moe_grouped itself. The same bits."""
    gt, dt = E.gate_up_qtype, E.down_qtype
    if n_tokens < MMQ_MIN_TOKENS or not (supports(gt) and supports(dt)):
        return moe_grouped(be, E, x, s, n_tokens, x_f=x_f, x_q=x_q, act=act, layer=layer)

    # split-K as the dense mmq: grid (row tiles of a window, the pair tiles, the groups), the scratch
    # and the window's first row tile after the entries' own arguments (mmq_tiles.split_launches), each
    # window a share of the launch's bytes
    def launch(entry: str, n_out: int, n_in: int, nmat: int, threads: int):
        def run(args, io, mt):
            k = kernel(be, file, entry)
            split_launches(be, MMQ_TILE, mt, n_out, n_in, nmat, lambda grid, extra, share: be.launch(
                k, grid, threads, args + tuple(extra), io=(round(share * io[0]), round(share * io[1]))))
        return run

    _grouped_ffn(be, E, x, s, n_tokens, x_q, act, layer, "moe_tensor", MMQ_TILE,
                 launch(f"moe_gate_up_mmq_{kernel_suffix(gt)}", E.n_ff, E.n_embd, 2, 256),
                 launch(f"moe_down_mmq_{kernel_suffix(dt)}", E.n_embd, E.n_ff, 1, 128))


# -- NumPy twins ---------------------------------------------------------------------------------
WEIGHT_SUM_FLOOR = F32(6.103515625e-5)  # llama.cpp: ggml_clamp(weights_sum, 6.103515625e-5, INFINITY)


def router_logits_reference(h: np.ndarray, w_inp: np.ndarray) -> np.ndarray:
    """[T, n_expert] float32: each logit its own dot (not BLAS), so two equal router rows give
    bit-equal logits and a tie stays a tie, as in the kernel."""
    h, w_inp = np.asarray(h, F32), np.asarray(w_inp, F32)
    return np.stack([(h * w_inp[e]).sum(axis=-1, dtype=F32) for e in range(w_inp.shape[0])], axis=-1)


def route_reference(logits: np.ndarray, k: int, renormalise: bool = True, gating: str = "softmax"
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(ids int32 [T, k] best first, weights float32 [T, k]) from router logits [T, n_expert]. gating
    "softmax": a softmax over every expert, the top k, their weights renormalised; "topk_softmax" (gpt-oss):
    the top k by logit, a softmax over those k (its sum in rank order)."""
    logits = np.asarray(logits, F32)
    if gating == "topk_softmax":
        ids = np.argsort(-logits, axis=-1, kind="stable")[:, :k].astype(np.int32)  # a tie: the lower id first
        top = np.take_along_axis(logits, ids, axis=-1)
        e = np.exp(top - top[:, :1])
        total = e[:, 0].copy()
        for r in range(1, k):
            total = total + e[:, r]
        return ids, (e / total[:, None]).astype(F32)
    if gating != "softmax":
        raise ValueError(f"unknown gating {gating!r}")
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p = (p / p.sum(axis=-1, keepdims=True, dtype=F32)).astype(F32)
    # a stable sort of -p keeps equal probabilities in id order: the lower id wins a tie
    ids = np.argsort(-p, axis=-1, kind="stable")[:, :k].astype(np.int32)
    w = np.take_along_axis(p, ids, axis=-1)
    if renormalise:
        total = w[:, 0].copy()
        for r in range(1, k):  # rank order, as the kernel adds them
            total = total + w[:, r]
        w = (w / np.maximum(total, WEIGHT_SUM_FLOOR)[:, None]).astype(F32)
    return ids, w


def combine_reference(y: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """sum_r weights[:, r] * y[:, r] in rank order: y [T, k, d], weights [T, k] -> [T, d] float32."""
    out = (y[:, 0] * weights[:, :1]).astype(F32)
    for r in range(1, y.shape[1]):
        out = (out + y[:, r] * weights[:, r : r + 1]).astype(F32)
    return out
