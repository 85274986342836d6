"""The batch descriptor: one forward step over a flat, packed batch of N tokens from S sequences.

Sequence s contributes one chunk of query tokens, rows cu_seqlens[s]..cu_seqlens[s+1]-1,
at absolute positions context_lens[s] - chunk_len .. context_lens[s] - 1. A decode is a
chunk of length 1; a single user is S = 1; prefill, decode and mixed steps are the same
object. There is no padding anywhere.

    token_ids     [N]    int32
    positions     [N]    int32   absolute position of each token in its sequence
    cu_seqlens    [S+1]  int32   chunk boundaries: 0 = cu[0] <= cu[1] <= ... <= cu[S] = N
    context_lens  [S]    int32   each sequence's context length after this step
    block_tables  [S, B] int32   physical KV block of each logical block (-1 past the end)
    slot_mapping  [N]    int32   physical KV slot of each token: block * block_size + offset
    logits_rows   [R]    int32   rows that need logits (the last token of a sequence that
                                 wants a token this step; mid-prompt chunks skip the LM head)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from sharpinf.errors import SharpinfError

I32 = np.int32


class BatchError(SharpinfError):
    """A malformed batch descriptor: says which field and why."""


@dataclass(frozen=True)
class SeqChunk:
    """What one sequence brings to a step: tokens at positions start .. start+len-1."""

    token_ids: Sequence[int]
    start: int  # absolute position of the first token (= KV already cached)
    block_table: Sequence[int]  # physical blocks holding positions 0 .. start+len-1
    want_logits: bool = True


@dataclass(frozen=True)
class Batch:
    token_ids: np.ndarray
    positions: np.ndarray
    cu_seqlens: np.ndarray
    context_lens: np.ndarray
    block_tables: np.ndarray
    slot_mapping: np.ndarray
    logits_rows: np.ndarray
    block_size: int

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def n_seqs(self) -> int:
        return len(self.context_lens)

    @classmethod
    def build(cls, chunks: Sequence[SeqChunk], block_size: int, all_logits: bool = False) -> "Batch":
        """Pack chunks into a descriptor (validated against nothing: call validate()).

        all_logits: logits for every token (teacher-forced scoring and the oracles),
        instead of only the last token of each chunk that wants one."""
        if not chunks:
            raise BatchError("a batch needs at least one sequence")
        lens = [len(c.token_ids) for c in chunks]
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(I32)
        positions = np.concatenate([np.arange(c.start, c.start + n) for c, n in zip(chunks, lens)]).astype(I32)
        width = max(1, max(len(c.block_table) for c in chunks))
        tables = np.full((len(chunks), width), -1, I32)
        for s, c in enumerate(chunks):
            tables[s, : len(c.block_table)] = c.block_table
        seq_of_token = np.repeat(np.arange(len(chunks)), lens)
        blocks = tables[seq_of_token, positions // block_size] if len(positions) else np.zeros(0, I32)
        slots = (blocks.astype(np.int64) * block_size + positions % block_size).astype(I32)
        if all_logits:
            rows = list(range(int(cu[-1])))
        else:
            rows = [int(cu[s + 1]) - 1 for s, c in enumerate(chunks) if c.want_logits and lens[s] > 0]
        return cls(
            token_ids=np.concatenate([np.asarray(c.token_ids, dtype=np.int64) for c in chunks]).astype(I32),
            positions=positions,
            cu_seqlens=cu,
            context_lens=np.array([c.start + n for c, n in zip(chunks, lens)], I32),
            block_tables=tables,
            slot_mapping=slots,
            logits_rows=np.array(rows, I32),
            block_size=block_size,
        )

    def validate(self, num_blocks: int, n_vocab: int | None = None) -> "Batch":
        """Every rule the kernels rely on; a BatchError names the first one broken."""
        N, S, bs = self.n_tokens, self.n_seqs, self.block_size
        cu = self.cu_seqlens.astype(np.int64)
        for name in ("token_ids", "positions", "cu_seqlens", "context_lens", "block_tables", "slot_mapping", "logits_rows"):
            if getattr(self, name).dtype != I32:
                raise BatchError(f"{name} must be int32, got {getattr(self, name).dtype}")
        if N == 0:
            raise BatchError("empty batch: no tokens")
        if len(cu) != S + 1 or cu[0] != 0 or cu[-1] != N:
            raise BatchError(f"cu_seqlens must start at 0 and end at N={N}, with S+1={S + 1} entries: {cu.tolist()}")
        if np.any(np.diff(cu) < 0):
            raise BatchError(f"cu_seqlens decreases: {cu.tolist()}")
        if len(self.positions) != N or len(self.slot_mapping) != N:
            raise BatchError("positions and slot_mapping must have one entry per token")
        if self.block_tables.ndim != 2 or self.block_tables.shape[0] != S:
            raise BatchError(f"block_tables must be [S={S}, max_blocks], got {self.block_tables.shape}")
        if n_vocab is not None and (self.token_ids.min() < 0 or self.token_ids.max() >= n_vocab):
            raise BatchError(f"token id out of range [0, {n_vocab})")
        if np.any(self.slot_mapping < 0) or np.any(self.slot_mapping >= num_blocks * bs):
            raise BatchError(f"slot_mapping out of range [0, {num_blocks * bs})")
        for s in range(S):
            a, b = int(cu[s]), int(cu[s + 1])
            ctx = int(self.context_lens[s])
            want = np.arange(ctx - (b - a), ctx)
            if not np.array_equal(self.positions[a:b], want):
                raise BatchError(f"sequence {s}: positions {self.positions[a:b].tolist()} disagree with "
                                 f"context length {ctx} (expected {want[0] if len(want) else ctx}..{ctx - 1})")
            need = -(-ctx // bs)
            if need > self.block_tables.shape[1]:
                raise BatchError(f"sequence {s}: block table of {self.block_tables.shape[1]} blocks cannot cover {ctx} positions")
            table = self.block_tables[s, :need]
            if np.any(table < 0) or np.any(table >= num_blocks):
                raise BatchError(f"sequence {s}: block table {table.tolist()} has ids outside [0, {num_blocks}) for {ctx} positions")
            if len(set(table.tolist())) != len(table):
                raise BatchError(f"sequence {s}: block table repeats a block")
            expect = table[self.positions[a:b] // bs].astype(np.int64) * bs + self.positions[a:b] % bs
            if not np.array_equal(self.slot_mapping[a:b], expect):
                raise BatchError(f"sequence {s}: slot_mapping disagrees with its block table and positions")
        if len(np.unique(self.slot_mapping)) != N:
            raise BatchError("slot_mapping repeats a slot: two tokens would write the same KV entry")
        if len(self.logits_rows) and (self.logits_rows.min() < 0 or self.logits_rows.max() >= N):
            raise BatchError(f"logits_rows out of range [0, {N})")
        return self
