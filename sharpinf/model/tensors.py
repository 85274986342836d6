"""QTensor: one GGUF tensor as raw GGML blocks, dequantized on demand."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import quants


@dataclass(frozen=True)
class QTensor:
    name: str
    qtype: int  # gguf.GGMLQuantizationType value
    # numpy order: weight matrices are (out_features, in_features), i.e. GGUF ne reversed
    shape: tuple[int, ...]
    # uint8 raw blocks, (rows, row_bytes); 1-D tensors are (1, row_bytes).
    # May be a read-only view into the memory-mapped file.
    raw: np.ndarray

    def dequantize(self) -> np.ndarray:
        """float32 array of `shape`."""
        return quants.dequantize(self.raw, self.qtype, self.shape)

    @property
    def qtype_name(self) -> str:
        return quants.qtype_name(self.qtype)

    @property
    def nbytes(self) -> int:
        """Bytes of raw block data (what the weights cost in memory)."""
        return int(self.raw.nbytes)
