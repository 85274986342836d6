"""The KV budget: how many KV blocks the pool gets, sized once at engine start-up.

On a GPU, after the weights and the step buffers are allocated: take the free device
memory, keep (1 - gpu_memory_utilization) of the card, a margin, and what the CUDA graphs
will take (estimated per captured launch, measured after capture and reported), and divide
what is left by the bytes one block of KV takes for the chosen dtype. On the emulator
there is no device memory to measure: the pool size comes from the config.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from sharpinf.engine.config import EngineConfig
from sharpinf.errors import SharpinfError
from sharpinf.step.kv_pool import kv_bytes_per_slot
from sharpinf.model.config import ModelConfig
from sharpinf.runtime.backend import Backend

EMU_DEFAULT_BLOCKS = 256
# the step buffers are allocated before the measurement; this covers CuPy's pool rounding,
# the sampling and cuBLAS-free scratch a kernel may add, and fragmentation
WORKSPACE_MARGIN_BYTES = 256 << 20
# device memory per captured kernel launch (graph node + executable): an upper estimate; the
# engine reports the measured figure after capture (graph_bytes in its metrics)
GRAPH_BYTES_PER_LAUNCH = 8 << 10


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
    graph_reserve_bytes: int = 0

    @property
    def tokens(self) -> int:
        return self.num_blocks * self.block_size

    def to_json(self) -> dict:
        return {**asdict(self), "tokens": self.tokens}


def plan_kv_budget(backend: Backend, cfg: ModelConfig, ec: EngineConfig, measure_bandwidth: bool = True,
                   graph_launches: int = 0) -> KVBudget:
    """graph_launches: kernel launches the graphs to be captured will hold (0: no graphs)."""
    per_token = kv_bytes_per_slot(cfg, ec.kv_dtype)
    per_block = per_token * ec.block_size
    mem = backend.memory_info()
    if ec.num_blocks is not None or mem is None:
        n = ec.num_blocks or EMU_DEFAULT_BLOCKS
        return KVBudget(n, ec.block_size, ec.kv_dtype, per_token, "configured",
                        *(mem or (None, None)), backend.h2d_bandwidth() if measure_bandwidth else None)
    free, total = mem
    graphs = graph_launches * GRAPH_BYTES_PER_LAUNCH
    usable = free - (1.0 - ec.gpu_memory_utilization) * total - WORKSPACE_MARGIN_BYTES - graphs
    n = int(usable // per_block) - 1  # the pool adds one scratch block for padding
    if n < 1:
        raise SharpinfError(f"no room for a KV cache: {free / 2**30:.2f} GiB free of {total / 2**30:.2f} GiB "
                            f"at gpu_memory_utilization={ec.gpu_memory_utilization}")
    bw = backend.h2d_bandwidth() if measure_bandwidth else None
    return KVBudget(n, ec.block_size, ec.kv_dtype, per_token, "measured", free, total, bw, graphs)
