"""Teacher-forced logits of one sequence through the packed, paged forward pass (`sharpinf score`)."""

from __future__ import annotations

import numpy as np

from sharpinf.step.batch import Batch, SeqChunk
from sharpinf.step.forward import ForwardPass
from sharpinf.step.kv_pool import KVPool


def teacher_forced_logits(fp: ForwardPass, ids: list[int], block_size: int = 16, kv_dtype: str = "f16") -> np.ndarray:
    """[T, vocab]: row t holds the logits after reading ids[0..t], all in one packed step."""
    n_blocks = -(-len(ids) // block_size)
    pool = KVPool(fp.backend, fp.cfg, num_blocks=n_blocks, block_size=block_size, kv_dtype=kv_dtype)
    batch = Batch.build([SeqChunk(list(ids), 0, list(range(n_blocks)))], block_size, all_logits=True)
    return fp.backend.download(fp.forward(batch, pool).logits)
