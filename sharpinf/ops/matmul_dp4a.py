"""Launcher for kernels_cu/matmul_dp4a.cu (Y = X W^T with X in q8_1, integer dot products) and
its NumPy reference. W is the raw GGUF rows, as for matmul.py; X a Q8Act (ops/quant_act.py).
Launch choices depend on the shapes only and change no result (see the kernel's header)."""

from __future__ import annotations

import numpy as np

from sharpinf.model import quants
from sharpinf.ops.launch import kernel, one_wave
from sharpinf.ops.matmul import check_n_in, kernel_suffix
from sharpinf.ops.quant_act import Q8Act, dequantize_q8_1

KERNEL_FILE = "matmul_dp4a.cu"
TILE_TOKENS = 8  # DP_TILE
WARPS = 4  # DP_WARPS
MAX_ROW_BLOCKS = 4096
EMU_ROW_BLOCKS = 64


def group_lanes(n_in: int) -> int:
    """Lanes that share one output row: min(32, the largest power of two <= n_in / 32)."""
    g, chunks = 1, n_in // 32
    while g < 32 and 2 * g <= chunks:
        g *= 2
    return g


# The packed types (ggml_blocks.cuh's GB_PACKED_ENTRIES): every quantized type but Q8_0, whose values
# are whole bytes.
PACKED_TYPES = frozenset({quants.Q4_0, quants.Q4_1, quants.Q5_0, quants.Q5_1, quants.Q4_K, quants.Q5_K, quants.Q6_K})
# The matvec entries with G a compile-time constant (dp4a.cuh's DP_ASSUME_G: _g16 for n_in 512..1023,
# _g32 from 1024) exist for every quantized type: Q8_0's too since its row's end folds on the lanes there
# (dp_combine's LANES: matmul_dp4a_q8_0 718 -> 400 instructions an iteration, gemv's q8_0_t1 886 -> 653; it
# had been 5% for 64-80 registers); float weights have no chunk decode to fold.
FIXED_G_TYPES = PACKED_TYPES | {quants.Q8_0}
FIXED_G = (16, 32)


def entry_name(prefix: str, qtype: int, n_in: int, tile: str = "") -> str:
    """The matvec entry for these rows: prefix_<type><tile>, then _g<G> where G is a compile-time constant."""
    g = group_lanes(n_in)
    fixed = f"_g{g}" if g in FIXED_G and qtype in FIXED_G_TYPES else ""
    return f"{prefix}_{kernel_suffix(qtype)}{tile}{fixed}"


# The fused kernels' entries with both row loops' G compiled in (ffn_dp4a.cu's and layer_dp4a.cu's
# _g<GE>_<GF>: G of rows of n_embd, of n_ff): SmolLM2's (576, 1536) and every model from n_embd 1024 on.
# The other pairs would need n_ff < 1024 beside n_embd >= 512 -- no model has them, and each pair is
# eight more entries to compile.
FUSED_G = ((16, 32), (32, 32))


def fused_entry_name(prefix: str, qtype: int, n_embd: int, n_ff: int) -> str:
    """The fused kernel's entry: prefix_<type>, then _g<GE>_<GF> where the pair has entries."""
    gs = (group_lanes(n_embd), group_lanes(n_ff))
    fixed = f"_g{gs[0]}_{gs[1]}" if gs in FUSED_G and qtype in FIXED_G_TYPES else ""
    return f"{prefix}_{kernel_suffix(qtype)}{fixed}"


GROUP = 8  # DP_GROUP: members a group of the canonical order's two levels (dp4a.cuh)


def member_groups(n_in: int) -> int:
    """The groups of a row's members: G / min(G, 8) -- 1 below n_in = 512, 2 or 4 above."""
    g = group_lanes(n_in)
    return g // min(g, GROUP)


