"""The paged KV pool: allocated once on the backend; a sequence's cache is a list of block ids.

Per layer, K and V each hold (num_blocks + 1) x block_size slots of [n_kv_heads, head_dim]
elements (q8_0: head_dim/32 blocks of {fp16 scale, 32 int8} per head, stored as bytes).
Physical slot of a sequence's position j: block_table[j // block_size] * block_size + j % block_size.
Blocks 0 .. num_blocks-1 hold sequences; the extra block `scratch_block` is where the padding
tokens of a step padded up to its graph's size write and read (their outputs are never used).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sharpinf.errors import SharpinfError
from sharpinf.model.config import ModelConfig
from sharpinf.ops.kv_cache import KV_DTYPES, element_bytes, kv_cache_shape
from sharpinf.runtime.backend import Backend

_ALIASES = {"fp16": "f16", "float16": "f16", "bfloat16": "bf16", "fp32": "f32", "float32": "f32", "q8": "q8_0"}


def kv_dtype_name(name: str) -> str:
    n = _ALIASES.get(name.lower(), name.lower())
    if n not in KV_DTYPES:
        raise SharpinfError(f"unknown KV dtype '{name}': choose fp16, bf16, fp32 or q8_0")
    return n


def kv_bytes_per_slot(cfg: ModelConfig, kv_dtype: str) -> float:
    """Bytes one token's K and V take over all layers."""
    return cfg.kv_bytes_per_token(element_bytes(kv_dtype_name(kv_dtype)))


@dataclass
class KVPool:
    backend: Backend
    cfg: ModelConfig
    num_blocks: int
    block_size: int = 16
    kv_dtype: str = "f16"
    k: list[Any] = field(init=False)  # per layer
    v: list[Any] = field(init=False)

    def __post_init__(self):
        self.kv_dtype = kv_dtype_name(self.kv_dtype)
        if self.block_size < 1 or self.num_blocks < 1:
            raise SharpinfError("KV pool needs block_size >= 1 and num_blocks >= 1")
        shape, dtype = kv_cache_shape(self.kv_dtype, self.num_blocks + 1, self.block_size, self.cfg.n_head_kv,
                                      self.cfg.head_dim)
        self.k = [self.backend.zeros(shape, dtype) for _ in range(self.cfg.n_layer)]
        self.v = [self.backend.zeros(shape, dtype) for _ in range(self.cfg.n_layer)]

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def scratch_block(self) -> int:
        return self.num_blocks

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.k + self.v)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy each (source, destination) block's slots, K and V of every layer, in stream order
        (copy on write for forked sequences, engine/block_manager.py)."""
        bs = self.block_size
        for src, dst in pairs:
            for a in self.k + self.v:
                self.backend.copy_device(a[src * bs : (src + 1) * bs], a[dst * bs : (dst + 1) * bs])

    def poison(self) -> None:
        """Fill every slot with NaN bytes: a kernel reading a slot nobody wrote shows up as NaN."""
        for a in self.k + self.v:
            self.backend.fill_bytes(a, 0xFF)  # on the backend's stream, ordered with the kernels
