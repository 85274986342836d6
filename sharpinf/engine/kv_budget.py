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


def plan_draft_blocks(backend: Backend, draft: ModelConfig, target: ModelConfig, ec: EngineConfig,
                      max_model_len: int, k: int, graph_launches: int = 0) -> int:
    """The blocks of a draft model's KV pool (engine/draft.py), planned before the target's.

    Every running sequence has a shadow in the draft that holds what the target holds, and a few
    guesses more (each shadow at most its target's blocks + 1 + ceil(k / block_size)). So: enough for
    max_num_seqs sequences of max_model_len tokens; and where the target's pool is known already
    (num_blocks, or the emulator's default) no more than it needs beside that pool. On a GPU
    otherwise, at most the draft's share of the usable memory that gives both pools the same tokens
    (the target's plan then takes the rest). graph_launches: both models' (their graphs' reserve)."""
    bs, seqs = ec.block_size, ec.max_num_seqs
    full = seqs * -(-max_model_len // bs)
    mem = backend.memory_info()
    if ec.num_blocks is not None or mem is None:
        return min(full, (ec.num_blocks or EMU_DEFAULT_BLOCKS) + seqs * (1 + -(-k // bs)))
    free, total = mem
    usable = (free - (1.0 - ec.gpu_memory_utilization) * total - WORKSPACE_MARGIN_BYTES
              - graph_launches * GRAPH_BYTES_PER_LAUNCH)
    d, t = kv_bytes_per_slot(draft, ec.kv_dtype), kv_bytes_per_slot(target, ec.kv_dtype)
    n = min(full, int(usable * d / (d + t) // (d * bs)) - 1)  # the pool adds one scratch block
    if n < 1:
        raise SharpinfError(f"speculative: no room for the draft model's KV cache: {free / 2**30:.2f} GiB free of "
                            f"{total / 2**30:.2f} GiB at gpu_memory_utilization={ec.gpu_memory_utilization}")
    return n
