"""Launcher for kernels_cu/matmul_mma.cu and gate_up_mma.cu: Y = X W^T (and the SwiGLU pair) on
int8 tensor cores, bit-identical to matmul_dp4a / gate_up_dp4a (see the kernel's header), for the
quantized weight types. Its reference is therefore the dp4a kernel itself, bit for bit, and
through it ops/matmul_dp4a.py's NumPy reference."""

from __future__ import annotations

from sharpinf.model import quants
from sharpinf.ops.matmul import check_n_in, kernel_suffix
from sharpinf.ops.matmul_dp4a import PACKED_TYPES, gate_up_dp4a, launch_q8_gate_up, launch_q8_rows, matmul_dp4a
from sharpinf.ops.quant_act import Q8Act

MMA_TYPES = PACKED_TYPES | {quants.Q8_0}  # the eight quantized types
ROWS_PER_BLOCK = 64  # MM_WARPS x 16
TOKENS_PER_BLOCK = 16  # MM_TOKENS
MIN_TOKENS = 16  # a step smaller than one token tile stays on dp4a (same bits, less waste)


def supports(qtype: int) -> bool:
    return int(qtype) in MMA_TYPES


def _check(name: str, qtype: int, X: Q8Act, n_tokens: int, n_out: int, n_in: int) -> None:
    if not supports(qtype):
        raise ValueError(f"{name}: no int8 form for {quants.qtype_name(qtype)} weights (use the dp4a kernel)")
    if n_tokens < 1 or n_out < 1:
        raise ValueError(f"{name}: n_tokens and n_out must be >= 1, got {n_tokens}, {n_out}")
    check_n_in(qtype, n_in)
    if X.n != n_in:
        raise ValueError(f"{name}: activations of {X.n} values for rows of {n_in}")


def _grid(n_out: int, n_tokens: int) -> tuple[int, int]:
    return -(-n_out // ROWS_PER_BLOCK), -(-n_tokens // TOKENS_PER_BLOCK)


def matmul_mma(be, W_dev, qtype: int, X: Q8Act, Y_dev, n_tokens: int, n_out: int, n_in: int, bias_dev=None,
               accumulate: bool = False, y_stride: int | None = None, y_col: int = 0, file: str = "matmul_mma.cu") -> None:
    """As matmul_dp4a (same arguments, same bits), on tensor cores."""
    launch_rows(be, "matmul_mma", file, _grid(n_out, n_tokens), W_dev, qtype, X, Y_dev, n_tokens, n_out, n_in,
                bias_dev, accumulate, y_stride, y_col)


def launch_rows(be, name: str, file: str, grid, W_dev, qtype: int, X: Q8Act, Y_dev, n_tokens: int, n_out: int,
                n_in: int, bias_dev, accumulate: bool, y_stride: int | None, y_col: int) -> None:
    """One launch of a tensor-core matmul entry `<name>_<type>` (mma, mmq: 128 threads)."""
    _check(name, qtype, X, n_tokens, n_out, n_in)
    launch_q8_rows(be, name, file, f"{name}_{kernel_suffix(qtype)}", grid, 128, W_dev, qtype, X, Y_dev, n_tokens,
                   n_out, n_in, bias_dev, accumulate, y_stride, y_col)


def gate_up_mma(be, Wg_dev, Wu_dev, qtype: int, X: Q8Act, out_dev, n_tokens: int, n_ff: int, n_in: int,
                act: str = "silu") -> None:
    """As gate_up_dp4a (same arguments, same bits), on tensor cores."""
    _check("gate_up_mma", qtype, X, n_tokens, n_ff, n_in)
    launch_q8_gate_up(be, "gate_up_mma.cu", f"gate_up_mma_{kernel_suffix(qtype)}", _grid(n_ff, n_tokens), 128, Wg_dev, Wu_dev,
                      qtype, X, out_dev, n_tokens, n_ff, n_in, act)


def matmul_mma_steps(be, W_dev, qtype: int, X: Q8Act, Y_dev, n_tokens: int, n_out: int, n_in: int, bias_dev=None,
                     accumulate: bool = False, y_stride: int | None = None, y_col: int = 0,
                     file: str = "matmul_mma.cu") -> None:
    """The mma variant's linear layer: a step of a whole token tile or more, with quantized weights, on
    tensor cores (`file`); a smaller step (or float weights) on dp4a -- the same bits either way."""
    kw = dict(bias_dev=bias_dev, accumulate=accumulate, y_stride=y_stride, y_col=y_col)
    if n_tokens >= MIN_TOKENS and supports(qtype):
        return matmul_mma(be, W_dev, qtype, X, Y_dev, n_tokens, n_out, n_in, file=file, **kw)
    matmul_dp4a(be, W_dev, qtype, X, Y_dev, n_tokens, n_out, n_in, **kw)


def gate_up_mma_steps(be, Wg_dev, Wu_dev, qtype: int, X: Q8Act, out_dev, n_tokens: int, n_ff: int, n_in: int,
                      act: str = "silu") -> None:
    """gate_up_mma for steps of a whole token tile or more, gate_up_dp4a below: the same bits."""
    fn = gate_up_mma if n_tokens >= MIN_TOKENS and supports(qtype) else gate_up_dp4a
    fn(be, Wg_dev, Wu_dev, qtype, X, out_dev, n_tokens, n_ff, n_in, act=act)
