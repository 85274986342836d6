"""Launcher for kernels_cu/attention.cu (varlen paged causal attention) and its NumPy reference.

A packed batch of N query tokens from S sequences: sequence s owns tokens cu_seqlens[s]..cu_seqlens[s+1]-1;
token t at absolute position positions[t] attends to its own sequence's keys at positions 0..positions[t]
(with a sliding window W > 0: max(0, p - W + 1)..p, gemma3's local layers), found through block_tables[s] (slot = block_tables[s, j // block_size] * block_size + j % block_size).
The kernel is chosen from shapes only (kv dtype, head_dim, n_heads), never from the batch's contents.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from sharpinf.errors import SharpinfError
from sharpinf.ops.kv_cache import check_kv, decode_kv
from sharpinf.ops.launch import WantedKernel, kernel

I32, F32 = np.int32, np.float32
HEAD_DIMS = (16, 32, 64, 128, 256)  # every attention kernel's (common.cuh's SHARPINF_KV_HD_ENTRIES; q8_0: 32 up)
WARPS = 4  # heads per block (one warp per (token, head))


def attention(be, kv_dtype: str, qkv, qkv_stride: int, k_cache, v_cache, block_tables, max_blocks_per_seq: int,
              cu_seqlens, positions, out, n_tokens: int, n_seqs: int, n_heads: int, n_kv_heads: int,
              head_dim: int, block_size: int, scale: float, scratch: "SplitScratch | None" = None, out_q8=None,
              sliding_window: int = 0, softcap: float = 0.0, sinks=None, file: str = "attention.cu") -> None:
    """out[t, h*head_dim:(h+1)*head_dim] = softmax(scale * q K^T) V over token t's visible keys.
    qkv: float32 [N, qkv_stride] with Q at column 0; out: float32 [N, n_heads*head_dim]; sinks (gpt-oss):
    float32 [n_heads] or None, head h's logit in the softmax's max and sum (no key, no value).
    (scratch and out_q8 keep the attention variants' one signature: this kernel needs no scratch
    and writes no q8_1 copy.)"""
    if out_q8 is not None:
        raise SharpinfError("simple attention writes no q8_1 copy of its output: quantize it apart")
    _check_shapes("simple", kv_dtype, n_heads, n_kv_heads, head_dim, None)
    if n_tokens <= 0:
        return
    warps = min(WARPS, n_heads)
    grid = (n_tokens, -(-n_heads // warps))
    # io: Q in, O out; the K/V the step reads depend on its contexts (the host bench adds them)
    be.launch(kernel(be, file, f"attention_{kv_dtype}_d{head_dim}"), grid, 32 * warps,
              (qkv, I32(qkv_stride), k_cache, v_cache, block_tables, I32(max_blocks_per_seq), cu_seqlens, positions,
               out, I32(n_tokens), I32(n_seqs), I32(n_heads), I32(n_kv_heads), I32(head_dim), I32(block_size),
               F32(scale), F32(softcap), *_sinks(sinks, qkv), I32(sliding_window)), io=(4 * n_tokens * (n_heads * head_dim + 1), 4 * n_tokens * n_heads * head_dim))


# -- the split-KV variant (kernels_cu/attention_split.cu) -------------------------------------
SPLITS = 16  # AS_SPLITS
SPLIT_PART = 64  # AS_PART: keys a partition
GROUP = 4  # AS_GROUP: query heads per block
SPLIT_WINDOW = 128  # query tokens per split launch (bounds the scratch: 128 x heads x 16 x (hd + 2) floats)


@dataclass
class SplitScratch:
    """The split kernel's partial states and merge tickets for a window of `tokens` query tokens
    (a longer step runs in several launches: the scratch stays small at any step size)."""

    partial: Any  # float [tokens, n_heads, SPLITS, head_dim + 2]
    tickets: Any  # int [tokens, n_kv_heads * groups], zero between launches
    tokens: int

    @classmethod
    def alloc(cls, be, tokens: int, n_heads: int, n_kv_heads: int, head_dim: int) -> "SplitScratch":
        tokens = max(1, min(tokens, SPLIT_WINDOW))
        groups = -(-(n_heads // n_kv_heads) // GROUP)
        return cls(be.empty((tokens * n_heads * SPLITS * (head_dim + 2),), F32),
                   be.zeros((tokens * n_kv_heads * groups,), I32), tokens)


def split_scratch(be, cfg, cap) -> dict:
    """The registry's scratch of the split frame (split, flash): partial states and merge tickets."""
    return {"split": SplitScratch.alloc(be, cap.tokens, cfg.n_head, cfg.n_head_kv, cfg.head_dim)}


