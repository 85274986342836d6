"""Launcher for kernels_cu/matmul_gemv.cu and gate_up_gemv.cu: the decode matvecs, dp4a's
arithmetic and order with the token count a template parameter (1, 2, 4, 8) and several weight
chunks in flight per lane (see the kernel's header). A step of more than MAX_TOKENS tokens goes
to dp4a: the same bits either way, so the reference is dp4a itself and, through it,
ops/matmul_dp4a.py's NumPy reference."""

from __future__ import annotations

from sharpinf.model import quants
from sharpinf.ops.matmul import check_n_in
from sharpinf.ops.launch import kernel, one_wave
from sharpinf.ops.matmul_dp4a import entry_name, gate_up_dp4a, group_lanes, launch_q8_gate_up, launch_q8_rows, matmul_dp4a
from sharpinf.ops.quant_act import Q8Act

TILES = (1, 2, 4, 8)  # the token counts compiled (matmul_gemv_<type>_t<NT>)
MAX_TOKENS = TILES[-1]  # larger steps run on dp4a
WARPS = 4  # GV_WARPS


def supports(qtype: int) -> bool:
    """The types gemv compiles (GB_ENTRIES): all but the baselines' own (quants.BASE_ONLY), which go to dp4a."""
    return int(qtype) not in quants.BASE_ONLY


def tile_for(n_tokens: int) -> int:
    """The smallest compiled token count that holds the step."""
    return next(t for t in TILES if t >= n_tokens)


def _kernel_and_grid(be, file: str, entry: str, n_out: int, n_in: int):
    """(kernel, grid): the row blocks, at most as many as the device holds at once -- a warp then
    walks several rows as one stream, the next row's first loads in flight while it finishes a row
    (gemv_rows.cuh)."""
    blocks = -(-n_out // (WARPS * (32 // group_lanes(n_in))))
    k = kernel(be, file, entry)
    return k, one_wave(be, k, blocks, 32 * WARPS)


def _check(name: str, qtype: int, X: Q8Act, n_tokens: int, n_out: int, n_in: int) -> None:
    if not 1 <= n_tokens <= MAX_TOKENS or n_out < 1:
        raise ValueError(f"{name}: 1..{MAX_TOKENS} tokens and n_out >= 1, got {n_tokens}, {n_out}")
    check_n_in(qtype, n_in)
    if X.n != n_in:
        raise ValueError(f"{name}: activations of {X.n} values for rows of {n_in}")


def matmul_gemv(be, W_dev, qtype: int, X: Q8Act, Y_dev, n_tokens: int, n_out: int, n_in: int, bias_dev=None,
                accumulate: bool = False, y_stride: int | None = None, y_col: int = 0,
                file: str = "matmul_gemv.cu") -> None:
    """As matmul_dp4a (same arguments, same bits) for a step of 1..8 tokens."""
    _check("matmul_gemv", qtype, X, n_tokens, n_out, n_in)
    entry = entry_name("matmul_gemv", qtype, n_in, f"_t{tile_for(n_tokens)}")
    k, grid = _kernel_and_grid(be, file, entry, n_out, n_in)
    launch_q8_rows(be, "matmul_gemv", file, entry, (grid, 1), 32 * WARPS, W_dev, qtype, X, Y_dev, n_tokens, n_out, n_in,
                   bias_dev, accumulate, y_stride, y_col, k=k)


def gate_up_gemv(be, Wg_dev, Wu_dev, qtype: int, X: Q8Act, out_dev, n_tokens: int, n_ff: int, n_in: int,
                 act: str = "silu", file: str = "gate_up_gemv.cu") -> None:
    """As gate_up_dp4a (same arguments, same bits) for a step of 1..8 tokens."""
    _check("gate_up_gemv", qtype, X, n_tokens, n_ff, n_in)
    entry = entry_name("gate_up_gemv", qtype, n_in, f"_t{tile_for(n_tokens)}")
    k, grid = _kernel_and_grid(be, file, entry, n_ff, n_in)
    launch_q8_gate_up(be, file, entry, (grid, 1), 32 * WARPS, Wg_dev, Wu_dev, qtype, X, out_dev, n_tokens, n_ff, n_in,
                      act, k=k)


def matmul_gemv_steps(be, W_dev, qtype: int, X: Q8Act, Y_dev, n_tokens: int, n_out: int, n_in: int, bias_dev=None,
                      accumulate: bool = False, y_stride: int | None = None, y_col: int = 0,
                      file: str = "matmul_gemv.cu") -> None:
    """The gemv variant's linear layer: steps of up to MAX_TOKENS tokens on `file`, larger ones (and the
    types it does not compile) on dp4a -- the same bits either way."""
    kw = dict(bias_dev=bias_dev, accumulate=accumulate, y_stride=y_stride, y_col=y_col)
    if n_tokens <= MAX_TOKENS and supports(qtype):
        return matmul_gemv(be, W_dev, qtype, X, Y_dev, n_tokens, n_out, n_in, file=file, **kw)
    matmul_dp4a(be, W_dev, qtype, X, Y_dev, n_tokens, n_out, n_in, **kw)


def gate_up_gemv_steps(be, Wg_dev, Wu_dev, qtype: int, X: Q8Act, out_dev, n_tokens: int, n_ff: int, n_in: int,
                       act: str = "silu") -> None:
    """gate_up_gemv for steps of up to MAX_TOKENS tokens, gate_up_dp4a above (and for the types gemv does
    not compile): the same bits."""
    fn = gate_up_gemv if n_tokens <= MAX_TOKENS and supports(qtype) else gate_up_dp4a
    fn(be, Wg_dev, Wu_dev, qtype, X, out_dev, n_tokens, n_ff, n_in, act=act)
