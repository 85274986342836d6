"""Launcher for kernels_cu/matmul_mmq.cu and gate_up_mmq.cu: Y = X W^T (and the SwiGLU pair) on
int8 tensor cores in 64-row x 64-token blocks, bit-identical to matmul_dp4a / gate_up_dp4a (see
the kernel's header), for the quantized weight types; and for matmul_mmq_narrow.cu and
gate_up_mmq_narrow.cu, the same kernel in 16-row blocks (4x the blocks, for grids too small to fill
the GPU). Both split K: a block for each group of a row's members (the canonical order's two
levels), the group sums in a scratch the backend holds (MmqScratch; Workspace reserves a model's),
folded by each tile's last block. Its reference is therefore the dp4a kernel itself, bit for bit,
and through it ops/matmul_dp4a.py's NumPy reference."""

from __future__ import annotations

import math

from sharpinf.ops.matmul import kernel_suffix
from sharpinf.ops.matmul_dp4a import gate_up_dp4a, launch_q8_gate_up, launch_q8_rows, matmul_dp4a
from sharpinf.ops.matmul_mma import _check, supports
from sharpinf.ops.mmq_tiles import NARROW_ROWS, ROWS_PER_BLOCK, grid, split_launches, token_tiles

# Steps below this stay on dp4a (the same bits): the tensor set's threshold, the smallest step the
# kernels bench times mmq at. The registry's mmq and mmq_narrow min_tokens name it.
MIN_TOKENS = 16
# The fast set's matmul, "best": mmq where a step has BEST_MIN_TOKENS tokens or more and its grid
# holds a block an SM or more, dp4a elsewhere -- the rule that fits every point an H200 measured on
# the Qwen3-8B shape (bench/results/gpu/nvidia-h200-20261126): mmq lost at 16 and 32 tokens, and
# at 64 where its grid had 64-96 blocks for 132 SMs (o, down; qkv tied); it won at 64 with 192 blocks
# (gate+up) or 2,374 (the LM head), and everywhere at 512 (1.8-2.8x). Same bits either way.
# Those grids were before split-K (a block for each group of members: 4x the blocks from n_in =
# 1024); bench/gpu_slot.sh's kernels stage says what the rule becomes.
BEST_MIN_TOKENS = 64


def _mmq_rows(be, name: str, file: str, rows: int, W_dev, qtype: int, X, Y_dev, n_tokens: int, n_out: int, n_in: int,
              bias_dev, accumulate: bool, y_stride: int | None, y_col: int) -> None:
    _check(name, qtype, X, n_tokens, n_out, n_in)
    entry = f"{name}_{kernel_suffix(qtype)}"
    split_launches(be, rows, token_tiles(n_tokens), n_out, n_in, 1,
                    lambda grid, extra, share: launch_q8_rows(be, name, file, entry, grid, 128, W_dev, qtype, X, Y_dev,
                                                              n_tokens, n_out, n_in, bias_dev, accumulate, y_stride,
                                                              y_col, extra, share))


def _mmq_gate_up(be, name: str, file: str, rows: int, block: int, Wg_dev, Wu_dev, qtype: int, X, out_dev,
                 n_tokens: int, n_ff: int, n_in: int, act: str) -> None:
    _check(name, qtype, X, n_tokens, n_ff, n_in)
    entry = f"{name}_{kernel_suffix(qtype)}"
    split_launches(be, rows, token_tiles(n_tokens), n_ff, n_in, 2,
                    lambda grid, extra, share: launch_q8_gate_up(be, file, entry, grid, block, Wg_dev, Wu_dev, qtype, X,
                                                                 out_dev, n_tokens, n_ff, n_in, act, extra, share))


def matmul_mmq(be, W_dev, qtype: int, X, Y_dev, n_tokens: int, n_out: int, n_in: int, bias_dev=None,
               accumulate: bool = False, y_stride: int | None = None, y_col: int = 0, file: str = "matmul_mmq.cu") -> None:
    """As matmul_dp4a (same arguments, same bits), on tensor cores, 64 tokens a block."""
    _mmq_rows(be, "matmul_mmq", file, ROWS_PER_BLOCK, W_dev, qtype, X, Y_dev, n_tokens, n_out, n_in, bias_dev,
              accumulate, y_stride, y_col)


def gate_up_mmq(be, Wg_dev, Wu_dev, qtype: int, X, out_dev, n_tokens: int, n_ff: int, n_in: int,
                act: str = "silu") -> None:
    """As gate_up_dp4a (same arguments, same bits), on tensor cores, 64 tokens a block (8 warps)."""
    _mmq_gate_up(be, "gate_up_mmq", "gate_up_mmq.cu", ROWS_PER_BLOCK, 256, Wg_dev, Wu_dev, qtype, X, out_dev, n_tokens,
                 n_ff, n_in, act)


def matmul_mmq_narrow(be, W_dev, qtype: int, X, Y_dev, n_tokens: int, n_out: int, n_in: int, bias_dev=None,
                      accumulate: bool = False, y_stride: int | None = None, y_col: int = 0,
                      file: str = "matmul_mmq_narrow.cu") -> None:
    """As matmul_mmq (same arguments, same bits), in 16-row blocks."""
    _mmq_rows(be, "matmul_mmq_narrow", file, NARROW_ROWS, W_dev, qtype, X, Y_dev, n_tokens, n_out, n_in, bias_dev,
              accumulate, y_stride, y_col)


