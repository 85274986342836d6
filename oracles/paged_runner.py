"""A small driver of ForwardPass for the oracles: sequences, block tables, steps.

It hands out KV blocks from a free list in a seeded random order (so block tables are
non-contiguous, as they are under real load), builds each step's Batch from
(sequence, tokens) pairs, and returns the logits rows on the host. The engine has its
own block manager; this one only needs to be obviously right.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sharpinf.step.batch import Batch, SeqChunk
from sharpinf.errors import SharpinfError
from sharpinf.step.forward import ForwardPass
from sharpinf.step.kv_pool import KVPool
from sharpinf.step.buffers import SamplingRows


@dataclass
class PagedRunner:
    fp: ForwardPass
    pool: KVPool
    seed: int = 0
    free: list[int] = field(init=False)
    tables: dict[int, list[int]] = field(default_factory=dict)
    lengths: dict[int, int] = field(default_factory=dict)
    last_sampled: np.ndarray | None = None

    def __post_init__(self):
        self.free = np.random.default_rng(self.seed).permutation(self.pool.num_blocks).tolist()

    def new_seq(self) -> int:
        sid = len(self.tables)
        self.tables[sid], self.lengths[sid] = [], 0
        return sid

    def _reserve(self, sid: int, new_len: int) -> None:
        need = -(-new_len // self.pool.block_size) - len(self.tables[sid])
        if need > len(self.free):
            raise SharpinfError(f"PagedRunner: KV pool exhausted ({self.pool.num_blocks} blocks)")
        self.tables[sid] += [self.free.pop() for _ in range(max(0, need))]

    def step(self, work: list[tuple[int, list[int]]], all_logits: bool = False,
             sampling: SamplingRows | None = None) -> list[np.ndarray]:
        """Run one packed step; work = [(seq, tokens)]; returns per sequence its logits rows
        (every token's with all_logits, else the last token's) as float32 arrays; with
        `sampling` (one row per sequence) the sampled ids land in self.last_sampled."""
        chunks = []
        for sid, toks in work:
            self._reserve(sid, self.lengths[sid] + len(toks))
            chunks.append(SeqChunk(list(toks), self.lengths[sid], list(self.tables[sid])))
        batch = Batch.build(chunks, self.pool.block_size, all_logits=all_logits)
        out = self.fp.forward(batch, self.pool, sampling=sampling)
        logits = self.fp.backend.download(out.logits)
        self.last_sampled = out.sampled
        for sid, toks in work:
            self.lengths[sid] += len(toks)
        if all_logits:
            cu = batch.cu_seqlens
            return [logits[cu[i] : cu[i + 1]] for i in range(len(work))]
        return [logits[i : i + 1] for i in range(len(work))]

    def prefill_chunks(self, tokens: list[int], chunk_sizes: list[int], sid: int | None = None) -> np.ndarray:
        """One sequence through several steps of the given chunk sizes; every position's logits."""
        sid = self.new_seq() if sid is None else sid
        rows, at = [], 0
        for n in chunk_sizes:
            rows += self.step([(sid, tokens[at : at + n])], all_logits=True)
            at += n
        assert at == len(tokens), "chunk sizes must cover the tokens"
        return np.concatenate(rows)
