"""Phase 0: how many KV blocks the pool gets.

On a GPU, after the weights are uploaded: take the free device memory, keep
(1 - gpu_memory_utilization) of the card plus a working margin for activations, and
divide what is left by the bytes one block of KV takes for the chosen dtype. On the
emulator there is no device memory to measure: the pool size comes from the config.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from sharpinf.engine.config import EngineConfig
from sharpinf.errors import SharpinfError
from sharpinf.kv_pool import kv_bytes_per_slot
from sharpinf.model.config import ModelConfig
from sharpinf.runtime.backend import Backend

EMU_DEFAULT_BLOCKS = 256
# activations of one step: residual, projections, gate/up, logits rows; generous on purpose
WORKSPACE_MARGIN_BYTES = 512 << 20


@dataclass
class KVBudget:
    num_blocks: int
    block_size: int
    kv_dtype: str
    bytes_per_token: float
    source: str  # "measured" (free device memory) or "configured"
    free_bytes: int | None = None
    total_bytes: int | None = None
    h2d_gb_per_s: float | None = None

    @property
    def tokens(self) -> int:
        return self.num_blocks * self.block_size

    def to_json(self) -> dict:
        return {**asdict(self), "tokens": self.tokens}


def plan_kv_budget(backend: Backend, cfg: ModelConfig, ec: EngineConfig, measure_bandwidth: bool = True) -> KVBudget:
    per_token = kv_bytes_per_slot(cfg, ec.kv_dtype)
    per_block = per_token * ec.block_size
    mem = backend.memory_info()
    if ec.num_blocks is not None or mem is None:
        n = ec.num_blocks or EMU_DEFAULT_BLOCKS
        return KVBudget(n, ec.block_size, ec.kv_dtype, per_token, "configured",
                        *(mem or (None, None)), backend.h2d_bandwidth() if measure_bandwidth else None)
    free, total = mem
    usable = free - (1.0 - ec.gpu_memory_utilization) * total - WORKSPACE_MARGIN_BYTES
    n = int(usable // per_block)
    if n < 1:
        raise SharpinfError(f"no room for a KV cache: {free / 2**30:.2f} GiB free of {total / 2**30:.2f} GiB "
                            f"at gpu_memory_utilization={ec.gpu_memory_utilization}")
    bw = backend.h2d_bandwidth() if measure_bandwidth else None
    return KVBudget(n, ec.block_size, ec.kv_dtype, per_token, "measured", free, total, bw)
