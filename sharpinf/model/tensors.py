"""QTensor: one GGUF tensor as raw GGML blocks, dequantized on demand; check_spans: where they lie."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ..errors import ModelError
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


# ---------------------------------------------------------------- where the bytes are

GGML_MAX_DIMS = 4


@dataclass(frozen=True)
class TensorSpan:
    """One tensor as its GGUF header entry states it, before any byte of its data is read."""
    name: str
    qtype: int
    ne: tuple[int, ...]  # GGUF order: ne[0] is the row length
    offset: int  # from the start of the data section


def check_spans(path, spans: list[TensorSpan], data_start: int, file_size: int, alignment: int) -> None:
    """Raise one ModelError unless every tensor's bytes lie, aligned, inside the file and apart.

    Offsets are checked as Python ints: gguf-py adds them to data_start in uint64, so a huge
    offset wraps round and maps header bytes as weights.
    """
    placed = sorted((s.offset, _span_bytes(path, s), s.name) for s in spans)
    prev_end, prev_name = 0, None
    for offset, size, name in placed:
        start, end = data_start + offset, data_start + offset + size
        if offset % alignment:
            raise ModelError(path, f"tensor {name!r} data offset {offset} is not a multiple of the alignment {alignment}")
        if start > file_size:
            raise ModelError(path, f"tensor {name!r} data offset {offset} puts it at byte {start}, past the end "
                                   f"of the file ({file_size} bytes): a corrupt offset or a truncated file")
        if end > file_size:
            raise ModelError(path, f"truncated: tensor {name!r} data ends at byte {end}, "
                                   f"past the end of the file ({file_size} bytes)")
        if size and start < prev_end:
            raise ModelError(path, f"tensor {name!r} data (bytes {start}..{end}) overlaps tensor {prev_name!r} "
                                   f"(ending at byte {prev_end})")
        if end > prev_end:
            prev_end, prev_name = end, name


def _span_bytes(path, s: TensorSpan) -> int:
    """Bytes the shape and type need, or ModelError when they describe no whole number of blocks."""
    if not 1 <= len(s.ne) <= GGML_MAX_DIMS:
        raise ModelError(path, f"tensor {s.name!r} has {len(s.ne)} dimensions (GGUF allows 1 to {GGML_MAX_DIMS})")
    try:
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(s.qtype)]
    except (ValueError, KeyError):
        raise ModelError(path, f"tensor {s.name!r} has unknown type {s.qtype}") from None
    if s.ne[0] % block:
        raise ModelError(path, f"tensor {s.name!r} has rows of {s.ne[0]} values, not a whole number of "
                               f"{quants.qtype_name(s.qtype)} blocks ({block} values each)")
    return s.ne[0] // block * block_bytes * math.prod(s.ne[1:])