def attention_split(be, kv_dtype: str, qkv, qkv_stride: int, k_cache, v_cache, block_tables, max_blocks_per_seq: int,
                    cu_seqlens, positions, out, n_tokens: int, n_seqs: int, n_heads: int, n_kv_heads: int,
                    head_dim: int, block_size: int, scale: float, scratch: SplitScratch, out_q8=None,
                    sliding_window: int = 0, softcap: float = 0.0, sinks=None, file: str = "attention_split.cu",
                    mode: str | None = None, keys: int | None = None) -> None:
    """attention() computed split-KV (flash-decoding); with out_q8 (a Q8Act) the output is also
    written in q8_1 for the dp4a o-projection (head_dim a multiple of 32). Launched split (16 blocks a
    token and head group, merged by the last) or walked (one block through every split): `mode`, or
    split_shape's choice for a step whose longest context is `keys` keys."""
    _check_shapes("split", kv_dtype, n_heads, n_kv_heads, head_dim, out_q8)
    if n_tokens <= 0:
        return
    groups = -(-(n_heads // n_kv_heads) // GROUP)
    q8 = out_q8 if out_q8 is not None else _NoQ8(out)

    def launch(fn, t0: int, n: int, splits: int) -> None:
        be.launch(fn, (n, n_kv_heads * groups, splits), 128,
                  (qkv, I32(qkv_stride), k_cache, v_cache, block_tables, I32(max_blocks_per_seq), cu_seqlens, positions,
                   out, q8.q, q8.d, q8.s, scratch.partial, scratch.tickets, I32(t0), I32(n_tokens), I32(n_seqs),
                   I32(n_heads), I32(n_kv_heads), I32(block_size), F32(scale), F32(softcap), *_sinks(sinks, qkv),
                   I32(sliding_window), I32(out_q8 is not None)),
                  io=(4 * n * (n_heads * head_dim + 1), 4 * n * n_heads * head_dim))

    if split_shape(be, kv_dtype, n_tokens, n_seqs, n_heads, n_kv_heads, head_dim, keys, sliding_window, mode,
                   file) == "walk":
        launch(kernel(be, file, f"attention_split_walk_{kv_dtype}_d{head_dim}"), 0, n_tokens, 1)
        return
    fn = kernel(be, file, f"attention_split_{kv_dtype}_d{head_dim}")
    for t0 in range(0, n_tokens, scratch.tokens):  # a window of the scratch's size per launch
        launch(fn, t0, min(scratch.tokens, n_tokens - t0), SPLITS)


def _sinks(sinks, any_array) -> tuple:
    """The kernels' (sinks, has_sinks) arguments: no sinks is any valid pointer, never read, and 0."""
    return (any_array, I32(0)) if sinks is None else (sinks, I32(1))


def _check_shapes(variant: str, kv_dtype: str, n_heads: int, n_kv_heads: int, head_dim: int, out_q8) -> None:
    """The shapes the attention kernels are compiled for (one clear line otherwise)."""
    check_kv(kv_dtype, head_dim)
    if head_dim not in HEAD_DIMS:
        raise SharpinfError(f"{variant} attention supports head_dim {HEAD_DIMS}, got {head_dim}")
    if n_kv_heads <= 0 or n_heads % n_kv_heads:
        raise SharpinfError(f"n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads})")
    if out_q8 is not None and head_dim % 32:
        raise SharpinfError(f"a q8_1 attention output needs head_dim a multiple of 32, got {head_dim}")


# -- the tensor-core variant (kernels_cu/attention_flash.cu) ----------------------------------
def flash_rows(head_dim: int) -> int:
    """Query rows ((token, head) pairs of one KV head) per flash block: 16 a warp, 4 warps (2 at 256)."""
    return 64 if head_dim <= 128 else 32


def flash_part(head_dim: int) -> int:
    """Keys a flash partition (AfShape::KT): a K or V tile."""
    return 64 if head_dim <= 128 else 32


def flash_tiles(n_tokens: int, n_seqs: int, n_heads: int, n_kv_heads: int, head_dim: int) -> int:
    """Flash's tiles for a window of n_tokens tokens of at most n_seqs sequences: rows / g tokens of one
    sequence a tile, at most one partial tile a sequence (the grid's x; tiles past the last exit)."""
    per_tile = flash_rows(head_dim) // (n_heads // n_kv_heads)
    return min(n_tokens, n_seqs + -(-n_tokens // per_tile))


# Its d128 tiles hold 248-250 registers of 255 (sm_90): the cap's code spills them (measured 2026-12-03).
FLASH_NO_SOFTCAP = "flash attention does not softcap scores (gemma2): its register tiles have no room for it"


def flash_fits(n_heads: int, n_kv_heads: int, head_dim: int) -> str | None:
    """Why the flash kernel cannot serve these shapes, or None."""
    if head_dim not in HEAD_DIMS:
        return f"flash attention is compiled for head_dim {HEAD_DIMS}, the model has {head_dim}"
    group = n_heads // max(1, n_kv_heads)
    if group > flash_rows(head_dim):
        return f"flash attention holds GQA groups of up to {flash_rows(head_dim)} heads, the model has {group}"
    return None


# The split frame's two launch shapes, the same bits (attention_split.cu's and attention_flash.cu's
# walk): the split launch runs 16 blocks a (query block, KV head) -- a token and a group of heads for
# split, a tile of (token, head) rows for flash -- each through one partition in 16 of the query's,
# merged by the last; the walk one block a (query block, KV head) through every split (a pass for the
# maximum, then the splits), its chain twice its partitions long. Which is faster depends on the
# step's blocks (how many waves each shape fills) and on its longest context (how deep a walk goes),
# so the rule reads both: the launcher's `keys`, the step's most keys a query sees -- the forward
# pass knows it on the host and keys its plans and graphs by the shapes it chose (step/forward.py).
# Estimated in partition round trips of one block (both shapes run a partition with the same code):
#   walk   ceil(blocks / walk slots)  x  WALK_PASSES x P                (one pass where S = 1)
#   split  ceil(blocks x S / split slots)  x  (ceil(P / 16) + MERGE_COST)  (no merge where S = 1)
# with P the deepest block's visible partitions (a sliding window bounds them), S = min(16, a query's
# partitions from position 0) the splits the kernels give it (from its position, window or not: a
# split the window empties still writes its state and is merged), slots the blocks the GPU holds at
# once (the occupancy calculator). The walk where it is not dearer at the step's depth and at every
# shallower one (walks_pays: so the choice flips once as a context grows, from walk to split, and a
# bucket's shapes over all contexts are found by bisection). So a 64-sequence decode of the 8B shape
# walks at 512 keys (18 against 27) and splits at 4,096 (130 against 112; the walk stops paying at 41
# partitions), a single sequence splits, and flash's 512-token prefill walks. Without `keys` (a launch
# that does not know its step's contexts) a GPU keeps the split launch, which no context makes slow.
# The two constants are estimates until a GPU times both shapes (bench/gpu_slot.sh's attention
# runs; bench/walk_rule_fit.py fits the constants to them). On the emulator a step of EMU_WALK_BLOCKS blocks or more walks
# whatever its contexts, so the forward oracles' prefills and batched decodes walk and single decodes
# of models with few KV heads split, and the cross-path oracles compare the two.
LAUNCH_MODES = ("split", "walk")
FLASH_WALK_MAX_HEAD_DIM = 128  # attention_flash.cu walks up to this (two rows' outputs and split states a thread)
EMU_WALK_BLOCKS = 4
WALK_PASSES = 2.0  # the walk goes through a partition twice: pass 1 (K and the scores, for the maximum), pass 2
MERGE_COST = 2.0  # a split block's work past its partitions: partial states out, fence, ticket, the merge's reads


def partitions(keys: int, part: int, span: int = 0) -> int:
    """The most partitions (of `part` keys at fixed positions) a block of a step whose longest context
    is `keys` sees: all of them, or those a span of W keys can touch (it may start mid-partition; W a
    query's sliding window, or for a tile of T tokens its window + T - 1; 0: no window)."""
    whole = max(1, -(-keys // part))
    return whole if span <= 0 else min(whole, (span + part - 2) // part + 1)


def walk_pays(blocks: int, parts: int, splits: int, walk_slots: int, split_slots: int,
              walk_passes: float = WALK_PASSES, merge_cost: float = MERGE_COST) -> bool:
    """The estimate above at one depth: whether walking `blocks` blocks through `parts` partitions in
    `splits` splits costs no more than the split launch (bench/walk_rule_fit.py fits the constants)."""
    walk = -(-blocks // walk_slots) * (walk_passes * parts if splits > 1 else float(parts))
    split = -(-blocks * splits // split_slots) * (-(-parts // SPLITS) + (merge_cost if splits > 1 else 0.0))
    return walk <= split


def walks_pays(blocks: int, parts: int, splits: int, walk_slots: int, split_slots: int,
               walk_passes: float = WALK_PASSES, merge_cost: float = MERGE_COST) -> bool:
    """walk_pays at the step's depth and at every depth a growing context passes through before it
    (whole partitions j = 1, 2, ...: min(j, parts) visible in min(j, splits) splits): the rule, monotone
    in the context by construction (walk_pays alone is not: ceil(parts / 16) and the waves step)."""
    return all(walk_pays(blocks, min(j, parts), min(j, splits), walk_slots, split_slots, walk_passes, merge_cost)
               for j in range(1, max(parts, splits) + 1))


@dataclass(frozen=True)
class ShapeInputs:
    """What the rule reads for a step (the kernels bench records it beside each attention row's time,
    for bench/walk_rule_fit.py): walk blocks, the deepest query's partitions and the resident blocks
    of each shape's kernel (None where not known or not asked: no context, the emulator, a forced mode)."""

    blocks: int
    parts: int | None
    splits: int | None
    walk_slots: int | None = None
    split_slots: int | None = None


def walks(be, blocks: int, head_dim: int, mode: str | None = None, max_head_dim: int = max(HEAD_DIMS),
          parts: int | None = None, splits: int | None = None, slots=None, asked: list | None = None) -> bool:
    """Whether a split-frame step of `blocks` walk blocks walks or splits: `mode` ("split", "walk"; an
    explicit "walk" the kernel cannot do is an error; "auto": the rule, whatever the environment says),
    else $SHARPINF_ATTENTION_MODE (where the kernel cannot walk, it splits), else the rule (above): on a
    GPU walks_pays, given the step's depth (`parts`, `splits`) and slots() -> (walk slots, split slots),
    without them the split launch (`asked` gets the slots where the rule asked for them). The bits are
    the same either way."""
    env = os.environ.get("SHARPINF_ATTENTION_MODE", "").strip()
    chosen = mode or env or "auto"
    if chosen not in (*LAUNCH_MODES, "auto"):
        raise SharpinfError(f"attention launch mode {chosen!r} ({'mode' if mode else 'SHARPINF_ATTENTION_MODE'}): "
                            f"choose from auto, {', '.join(LAUNCH_MODES)}")
    if head_dim > max_head_dim:
        if mode == "walk":
            raise SharpinfError(f"this attention walks head_dim <= {max_head_dim}, not {head_dim}")
        return False
    if chosen != "auto":
        return chosen == "walk"
    if not be.multiprocessors:
        return blocks >= EMU_WALK_BLOCKS
    resident = slots() if parts is not None and splits is not None and slots is not None else None
    if asked is not None and resident is not None:
        asked.extend(resident)
    return resident is not None and walks_pays(blocks, parts, splits, *resident)


def _slots(be, file: str, walk_name: str, split_name: str, threads: int):
    """() -> (walk slots, split slots): the blocks of each kernel the device holds at once (asked only
    when the rule needs it; None while collecting names: nothing is compiled to ask)."""
    def ask():
        walk_fn, split_fn = kernel(be, file, walk_name), kernel(be, file, split_name)
        if isinstance(walk_fn, WantedKernel) or isinstance(split_fn, WantedKernel):
            return None
        return be.resident_blocks(walk_fn, threads), be.resident_blocks(split_fn, threads)
    return ask


def _shape(be, blocks: int, keys: int | None, part: int, span: int, head_dim: int, mode: str | None,
           max_head_dim: int, slots, explain: bool):
    """walks() as a launch shape for a step whose longest context is `keys` (partitions of `part`
    keys; a block's window span `span`, 0: none); with explain, (shape, ShapeInputs)."""
    parts = None if keys is None else partitions(keys, part, span)
    splits = None if keys is None else min(SPLITS, partitions(keys, part))
    asked: list[int] = []
    shape = LAUNCH_MODES[walks(be, blocks, head_dim, mode, max_head_dim, parts, splits, slots, asked)]
    return (shape, ShapeInputs(blocks, parts, splits, *asked)) if explain else shape


def split_shape(be, kv_dtype: str, n_tokens: int, n_seqs: int, n_heads: int, n_kv_heads: int, head_dim: int,
                keys: int | None = None, sliding_window: int = 0, mode: str | None = None,
                file: str = "attention_split.cu", explain: bool = False):
    """attention_split's launch shape for a step ("split" or "walk"; walks() decides; with explain,
    (shape, ShapeInputs)): its walk blocks are (token, group of GROUP heads) pairs, its partitions
    SPLIT_PART keys."""
    blocks = n_tokens * n_kv_heads * -(-(n_heads // n_kv_heads) // GROUP)
    slots = _slots(be, file, f"attention_split_walk_{kv_dtype}_d{head_dim}", f"attention_split_{kv_dtype}_d{head_dim}",
                   128)
    return _shape(be, blocks, keys, SPLIT_PART, sliding_window, head_dim, mode, max(HEAD_DIMS), slots, explain)


def flash_shape(be, kv_dtype: str, n_tokens: int, n_seqs: int, n_heads: int, n_kv_heads: int, head_dim: int,
                keys: int | None = None, sliding_window: int = 0, mode: str | None = None,
                file: str = "attention_flash.cu", explain: bool = False):
    """attention_flash's launch shape for a step (as split_shape): its walk blocks are (tile, KV head)
    pairs, its partitions flash_part(head_dim) keys (a tile of T tokens spans its window + T - 1 keys);
    it walks head_dim <= FLASH_WALK_MAX_HEAD_DIM."""
    name = f"attention_flash_{kv_dtype}_d{head_dim}"  # one kernel, both shapes
    per_tile = flash_rows(head_dim) // (n_heads // n_kv_heads)
    span = sliding_window + per_tile - 1 if sliding_window > 0 else 0
    blocks = flash_tiles(n_tokens, n_seqs, n_heads, n_kv_heads, head_dim) * n_kv_heads
    return _shape(be, blocks, keys, flash_part(head_dim), span, head_dim, mode, FLASH_WALK_MAX_HEAD_DIM,
                  _slots(be, file, name, name, 2 * flash_rows(head_dim)), explain)


def attention_flash(be, kv_dtype: str, qkv, qkv_stride: int, k_cache, v_cache, block_tables, max_blocks_per_seq: int,
                    cu_seqlens, positions, out, n_tokens: int, n_seqs: int, n_heads: int, n_kv_heads: int,
                    head_dim: int, block_size: int, scale: float, scratch: SplitScratch, out_q8=None,
                    sliding_window: int = 0, softcap: float = 0.0, sinks=None, file: str = "attention_flash.cu",
                    mode: str | None = None, keys: int | None = None) -> None:
    """attention() on tensor cores (f16 mma) for every step, prefill and decode alike: blocks of
    (token, head) rows of one sequence and KV head share each K/V tile; the split kernel's frame
    (partitions at fixed positions, 16 splits, fixed-order merge, the same scratch) -- launched split
    (16 blocks a tile and KV head, merged by the last) or walked (one block through every split, no
    scratch): `mode`, or flash_shape's choice for a step whose longest context is `keys` keys."""
    _check_shapes("flash", kv_dtype, n_heads, n_kv_heads, head_dim, out_q8)
    why = FLASH_NO_SOFTCAP if softcap else flash_fits(n_heads, n_kv_heads, head_dim)
    if why:
        raise SharpinfError(why)
    if n_tokens <= 0:
        return
    rows = flash_rows(head_dim)
    q8 = out_q8 if out_q8 is not None else _NoQ8(out)

    def tiles(n: int) -> int:
        return flash_tiles(n, n_seqs, n_heads, n_kv_heads, head_dim)

    def args(t0: int, n: int) -> tuple:
        return (qkv, I32(qkv_stride), k_cache, v_cache, block_tables, I32(max_blocks_per_seq), cu_seqlens, positions,
                out, q8.q, q8.d, q8.s, scratch.partial, scratch.tickets, I32(t0), I32(n), I32(n_seqs),
                I32(n_heads), I32(n_kv_heads), I32(block_size), F32(scale), *_sinks(sinks, qkv), I32(sliding_window),
                I32(out_q8 is not None))

    def io(n: int) -> tuple[int, int]:
        return 4 * n * (n_heads * head_dim + 1), 4 * n * n_heads * head_dim

    fn = kernel(be, file, f"attention_flash_{kv_dtype}_d{head_dim}")
    if flash_shape(be, kv_dtype, n_tokens, n_seqs, n_heads, n_kv_heads, head_dim, keys, sliding_window, mode,
                   file) == "walk":  # grid.z = 1: the walk
        be.launch(fn, (tiles(n_tokens), n_kv_heads, 1), 2 * rows, args(0, n_tokens), io=io(n_tokens))
        return
    for t0 in range(0, n_tokens, scratch.tokens):  # a window of the scratch's size per launch
        n = min(scratch.tokens, n_tokens - t0)
        be.launch(fn, (tiles(n), n_kv_heads, SPLITS), 2 * rows, args(t0, n), io=io(n))


@dataclass
class _NoQ8:
    """Placeholder pointers when the split kernel writes no q8_1 copy (never dereferenced)."""

    buf: Any

    @property
    def q(self):
        return self.buf

    d = s = q


# -- NumPy reference ---------------------------------------------------------------------
def paged_attention_reference(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, block_tables: np.ndarray,
                              cu_seqlens: np.ndarray, positions: np.ndarray, *, block_size: int, scale: float,
                              kv_dtype: str = "f32", sliding_window: int = 0, softcap: float = 0.0,
                              sinks: np.ndarray | None = None) -> np.ndarray:
    """Plain float64 paged causal attention (sliding_window W > 0: query p sees keys p - W + 1..p; softcap
    > 0: each score cap * tanh(score / cap) before the softmax; sinks [n_heads]: head h's logit z in the
    softmax, no key and no value -- out = sum_j exp(s_j - m) v_j / (sum_j exp(s_j - m) + exp(z - m)),
    m = max(max_j s_j, z), as llama.cpp's soft_max_ext).

    q: [N, n_heads, head_dim]; k_cache, v_cache: one layer's caches in their stored form for `kv_dtype`
    (see sharpinf.ops.kv_cache), [slots, n_kv_heads, ...]; returns float64 [N, n_heads, head_dim].
    """
    q = np.asarray(q, dtype=np.float64)
    K = decode_kv(kv_dtype, k_cache).astype(np.float64)  # [slots, n_kv_heads, head_dim]
    V = decode_kv(kv_dtype, v_cache).astype(np.float64)
    N, n_heads, head_dim = q.shape
    group = n_heads // K.shape[1]
    out = np.zeros((N, n_heads, head_dim), np.float64)
    cu = np.asarray(cu_seqlens)
    for s in range(len(cu) - 1):
        for t in range(int(cu[s]), int(cu[s + 1])):
            p = int(positions[t])
            j = np.arange(max(0, p - sliding_window + 1) if sliding_window > 0 else 0, p + 1)
            slots = np.asarray(block_tables)[s, j // block_size].astype(np.int64) * block_size + j % block_size
            for h in range(n_heads):
                k = K[slots, h // group]  # [p+1, head_dim]
                v = V[slots, h // group]
                sc = (k @ q[t, h]) * scale
                if softcap:  # gemma2: each score capped before the softmax
                    sc = softcap * np.tanh(sc / softcap)
                z = -np.inf if sinks is None else float(sinks[h])  # none: -inf, the same max and sum
                m = max(sc.max(), z)
                w = np.exp(sc - m)
                out[t, h] = (w / (w.sum() + np.exp(z - m))) @ v
    return out
