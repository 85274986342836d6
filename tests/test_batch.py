"""The batch descriptor: Batch.build on a hand-worked example, and validate() on every
malformed case the kernels must never see (each gives a BatchError naming the problem)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sharpinf.step.batch import Batch, BatchError, SeqChunk
from asserts import assert_same

BS = 4  # block size of every batch here
NUM_BLOCKS = 8


def mixed_chunks() -> list[SeqChunk]:
    """One step of three sequences, block size 4:
    seq 0: mid-prefill chunk, 5 tokens already cached, this chunk at positions 5, 6, 7 (table [7, 2])
    seq 1: a fresh 2-token prompt at positions 0, 1 (table [5])
    seq 2: a decode at position 9 (table [0, 3, 6])"""
    return [
        SeqChunk([10, 11, 12], start=5, block_table=[7, 2]),
        SeqChunk([20, 21], start=0, block_table=[5]),
        SeqChunk([30], start=9, block_table=[0, 3, 6]),
    ]


def mixed() -> Batch:
    return Batch.build(mixed_chunks(), BS)


def i32(*xs) -> np.ndarray:
    return np.array(xs, np.int32)


# -- Batch.build, worked by hand -------------------------------------------------------------
def test_build_hand_worked_example():
    b = mixed()
    assert b.n_tokens == 6 and b.n_seqs == 3 and b.block_size == 4
    assert_same(b.token_ids, [10, 11, 12, 20, 21, 30])
    assert_same(b.cu_seqlens, [0, 3, 5, 6])
    assert_same(b.positions, [5, 6, 7, 0, 1, 9])
    assert_same(b.context_lens, [8, 2, 10])
    assert_same(b.block_tables, [[7, 2, -1], [5, -1, -1], [0, 3, 6]])
    # slot = table[pos // 4] * 4 + pos % 4:
    #   seq 0: pos 5, 6, 7 -> logical block 1 -> physical 2 -> 8 + 1, 8 + 2, 8 + 3
    #   seq 1: pos 0, 1    -> logical block 0 -> physical 5 -> 20, 21
    #   seq 2: pos 9       -> logical block 2 -> physical 6 -> 24 + 1
    assert_same(b.slot_mapping, [9, 10, 11, 20, 21, 25])
    # the last token of each chunk that wants logits
    assert_same(b.logits_rows, [2, 4, 5])
    for name in ("token_ids", "positions", "cu_seqlens", "context_lens", "block_tables", "slot_mapping", "logits_rows"):
        assert getattr(b, name).dtype == np.int32, name
    assert b.validate(NUM_BLOCKS, n_vocab=64) is b


def test_build_logits_rows_variants():
    chunks = mixed_chunks()
    chunks[0] = replace(chunks[0], want_logits=False)  # a mid-prompt chunk skips the LM head
    assert_same(Batch.build(chunks, BS).logits_rows, [4, 5])
    assert_same(Batch.build(chunks, BS, all_logits=True).logits_rows, [0, 1, 2, 3, 4, 5])


def test_build_needs_a_sequence():
    with pytest.raises(BatchError, match="at least one sequence"):
        Batch.build([], BS)


def test_well_formed_mixed_prefill_decode_validates():
    b = mixed()
    assert b.validate(NUM_BLOCKS) is b
    # also with all logits, a wider block table than needed, and a single decode alone
    Batch.build(mixed_chunks(), BS, all_logits=True).validate(NUM_BLOCKS, n_vocab=31)
    Batch.build([SeqChunk([1], 3, [4, 1, 6])], BS).validate(NUM_BLOCKS)
    Batch.build([SeqChunk([1, 2, 3, 4], 0, [3])], BS).validate(NUM_BLOCKS)  # a chunk that fills its block


# -- validate(): each malformed descriptor ---------------------------------------------------
def bad(**fields) -> Batch:
    return replace(mixed(), **fields)


MALFORMED = {
    # cu_seqlens
    "cu_not_starting_at_0": (dict(cu_seqlens=i32(1, 3, 5, 6)), r"cu_seqlens must start at 0"),
    "cu_not_ending_at_N": (dict(cu_seqlens=i32(0, 3, 5, 5)), r"end at N=6"),
    "cu_wrong_length": (dict(cu_seqlens=i32(0, 3, 6)), r"S\+1=4 entries"),
    "cu_decreasing": (dict(cu_seqlens=i32(0, 5, 3, 6)), r"cu_seqlens decreases"),
    # positions vs context lengths
    "positions_disagree": (dict(positions=i32(5, 6, 8, 0, 1, 9)), r"sequence 0: positions .* disagree with context length 8"),
    "context_len_disagrees": (dict(context_lens=i32(8, 2, 11)), r"sequence 2: positions \[9\] disagree with context length 11"),
    "positions_wrong_length": (dict(positions=i32(5, 6, 7, 0, 1)), r"one entry per token"),
    # block tables
    "table_too_short": (dict(block_tables=i32(7, 2, 5, -1, 0, 3).reshape(3, 2)),
                        r"sequence 2: block table of 2 blocks cannot cover 10 positions"),
    "table_negative": (dict(block_tables=i32(7, -1, -1, 5, -1, -1, 0, 3, 6).reshape(3, 3)),
                       r"sequence 0: block table \[7, -1\] has ids outside \[0, 8\)"),
    "table_out_of_range": (dict(block_tables=i32(7, 2, -1, 5, -1, -1, 0, 3, 8).reshape(3, 3)),
                           r"sequence 2: block table \[0, 3, 8\] has ids outside \[0, 8\)"),
    "table_repeats": (dict(block_tables=i32(7, 2, -1, 5, -1, -1, 0, 6, 6).reshape(3, 3)),
                      r"sequence 2: block table repeats a block"),
    "table_wrong_rows": (dict(block_tables=i32(7, 2, -1, 5, -1, -1).reshape(2, 3)), r"block_tables must be \[S=3"),
    "table_not_2d": (dict(block_tables=i32(7, 2, -1)), r"block_tables must be \[S=3"),
    # slots
    "slot_disagrees_with_table": (dict(slot_mapping=i32(9, 10, 11, 20, 22, 25)),
                                  r"sequence 1: slot_mapping disagrees with its block table"),
    "slot_negative": (dict(slot_mapping=i32(9, 10, 11, -1, 21, 25)), r"slot_mapping"),
    "slot_out_of_range": (dict(slot_mapping=i32(9, 10, 11, 20, 21, 32)), r"slot_mapping"),
    "slots_wrong_length": (dict(slot_mapping=i32(9, 10, 11, 20, 21)), r"one entry per token"),
    # logits rows
    "logits_row_past_N": (dict(logits_rows=i32(2, 4, 6)), r"logits_rows out of range \[0, 6\)"),
    "logits_row_negative": (dict(logits_rows=i32(-1, 4)), r"logits_rows out of range \[0, 6\)"),
    # dtypes
    "token_ids_int64": (dict(token_ids=np.array([10, 11, 12, 20, 21, 30], np.int64)), r"token_ids must be int32, got int64"),
    "positions_int64": (dict(positions=np.array([5, 6, 7, 0, 1, 9], np.int64)), r"positions must be int32, got int64"),
    "cu_uint32": (dict(cu_seqlens=np.array([0, 3, 5, 6], np.uint32)), r"cu_seqlens must be int32, got uint32"),
    "tables_int16": (dict(block_tables=mixed().block_tables.astype(np.int16)), r"block_tables must be int32, got int16"),
    "slots_float": (dict(slot_mapping=mixed().slot_mapping.astype(np.float32)), r"slot_mapping must be int32, got float32"),
    "logits_rows_int64": (dict(logits_rows=np.array([2, 4, 5], np.int64)), r"logits_rows must be int32"),
    "context_lens_int64": (dict(context_lens=np.array([8, 2, 10], np.int64)), r"context_lens must be int32"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_batch_is_named(case):
    fields, message = MALFORMED[case]
    with pytest.raises(BatchError, match=message):
        bad(**fields).validate(NUM_BLOCKS)


def test_duplicated_slots_across_sequences():
    """Two sequences whose tables share a physical block write the same KV entries."""
    b = Batch.build([SeqChunk([1, 2], 0, [2]), SeqChunk([3, 4], 0, [2])], BS)
    assert_same(b.slot_mapping, [8, 9, 8, 9])
    with pytest.raises(BatchError, match="slot_mapping repeats a slot"):
        b.validate(NUM_BLOCKS)


def test_token_id_out_of_vocab():
    with pytest.raises(BatchError, match=r"token id out of range \[0, 30\)"):
        mixed().validate(NUM_BLOCKS, n_vocab=30)  # token 30 is one past
    with pytest.raises(BatchError, match="token id out of range"):
        bad(token_ids=i32(10, 11, -2, 20, 21, 30)).validate(NUM_BLOCKS, n_vocab=64)


def test_empty_batch():
    with pytest.raises(BatchError, match="empty batch"):
        Batch.build([SeqChunk([], 0, [])], BS).validate(NUM_BLOCKS)


def test_pool_too_small_for_tables():
    """The same descriptor is fine for a pool of 8 blocks, out of range for one of 7."""
    mixed().validate(8)
    with pytest.raises(BatchError, match=r"sequence 0: block table \[7, 2\] has ids outside \[0, 7\)"):
        mixed().validate(7)


def test_slid_blocks_validate_only_below_the_window():
    """With every layer windowed (window W), a table entry may be -1 (its block freed) when all its
    positions lie before the first key the sequence's first query of the step sees; elsewhere -1 is
    an id outside the pool, as without a window."""
    chunk = SeqChunk([5, 6], 20, [-1, -1, -1, 7, 8, 9])  # queries 20, 21; W = 6 -> first key 15 (block 3)
    b = Batch.build([chunk], 4)
    b.validate(16, window=6)
    with pytest.raises(BatchError, match="outside"):
        b.validate(16)  # no window: nothing may be freed
    with pytest.raises(BatchError, match="outside"):
        Batch.build([SeqChunk([5, 6], 20, [-1, -1, -1, -1, 8, 9])], 4).validate(16, window=6)  # block 3 is read
    Batch.build([SeqChunk([5, 6], 20, [-1, -1, -1, -1, 8, 9])], 4).validate(16, window=4)  # W 4: first key 17