def gate_up_mmq_narrow(be, Wg_dev, Wu_dev, qtype: int, X, out_dev, n_tokens: int, n_ff: int, n_in: int,
                       act: str = "silu") -> None:
    """As gate_up_mmq (same arguments, same bits), in blocks of 16 rows of both matrices (4 warps)."""
    _mmq_gate_up(be, "gate_up_mmq_narrow", "gate_up_mmq_narrow.cu", NARROW_ROWS, 128, Wg_dev, Wu_dev, qtype, X,
                 out_dev, n_tokens, n_ff, n_in, act)


def _steps(tensor_kernel, be, W_dev, qtype: int, X, Y_dev, n_tokens: int, n_out: int, n_in: int, file: str,
           **kw) -> None:
    """A step of MIN_TOKENS or more with quantized weights on `tensor_kernel` (its `file`); a smaller
    step (or float weights) on dp4a -- the same bits either way."""
    if n_tokens >= MIN_TOKENS and supports(qtype):
        return tensor_kernel(be, W_dev, qtype, X, Y_dev, n_tokens, n_out, n_in, file=file, **kw)
    matmul_dp4a(be, W_dev, qtype, X, Y_dev, n_tokens, n_out, n_in, **kw)


def _gate_up_steps(tensor_kernel, be, Wg_dev, Wu_dev, qtype: int, X, out_dev, n_tokens: int, n_ff: int, n_in: int,
                   act: str) -> None:
    """tensor_kernel for steps of MIN_TOKENS or more, gate_up_dp4a below: the same bits."""
    fn = tensor_kernel if n_tokens >= MIN_TOKENS and supports(qtype) else gate_up_dp4a
    fn(be, Wg_dev, Wu_dev, qtype, X, out_dev, n_tokens, n_ff, n_in, act=act)


def matmul_mmq_steps(be, W_dev, qtype: int, X, Y_dev, n_tokens: int, n_out: int, n_in: int, bias_dev=None,
                     accumulate: bool = False, y_stride: int | None = None, y_col: int = 0,
                     file: str = "matmul_mmq.cu") -> None:
    """The mmq variant's linear layer: mmq from MIN_TOKENS tokens, dp4a below (_steps)."""
    _steps(matmul_mmq, be, W_dev, qtype, X, Y_dev, n_tokens, n_out, n_in, file, bias_dev=bias_dev,
           accumulate=accumulate, y_stride=y_stride, y_col=y_col)


def gate_up_mmq_steps(be, Wg_dev, Wu_dev, qtype: int, X, out_dev, n_tokens: int, n_ff: int, n_in: int,
                      act: str = "silu") -> None:
    _gate_up_steps(gate_up_mmq, be, Wg_dev, Wu_dev, qtype, X, out_dev, n_tokens, n_ff, n_in, act)


def matmul_mmq_narrow_steps(be, W_dev, qtype: int, X, Y_dev, n_tokens: int, n_out: int, n_in: int, bias_dev=None,
                            accumulate: bool = False, y_stride: int | None = None, y_col: int = 0,
                            file: str = "matmul_mmq_narrow.cu") -> None:
    """The mmq_narrow variant's linear layer: as matmul_mmq_steps, on the narrow blocks."""
    _steps(matmul_mmq_narrow, be, W_dev, qtype, X, Y_dev, n_tokens, n_out, n_in, file, bias_dev=bias_dev,
           accumulate=accumulate, y_stride=y_stride, y_col=y_col)


def gate_up_mmq_narrow_steps(be, Wg_dev, Wu_dev, qtype: int, X, out_dev, n_tokens: int, n_ff: int, n_in: int,
                             act: str = "silu") -> None:
    _gate_up_steps(gate_up_mmq_narrow, be, Wg_dev, Wu_dev, qtype, X, out_dev, n_tokens, n_ff, n_in, act)


def mmq_takes(be, qtype: int, n_tokens: int, n_out: int) -> bool:
    """The best variant's rule: mmq for this launch (see BEST_MIN_TOKENS), else dp4a. On the
    emulator (no SMs to fill) only the token count decides."""
    return (n_tokens >= BEST_MIN_TOKENS and supports(qtype)
            and math.prod(grid(n_out, n_tokens)) >= be.multiprocessors)


def matmul_best(be, W_dev, qtype: int, X, Y_dev, n_tokens: int, n_out: int, n_in: int, bias_dev=None,
                accumulate: bool = False, y_stride: int | None = None, y_col: int = 0,
                file: str = "matmul_mmq.cu") -> None:
    """The fast set's linear layer: mmq (`file`) where mmq_takes, else dp4a -- the same bits."""
    kw = dict(bias_dev=bias_dev, accumulate=accumulate, y_stride=y_stride, y_col=y_col)
    if mmq_takes(be, qtype, n_tokens, n_out):
        return matmul_mmq(be, W_dev, qtype, X, Y_dev, n_tokens, n_out, n_in, file=file, **kw)
    matmul_dp4a(be, W_dev, qtype, X, Y_dev, n_tokens, n_out, n_in, **kw)


def gate_up_best(be, Wg_dev, Wu_dev, qtype: int, X, out_dev, n_tokens: int, n_ff: int, n_in: int,
                 act: str = "silu") -> None:
    """gate_up_mmq where mmq_takes (n_ff rows a matrix), else gate_up_dp4a: the same bits."""
    fn = gate_up_mmq if mmq_takes(be, qtype, n_tokens, n_ff) else gate_up_dp4a
    fn(be, Wg_dev, Wu_dev, qtype, X, out_dev, n_tokens, n_ff, n_in, act=act)
