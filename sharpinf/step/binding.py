"""The KV pool a ForwardPass's plans run over, and the step descriptor made for it.

Plans and graphs hold the descriptor's and the pool's addresses, so a descriptor is made for one
pool -- its block size, its scratch block, block tables as wide as the longest context the pool can
hold -- and kept while steps run over that pool with tables no wider; a new one drops the plans over
the old (ForwardPass._bind). A frozen ForwardPass (its graphs captured) keeps the one it has.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from sharpinf.errors import BackendError
from sharpinf.model.config import ModelConfig
from sharpinf.ops.sampling import history_words
from sharpinf.runtime.backend import Backend
from sharpinf.step.buffers import StepCapacity, StepDescriptor
from sharpinf.step.kv_pool import KVPool


@dataclass
class PoolBinding:
    backend: Backend
    cfg: ModelConfig
    desc: StepDescriptor | None = None
    pool: Any = None  # a weak reference to the pool desc was made for (plans must not keep a pool alive)

    def current(self, kv: KVPool, width: int, frozen: bool) -> StepDescriptor | None:
        """The descriptor, if it serves steps over `kv` with block tables `width` wide; None where a
        new one is needed, which a frozen ForwardPass refuses."""
        d = self.desc
        same_pool = self.pool is not None and self.pool() is kv
        if d is not None and same_pool and width <= d.width:
            return d
        if frozen and d is not None:
            raise BackendError("a frozen ForwardPass runs one KV pool, the one its graphs were captured with"
                               if not same_pool else f"a block table of {width} blocks is wider than the frozen "
                               f"descriptor's {d.width}")
        return None

    def bind(self, kv: KVPool, width: int, cap: StepCapacity) -> StepDescriptor:
        """A new descriptor for `kv`, for steps up to `cap` (the one before must be released)."""
        full = -(-self.cfg.context_length // kv.block_size)
        self.desc = StepDescriptor(self.backend, cap, max(width, min(full, kv.num_blocks)), kv.block_size,
                                   kv.scratch_block, history_words(self.cfg.n_vocab))
        self.pool = weakref.ref(kv)
        return self.desc

    @property
    def nbytes(self) -> int:
        """The descriptor's device bytes (its fields and the allowed-token masks)."""
        return self.desc.nbytes + int(self.desc.masks.nbytes) if self.desc is not None else 0

    def release(self) -> None:
        """Drop the descriptor once its last copies are done (a freed pinned block is handed out again)."""
        if self.desc is not None:
            self.desc.retire()
        self.desc, self.pool = None, None
