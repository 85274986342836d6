"""Launcher for kernels_cu/matmul.cu: Y = X @ W^T (+ bias) with W in any supported GGML type.

W is the tensor's raw GGUF bytes on the device (n_out rows of quants.row_bytes(qtype, n_in)),
dequantized inside the kernel. X and Y are float32 [n_tokens, n_in] / [n_tokens, n_out].

Every launch choice below depends on the shapes only, and none of them changes a result:
each output's reduction order is fixed by n_in alone (see matmul.cu), so a token gives the
same bits alone or packed with any number of others.
"""

from __future__ import annotations

import numpy as np

from sharpinf.model import quants
from sharpinf.ops.launch import kernel

KERNEL_FILE = "matmul.cu"
TILE_TOKENS = 8  # MM_TILE in matmul.cu
CHUNK = 32  # values per chunk: n_in must be a multiple of this (and of the block size)

KERNEL_SUFFIX: dict[int, str] = {
    quants.F32: "f32", quants.F16: "f16", quants.BF16: "bf16",
    quants.Q8_0: "q8_0", quants.Q4_0: "q4_0", quants.Q4_1: "q4_1", quants.Q5_0: "q5_0", quants.Q5_1: "q5_1",
    quants.Q4_K: "q4_k", quants.Q5_K: "q5_k", quants.Q6_K: "q6_k",
    # the baselines' only (quants.BASE_ONLY): the faster variants hand them to dp4a
    quants.Q2_K: "q2_k", quants.Q3_K: "q3_k", quants.IQ4_NL: "iq4_nl", quants.IQ4_XS: "iq4_xs", quants.MXFP4: "mxfp4",
}


def kernel_suffix(qtype: int) -> str:
    try:
        return KERNEL_SUFFIX[int(qtype)]
    except KeyError:
        raise ValueError(f"no kernel for quant type {quants.qtype_name(qtype)}") from None


def check_n_in(qtype: int, n_in: int) -> None:
    """n_in must be whole blocks and whole 32-value chunks (so any F32/F16/BF16 row of 32k values)."""
    need = max(CHUNK, quants.BLOCK_ELEMS[int(qtype)])
    if n_in < need or n_in % need:
        raise ValueError(f"matmul {quants.qtype_name(qtype)}: n_in must be a positive multiple of {need}, got {n_in}")


ROWS_PER_WARP = 4  # MM_ROWS in matmul.cu
WARPS = 4  # per block (MM_MAX_WARPS in matmul.cu is the most)
MAX_ROW_BLOCKS = 4096  # cap on grid.x; warps then stride over the rows (no effect on results)
EMU_ROW_BLOCKS = 64  # the emulator pays per thread: fewer, longer-lived warps


def launch_shape(n_tokens: int, n_out: int, max_row_blocks: int = MAX_ROW_BLOCKS) -> tuple[tuple[int, int], int]:
    """(grid, block) from the shapes alone: 4 warps a block, 4 rows a warp pass, 8 tokens a tile (grid.y)."""
    warps = WARPS if n_out > ROWS_PER_WARP else 1
    row_blocks = -(-n_out // (warps * ROWS_PER_WARP))
    return (min(row_blocks, max_row_blocks), -(-n_tokens // TILE_TOKENS)), 32 * warps


def _check_aligned(backend, arr, what: str) -> None:
    # the GPU kernel reads X with 16-byte vector loads (the emulator reads floats one by one)
    ptr = getattr(getattr(arr, "data", None), "ptr", None) if backend.name == "cuda" else None
    if ptr is not None and ptr % 16:
        raise ValueError(f"matmul: {what} must be 16-byte aligned on the GPU")


def matmul(backend, W_dev, qtype: int, X_dev, Y_dev, n_tokens: int, n_out: int, n_in: int, bias_dev=None,
           y_stride: int | None = None, y_col: int = 0, file: str = KERNEL_FILE) -> None:
    """Y[n_tokens, n_out] = X[n_tokens, n_in] @ W[n_out, n_in]^T (+ bias[n_out]), all float32 but W.

    With y_stride, Y_dev is a wider contiguous [n_tokens, y_stride] buffer and the result fills
    its columns y_col .. y_col + n_out (e.g. one part of a fused QKV output). Same bits either way.
    """
    if n_tokens < 1 or n_out < 1:
        raise ValueError(f"matmul: n_tokens and n_out must be >= 1, got {n_tokens}, {n_out}")
    check_n_in(qtype, n_in)
    _check_aligned(backend, X_dev, "X")
    grid, block = launch_shape(n_tokens, n_out, MAX_ROW_BLOCKS if backend.gpu_shapes else EMU_ROW_BLOCKS)
    has_bias = bias_dev is not None
    bias = bias_dev if has_bias else X_dev  # any valid pointer; never read
    args = (W_dev, X_dev, bias)
    tail = (np.int32(n_tokens), np.int32(n_out), np.int32(n_in), np.int32(has_bias))
    name = f"matmul_{kernel_suffix(qtype)}"
    io = (n_out * quants.row_bytes(qtype, n_in) + 4 * (n_tokens * n_in + n_out * has_bias), 4 * n_tokens * n_out)
    if y_stride is None or (y_stride == n_out and y_col == 0):
        backend.launch(kernel(backend, file, name), grid, block, args + (Y_dev,) + tail, io=io)
        return
    if y_col < 0 or y_col + n_out > y_stride:
        raise ValueError(f"matmul: columns {y_col}..{y_col + n_out} do not fit rows of {y_stride}")
    y_view = Y_dev.reshape(-1)[y_col:]  # contiguous, starting at column y_col of row 0
    backend.launch(kernel(backend, file, name + "_ys"), grid, block,
                   args + (y_view,) + tail + (np.int32(y_stride),), io=io)


# -- NumPy reference -----------------------------------------------------------------------------
def matmul_reference(W_raw: np.ndarray, qtype: int, X: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """X @ dequantize(W)^T (+ bias) in float64, returned as float32.

    W_raw: raw bytes, (n_out, row_bytes) or flat; X: (n_tokens, n_in) float32.
    """
    X = np.atleast_2d(np.asarray(X, np.float32))
    n_in = X.shape[1]
    raw = np.asarray(W_raw).view(np.uint8).reshape(-1)
    n_out = raw.size // quants.row_bytes(qtype, n_in)
    W = quants.dequantize(raw, qtype, (n_out, n_in)).astype(np.float64)
    Y = X.astype(np.float64) @ W.T
    if bias is not None:
        Y = Y + np.asarray(bias, np.float64)
    return Y.astype(np.float32)


def matmul_error_bound(W_raw: np.ndarray, qtype: int, X: np.ndarray, rel: float = 1e-5) -> np.ndarray:
    """The tolerance the tests allow: rel * sum_i |w_i x_i| per output (float32 accumulation error)."""
    X = np.atleast_2d(np.asarray(X, np.float32))
    n_in = X.shape[1]
    raw = np.asarray(W_raw).view(np.uint8).reshape(-1)
    n_out = raw.size // quants.row_bytes(qtype, n_in)
    W = quants.dequantize(raw, qtype, (n_out, n_in)).astype(np.float64)
    return rel * (np.abs(X.astype(np.float64)) @ np.abs(W).T)