def launch_shape(n_tokens: int, n_out: int, n_in: int, max_row_blocks: int) -> tuple[tuple[int, int], int]:
    rows_per_block = WARPS * (32 // group_lanes(n_in))
    return (min(-(-n_out // rows_per_block), max_row_blocks), -(-n_tokens // TILE_TOKENS)), 32 * WARPS


def launch_q8_rows(be, name: str, file: str, entry: str, grid, block: int, W_dev, qtype: int, X: Q8Act, Y_dev,
                   n_tokens: int, n_out: int, n_in: int, bias_dev, accumulate: bool, y_stride: int | None,
                   y_col: int, extra: tuple = (), io_share: float = 1.0, k=None) -> None:
    """One launch of a q8_1 matmul entry (dp4a, gemv, mma, mmq: one argument list, mmq's followed by
    `extra`, its split-K scratch): Y[n_tokens, n_out] (=, or += with accumulate) X W^T (+ bias);
    with y_stride, Y_dev is a wider [n_tokens, y_stride] buffer filled at columns y_col .. y_col +
    n_out. io_share: the part of the whole product's traffic this launch moves (a window of rows).
    k: the entry's kernel where the caller already holds it (to size its grid)."""
    if X.n != n_in:
        raise ValueError(f"{name}: activations of {X.n} values for rows of {n_in}")
    stride = n_out if y_stride is None else y_stride
    if y_col < 0 or y_col + n_out > stride:
        raise ValueError(f"{name}: columns {y_col}..{y_col + n_out} do not fit rows of {stride}")
    has_bias = bias_dev is not None
    y = Y_dev.reshape(-1)[y_col:] if y_col else Y_dev
    io = (n_out * quants.row_bytes(qtype, n_in) + n_tokens * n_in * 9 // 8 + 4 * n_out * has_bias
          + 4 * n_tokens * n_out * accumulate, 4 * n_tokens * n_out)
    be.launch(k or kernel(be, file, entry), grid, block,
              (W_dev, X.q, X.d, X.s, bias_dev if has_bias else X.d, y, np.int32(n_tokens), np.int32(n_out),
               np.int32(n_in), np.int32(has_bias), np.int32(accumulate), np.int32(stride), *extra),
              io=tuple(round(b * io_share) for b in io))


def matmul_dp4a(be, W_dev, qtype: int, X: Q8Act, Y_dev, n_tokens: int, n_out: int, n_in: int, bias_dev=None,
                accumulate: bool = False, y_stride: int | None = None, y_col: int = 0, file: str = KERNEL_FILE) -> None:
    """Y[n_tokens, n_out] (=, or += with accumulate) X W^T (+ bias). With y_stride, Y_dev is a wider
    [n_tokens, y_stride] buffer filled at columns y_col .. y_col + n_out."""
    if n_tokens < 1 or n_out < 1:
        raise ValueError(f"matmul_dp4a: n_tokens and n_out must be >= 1, got {n_tokens}, {n_out}")
    check_n_in(qtype, n_in)
    grid, block = launch_shape(n_tokens, n_out, n_in, MAX_ROW_BLOCKS if be.gpu_shapes else EMU_ROW_BLOCKS)
    launch_q8_rows(be, "matmul_dp4a", file, entry_name("matmul_dp4a", qtype, n_in), grid, block, W_dev, qtype, X,
                   Y_dev, n_tokens, n_out, n_in, bias_dev, accumulate, y_stride, y_col)


ACTS = {"silu": 0, "gelu_tanh": 1, "swiglu_oai": 2}  # gated_act.cuh's ACT_SILU, ACT_GELU_TANH, ACT_SWIGLU_OAI
DENSE_ACTS = ("silu", "gelu_tanh")  # a dense FFN's (mmq_rows.cuh's GQ_PASS: the clamped SwiGLU is experts' only)


def launch_q8_gate_up(be, file: str, entry: str, grid, block: int, Wg_dev, Wu_dev, qtype: int, X: Q8Act, out_dev,
                      n_tokens: int, n_ff: int, n_in: int, act: str, extra: tuple = (), io_share: float = 1.0,
                      k=None) -> None:
    """One launch of a fused gate+up entry (dp4a, gemv, mma, mmq: one argument list; extra, io_share
    and k as launch_q8_rows')."""
    if act not in DENSE_ACTS:
        raise ValueError(f"a dense gate+up runs {' or '.join(DENSE_ACTS)}, not {act!r} (gpt-oss's is its experts')")
    io = (2 * n_ff * quants.row_bytes(qtype, n_in) + n_tokens * n_in * 9 // 8, 4 * n_tokens * n_ff)
    be.launch(k or kernel(be, file, entry), grid, block,
              (Wg_dev, Wu_dev, X.q, X.d, X.s, out_dev, np.int32(n_tokens), np.int32(n_ff), np.int32(n_in),
               np.int32(ACTS[act]), *extra),
              io=tuple(round(b * io_share) for b in io))


def gate_up_dp4a(be, Wg_dev, Wu_dev, qtype: int, X: Q8Act, out_dev, n_tokens: int, n_ff: int, n_in: int,
                 act: str = "silu") -> None:
    """out[n_tokens, n_ff] = act(X Wg^T) * (X Wu^T), one launch (kernels_cu/gate_up_dp4a.cu);
    act "silu" (SwiGLU) or "gelu_tanh" (GeGLU)."""
    if n_tokens < 1 or n_ff < 1:
        raise ValueError(f"gate_up_dp4a: n_tokens and n_ff must be >= 1, got {n_tokens}, {n_ff}")
    check_n_in(qtype, n_in)
    grid, block = launch_shape(n_tokens, n_ff, n_in, MAX_ROW_BLOCKS if be.gpu_shapes else EMU_ROW_BLOCKS)
    launch_q8_gate_up(be, "gate_up_dp4a.cu", entry_name("gate_up_dp4a", qtype, n_in), grid, block, Wg_dev, Wu_dev,
                      qtype, X, out_dev, n_tokens, n_ff, n_in, act)


FFN_FILE = "ffn_dp4a.cu"


def ffn_dp4a(be, Wg_dev, Wu_dev, Wd_dev, qtypes: tuple[int, int, int], X: Q8Act, h_dev, hq: Q8Act, x_dev,
             n_tokens: int, n_ff: int, n_embd: int, act: str, bar_dev, file: str = FFN_FILE) -> bool:
    """x[n_tokens, n_embd] += (act(X Wg^T) * (X Wu^T)) Wd^T (through q8_1, as the dp4a path) in one
    cooperative launch of kernels_cu/ffn_dp4a.cu, bit-identical to gate_up_dp4a + quantize_q8_1 +
    matmul_dp4a; h_dev float [n_tokens, n_ff] and hq its q8_1 are scratch, bar_dev u32 [2] zeroed
    once. Returns False, launching nothing, where it does not serve: more than one token tile
    (8 tokens), the three matrices not of one quantized type, or a type it does not compile
    (quants.BASE_ONLY): the caller runs the three launches."""
    qtype = qtypes[0]
    if (n_tokens > TILE_TOKENS or len(set(qtypes)) != 1
            or qtype in (quants.F32, quants.F16, quants.BF16, *quants.BASE_ONLY)):
        return False
    check_n_in(qtype, n_embd)
    check_n_in(qtype, n_ff)
    k = kernel(be, file, fused_entry_name("ffn_dp4a", qtype, n_embd, n_ff))
    (rows_grid, _), block = launch_shape(n_tokens, n_ff, n_embd, MAX_ROW_BLOCKS if be.gpu_shapes else EMU_ROW_BLOCKS)
    grid = one_wave(be, k, rows_grid, block)
    rb = quants.row_bytes(qtype, n_embd) * 2 * n_ff + quants.row_bytes(qtype, n_ff) * n_embd
    be.launch(k, grid, block,
              (Wg_dev, Wu_dev, Wd_dev, X.q, X.d, X.s, h_dev, hq.q, hq.d, hq.s, x_dev, bar_dev, np.int32(n_tokens),
               np.int32(n_ff), np.int32(n_embd), np.int32(ACTS[act])),
              io=(rb + n_tokens * n_embd * (9 // 8 + 4), 4 * n_tokens * n_embd), cooperative=True)
    return True


def grid_barrier(be, cfg, cap) -> dict:
    """The registry's scratch of the cooperative kernels (ffn=fused, link=layer): their grid barrier,
    zeroed once and left at 0 by every launch."""
    return {"grid_bar": be.zeros((2,), np.uint32)}


# -- NumPy reference -----------------------------------------------------------------------------
def matmul_dp4a_reference(W_raw: np.ndarray, qtype: int, q: np.ndarray, d: np.ndarray,
                          bias: np.ndarray | None = None, residual: np.ndarray | None = None) -> np.ndarray:
    """dequantize(X) @ dequantize(W)^T (+ bias) (+ residual) in float64, as float32."""
    X = dequantize_q8_1(q, d)
    n_in = X.shape[1]
    raw = np.asarray(W_raw).view(np.uint8).reshape(-1)
    n_out = raw.size // quants.row_bytes(qtype, n_in)
    Y = X @ quants.dequantize(raw, qtype, (n_out, n_in)).astype(np.float64).T
    if bias is not None:
        Y = Y + np.asarray(bias, np.float64)
    if residual is not None:
        Y = np.asarray(residual, np.float64) + Y
    return Y.astype(np.float32)
