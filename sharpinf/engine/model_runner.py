"""ModelRunner: scheduled chunks -> one packed Batch -> ForwardPass -> sampled token ids.

Only the chosen ids (one int per sampling sequence) come back to the host each step;
logits stay on the device, where the sampling kernel reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sharpinf.batch import Batch, SeqChunk
from sharpinf.engine.scheduler import ScheduledChunk
from sharpinf.forward import ForwardPass
from sharpinf.kv_pool import KVPool
from sharpinf.ops.sampling import sample


@dataclass
class ModelRunner:
    fp: ForwardPass
    pool: KVPool
    steps_run: int = 0
    tokens_run: int = 0
    last_batch: Batch | None = field(default=None, repr=False)

    def run(self, chunks: list[ScheduledChunk]) -> list[int | None]:
        """Run one step; for each chunk the sampled token, or None if it did not reach the end."""
        be = self.fp.backend
        seq_chunks = []
        for c in chunks:
            s = c.seq
            seq_chunks.append(SeqChunk(s.tokens[s.num_computed : s.num_computed + c.n_tokens], s.num_computed,
                                       s.block_table, want_logits=c.samples))
        batch = Batch.build(seq_chunks, self.pool.block_size)
        self.last_batch = batch
        out = self.fp.forward(batch, self.pool)
        self.steps_run += 1
        self.tokens_run += batch.n_tokens
        samplers = [c.seq for c in chunks if c.samples]
        if not samplers:
            return [None] * len(chunks)
        ids = be.empty((len(samplers),), np.int32)
        sample(be, out.logits, len(samplers), self.fp.cfg.n_vocab, [s.params for s in samplers],
               [s.seed for s in samplers], [len(s.output_ids) for s in samplers], [s.tokens for s in samplers], ids)
        chosen = iter(be.download(ids).tolist())
        return [next(chosen) if c.samples else None for c in chunks]
