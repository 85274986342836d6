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
                                 wants a token this step, every token of a speculative chunk;
                                 mid-prompt chunks skip the LM head)
"""

from __future__ import annotations

import itertools
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
    n_logits: int = 1  # with want_logits: logits for this many last tokens (a speculative chunk: all of them)


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
        instead of only the last token of each chunk that wants one. Vectorized: the engine
        builds one of these every step."""
        if not chunks:
            raise BatchError("a batch needs at least one sequence")
        S = len(chunks)
        lens = np.fromiter((len(c.token_ids) for c in chunks), np.int64, S)
        cu = np.zeros(S + 1, np.int64)
        np.cumsum(lens, out=cu[1:])
        N = int(cu[-1])
        starts = np.fromiter((c.start for c in chunks), np.int64, S)
        seq_of_token = np.repeat(np.arange(S), lens)
        positions = starts[seq_of_token] + np.arange(N) - cu[seq_of_token]
        tlens = np.fromiter((len(c.block_table) for c in chunks), np.int64, S)
        width = max(1, int(tlens.max()))
        tables = np.full((S, width), -1, np.int64)
        if tlens.sum():
            flat = np.fromiter(itertools.chain.from_iterable(c.block_table for c in chunks), np.int64, int(tlens.sum()))
            row = np.repeat(np.arange(S), tlens)
            toff = np.zeros(S, np.int64)
            np.cumsum(tlens[:-1], out=toff[1:])
            tables[row, np.arange(len(flat)) - toff[row]] = flat
        if N:
            blocks = tables[seq_of_token, np.minimum(positions // block_size, width - 1)]
            slots = blocks * block_size + positions % block_size
        else:
            slots = np.zeros(0, np.int64)
        if all_logits:
            rows = np.arange(N)
        else:
            want = np.fromiter((c.want_logits for c in chunks), bool, S) & (lens > 0)
            per = np.fromiter((c.n_logits for c in chunks), np.int64, S)[want]
            if (per == 1).all():
                rows = cu[1:][want] - 1
            else:  # each wanting chunk's last `per` tokens, in order
                ends = np.repeat(cu[1:][want], per)
                back = np.arange(int(per.sum())) - np.repeat(np.cumsum(per) - per, per)
                rows = ends - np.repeat(per, per) + back
        ids = np.fromiter(itertools.chain.from_iterable(c.token_ids for c in chunks), np.int64, N)
        return cls(
            token_ids=ids.astype(I32),
            positions=positions.astype(I32),
            cu_seqlens=cu.astype(I32),
            context_lens=(starts + lens).astype(I32),
            block_tables=tables.astype(I32),
            slot_mapping=slots.astype(I32),
            logits_rows=rows.astype(I32),
            block_size=block_size,
        )

    def validate(self, num_blocks: int, n_vocab: int | None = None, window: int = 0) -> "Batch":
        """Every rule the kernels rely on; a BatchError names the first one broken (vectorized:
        per-sequence rules are checked for all sequences at once, then the first offender named)."""
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
        self._check_sequences(num_blocks, cu, window)
        if len(np.unique(self.slot_mapping)) != N:
            raise BatchError("slot_mapping repeats a slot: two tokens would write the same KV entry")
        if len(self.logits_rows) and (self.logits_rows.min() < 0 or self.logits_rows.max() >= N):
            raise BatchError(f"logits_rows out of range [0, {N})")
        return self

    def _check_sequences(self, num_blocks: int, cu: np.ndarray, window: int = 0) -> None:
        """Per sequence, in this order: positions agree with the context length, the block table
        covers it, its ids are in the pool, none repeats, slot_mapping follows from them. With a
        window (every layer slides: ModelConfig.kv_window), an entry may be -1 (its block freed) when
        all its positions lie before the window of the sequence's first query in this step."""
        N, S, bs, W = self.n_tokens, self.n_seqs, self.block_size, self.block_tables.shape[1]
        seq = np.repeat(np.arange(S), np.diff(cu))
        t = np.arange(N)
        ctx = self.context_lens.astype(np.int64)
        pos = self.positions.astype(np.int64)
        pos_bad = np.bincount(seq, weights=pos != ctx[seq] - cu[seq + 1] + t, minlength=S) > 0
        need = np.maximum(-(-ctx // bs), 0)
        cover_bad = need > W
        tables = self.block_tables.astype(np.int64)
        live = np.arange(W)[None, :] < np.minimum(need, W)[:, None]
        if window > 0:  # the first key any of this step's queries sees, per sequence
            first_key = np.maximum(ctx - np.diff(cu) - window + 1, 0)
            live &= ~((tables == -1) & ((np.arange(W)[None, :] + 1) * bs <= first_key[:, None]))
        range_bad = np.any(live & ((tables < 0) | (tables >= num_blocks)), axis=1)
        marked = np.where(live, tables, -2 - np.arange(W)[None, :])  # dead entries: distinct, never equal
        srt = np.sort(marked, axis=1)
        repeat_bad = np.any(srt[:, 1:] == srt[:, :-1], axis=1) if W > 1 else np.zeros(S, bool)
        col = np.clip(pos // bs, 0, W - 1)
        expect = tables[seq, col] * bs + pos % bs
        slot_bad = np.bincount(seq, weights=self.slot_mapping != expect, minlength=S) > 0
        checks = (pos_bad, cover_bad, range_bad, repeat_bad, slot_bad)
        bad = np.flatnonzero(np.logical_or.reduce(checks))
        if not len(bad):
            return
        s = int(bad[0])
        a, b, c = int(cu[s]), int(cu[s + 1]), int(ctx[s])
        if pos_bad[s]:
            want = np.arange(c - (b - a), c)
            raise BatchError(f"sequence {s}: positions {self.positions[a:b].tolist()} disagree with "
                             f"context length {c} (expected {want[0] if len(want) else c}..{c - 1})")
        if cover_bad[s]:
            raise BatchError(f"sequence {s}: block table of {W} blocks cannot cover {c} positions")
        if range_bad[s]:
            table = self.block_tables[s, : need[s]]
            raise BatchError(f"sequence {s}: block table {table.tolist()} has ids outside [0, {num_blocks}) for {c} positions")
        if repeat_bad[s]:
            raise BatchError(f"sequence {s}: block table repeats a block")
        raise BatchError(f"sequence {s}: slot_mapping disagrees with its block table and positions")
