"""Launcher for kernels_cu/embedding.cu: out[t] = dequantized row ids[t] of a GGML table (ids[t]
optionally fed on the device from the previous step's sampled ids)."""

from __future__ import annotations

import numpy as np

from sharpinf.model import quants
from sharpinf.ops.launch import kernel
from sharpinf.ops.matmul import kernel_suffix

KERNEL_FILE = "embedding.cu"
BLOCK = 128


def embed(backend, W_dev, qtype: int, ids_dev, out_dev, n_tokens: int, n_embd: int, scale: float = 1.0,
          feed=None) -> None:
    """out[n_tokens, n_embd] (float32) = rows ids[0..n_tokens) (int32, in range) of W, times scale.

    feed: (feed_rows, feed_ids) device int32 arrays: token t with feed_rows[t] >= 0 takes its id from
    feed_ids[feed_rows[t]] (the previous step's sampled ids) and writes it back into ids[t]. None:
    no token is fed (a -1 array is uploaded: for one-off calls; the step plan passes its own)."""
    if n_tokens < 1:
        raise ValueError(f"embed: n_tokens must be >= 1, got {n_tokens}")
    rb = quants.row_bytes(qtype, n_embd)  # raises unless n_embd is whole blocks
    k = kernel(backend, KERNEL_FILE, f"embed_{kernel_suffix(qtype)}")
    if feed is None:
        feed = (backend.upload(np.full(n_tokens, -1, np.int32)), backend.upload(np.zeros(1, np.int32)))
    backend.launch(k, (n_tokens, 1), BLOCK, (W_dev, ids_dev, out_dev, np.int32(n_tokens), np.int32(n_embd), np.float32(scale),
                                            feed[0], feed[1]),
                   io=(n_tokens * (rb + 12), 4 * n_tokens * n_embd))


# -- NumPy reference -----------------------------------------------------------------------------
def embed_reference(W_raw: np.ndarray, qtype: int, ids: np.ndarray, n_embd: int, scale: float = 1.0) -> np.ndarray:
    """quants.dequantize of the rows `ids` (float32 [len(ids), n_embd]), times scale (in float32)."""
    rb = quants.row_bytes(qtype, n_embd)
    rows = np.asarray(W_raw).view(np.uint8).reshape(-1, rb)[np.asarray(ids, np.int64)]
    return quants.dequantize(rows, qtype, (len(rows), n_embd)) * np.float32(scale)
