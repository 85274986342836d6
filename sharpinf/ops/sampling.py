"""Sampling, the one rule of every backend: the device kernel's launchers (kernels_cu/sampling.cu) and its draw.

`sample` picks one token for each of R rows of logits on the device; only the ids come
back. Its NumPy twin, `sample_reference` (ops/sampling_reference.py), applies the same rule
with the same counter-based uniform (`uniforms` here, the kernel's sample_uniform), so a seed
gives the same tokens on reference, emu and cuda. `RequestSeeds` gives a request without a
seed the same one on every backend.

The rule (see the kernel's header): allowed-token mask (-inf), logit_bias, repetition penalty,
presence/frequency over the generated counts (vLLM's order); temperature 0 =
greedy argmax (ties to the lowest id); else weights w = exp((z - max z) / T), tokens ranked
by z descending (ties by lowest id), kept = top-k prefix & top-p prefix (a token stays iff
the mass ranked before it is < top_p * total) & min-p (w >= min_p); the chosen token is the
first kept token in ascending id order whose running kept mass exceeds u * kept total -- every
mass a sum of floor(w * 2^40), so any order of summing (one block, many blocks) agrees.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from sharpinf.ops.launch import kernel
from sharpinf.params import MAX_LOGIT_BIAS, SamplingParams

I32, F32, U64 = np.int32, np.float32, np.uint64
BLOCK = 256
N_PARAMS = 6  # temperature, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty
COUNT_MAX = 0xFFFF  # generated counts are u16 on the device, saturating
BIAS_STRIDE = 1 + 2 * MAX_LOGIT_BIAS  # int32 per slot of slot_bias: [n, ids..., float bits of biases...]

_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_A, _B, _C = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xD1B54A32D192ED03), np.uint64(0x632BE59BD9B4E019)


# -- counter-based uniform ------------------------------------------------------------------
def _mix64(z: np.ndarray) -> np.ndarray:
    z = z ^ (z >> np.uint64(30))
    z = z * _M1
    z = z ^ (z >> np.uint64(27))
    z = z * _M2
    return z ^ (z >> np.uint64(31))


def uniforms(seed: int, steps) -> np.ndarray:
    """float32 uniforms in [0, 1) for one seed and an array of steps (the kernel's sample_uniform)."""
    steps = np.atleast_1d(np.asarray(steps, dtype=np.int64))
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps, as in C
        h = _mix64(np.array([seed], dtype=U64) ^ _A)
        h = _mix64(h + (steps.astype(np.uint32).astype(U64) * _B) + _C)
    return (h >> np.uint64(40)).astype(F32) * F32(1.0 / 16777216.0)  # 24 bits: exact in float32


def uniform_u24(seed: int, step: int) -> int:
    """The kernel's 24-bit draw for (seed, step): uniform(seed, step) * 2^24, an int."""
    return int(uniforms(seed, [step])[0] * F32(16777216.0))


def uniform(seed: int, step: int) -> float:
    """The kernel's u for (seed, step): a float32 value in [0, 1), returned as a Python float."""
    return float(uniforms(seed, [step])[0])


def choice_seed(seed: int, index: int) -> int:
    """The seed of choice `index` of a request with n > 1 choices: choice 0 keeps the request's
    seed, the others a hash of (seed, index) in [0, 2**63) -- so each is reproducible alone, as a
    request of n = 1 with this seed."""
    if index == 0:
        return int(seed)
    with np.errstate(over="ignore"):
        h = _mix64(_mix64(np.array([seed], dtype=U64) ^ _C) + np.uint64(index) * _B)
    return int(h[0] >> np.uint64(1))


class RequestSeeds:
    """The seed a request samples with: its own, else the next draw of a generator seeded once
    with `base` (EngineConfig.seed), so the n-th seedless request gets the same seed anywhere."""

    def __init__(self, base: int):
        self._rng = np.random.default_rng(base)

    def seed_for(self, params: SamplingParams) -> int:
        return params.seed if params.seed is not None else int(self._rng.integers(0, 2**63))


# -- launchers ----------------------------------------------------------------------------
def pack_params(params_list: Sequence[SamplingParams]) -> tuple[np.ndarray, np.ndarray]:
    """([R, 6] float32 temperature/top_p/min_p/repetition/presence/frequency, [R] int32 top_k)."""
    p = np.zeros((len(params_list), N_PARAMS), F32)
    for r, sp in enumerate(params_list):
        p[r] = param_row(sp)
    k = np.array([min(sp.top_k, 2**31 - 1) for sp in params_list], I32)
    return p, k


def param_row(sp: SamplingParams) -> tuple[float, ...]:
    """The kernel's params row of one request."""
    return (sp.temperature, sp.top_p, sp.min_p, sp.repetition_penalty, sp.presence_penalty, sp.frequency_penalty)


def needs_slot(sp: SamplingParams) -> bool:
    """A request holds a device history slot while it runs iff something reads it: the repetition
    penalty (seen ids), presence/frequency (generated counts) or its logit_bias."""
    return sp.repetition_penalty != 1.0 or sp.presence_penalty != 0.0 or sp.frequency_penalty != 0.0 or bool(sp.logit_bias)


def history_words(vocab: int) -> int:
    """uint32 words of one history slot: a bit per token id (also one row of an allowed-token mask)."""
    return (vocab + 31) // 32


def count_words(vocab: int) -> int:
    """uint32 words of one slot's generated counts: two u16 counts a word."""
    return (vocab + 1) // 2


def bias_row(sp: SamplingParams) -> np.ndarray:
    """One slot_bias row: [n, ids (MAX_LOGIT_BIAS), float32 bits of the biases (MAX_LOGIT_BIAS)]."""
    row = np.zeros(BIAS_STRIDE, I32)
    n = len(sp.logit_bias)
    row[0] = n
    if n:
        row[1 : 1 + n] = [i for i, _ in sp.logit_bias]
        row[1 + MAX_LOGIT_BIAS : 1 + MAX_LOGIT_BIAS + n] = np.array([b for _, b in sp.logit_bias], F32).view(I32)
    return row


def sample_rows(be, logits, R: int, vocab: int, params, top_k, seeds, steps, seen_bits, slots, clear, add_off,
                add_ids, counts, count_n, slot_bias, mask_idx, masks, out, scratch, acc=None, block: int = BLOCK,
                file: str = "sampling.cu") -> None:
    """The launch over device arrays (the forward pass's step plan uses this one): params f32 [R, 6],
    top_k i32 [R], seeds u64 [R], steps i32 [R], seen_bits u32 [slots, words], slots/clear i32 [R],
    add_off i32 [R+1], add_ids i32 [*], counts u32 [slots, count_words], count_n i32 [R],
    slot_bias i32 [slots, BIAS_STRIDE], mask_idx i32 [R], masks u32 [*, words], out i32 [R],
    scratch f32 [R, 2 * vocab]. Each chosen id is also set (and counted) in its row's slot, so the next
    step's history holds it without the host sending it. One block a row (acc is sample_rows_radix's)."""
    if block % 32 or not 32 <= block <= 1024:
        raise ValueError(f"sample: block must be a multiple of 32 in [32, 1024], got {block}")
    be.launch(kernel(be, file, "sample_rows"), R, block,
              (logits, I32(vocab), params, top_k, seeds, steps, seen_bits, I32(history_words(vocab)), slots, clear,
               add_off, add_ids, counts, I32(count_words(vocab)), count_n, slot_bias, I32(BIAS_STRIDE), mask_idx,
               masks, out, scratch),
              io=(R * vocab * 4 + R * 52, R * 4))


# sampling_radix.cu: the same rule, each row over segments of RADIX_SEG ids (one block each)
RADIX_SEG, RADIX_THREADS = 4096, 256
_RADIX_ACC_SEG = 8 + 4 * 4 * 256  # the kernel's ACC_SEG: greedy, Q, allowed, 4 passes' histograms


def radix_segments(vocab: int) -> int:
    return max(1, -(-vocab // RADIX_SEG))


def radix_acc_words(vocab: int) -> int:
    """u32 words of one row's accumulators in sample_rows_radix (the kernel's acc layout), even."""
    n = _RADIX_ACC_SEG + 3 * radix_segments(vocab)
    return n + (n & 1)


def sample_acc(be, R: int, vocab: int):
    """The accumulators sample_rows_radix needs for R rows (u32 [R, radix_acc_words])."""
    return be.empty((max(1, R), radix_acc_words(vocab)), np.uint32)


def radix_scratch(be, cfg, cap) -> dict:
    """The registry's scratch of sample=radix: each row's counts, masses and histograms."""
    return {"sample_acc": sample_acc(be, cap.rows, cfg.n_vocab)}


def sample_rows_radix(be, logits, R: int, vocab: int, params, top_k, seeds, steps, seen_bits, slots, clear, add_off,
                      add_ids, counts, count_n, slot_bias, mask_idx, masks, out, scratch, acc=None,
                      block: int = RADIX_THREADS, file: str = "sampling_radix.cu") -> None:
    """sample_rows' arguments and result, each row split over radix_segments(vocab) blocks in seven
    launches (sampling_radix.cu's header); acc: sample_acc(be, R, vocab) (allocated when None)."""
    if block != RADIX_THREADS:
        raise ValueError(f"sample radix: its block is {RADIX_THREADS} threads (a histogram bin a thread), got {block}")
    if R <= 0:
        return
    acc = sample_acc(be, R, vocab) if acc is None else acc
    S = radix_segments(vocab)
    args = (logits, I32(vocab), params, top_k, seeds, steps, seen_bits, I32(history_words(vocab)), slots, clear,
            add_off, add_ids, counts, I32(count_words(vocab)), count_n, slot_bias, I32(BIAS_STRIDE), mask_idx,
            masks, out, scratch, acc, I32(radix_acc_words(vocab)))
    k = lambda name: kernel(be, file, name)  # noqa: E731
    be.launch(k("sample_radix_init"), (1, R), RADIX_THREADS, args)
    be.launch(k("sample_radix_z"), (S, R), RADIX_THREADS, args, io=(R * vocab * 4, R * vocab * 4))
    be.launch(k("sample_radix_w"), (S, R), RADIX_THREADS, args, io=(R * vocab * 4, R * vocab * 4))
    for p in (1, 2, 3):
        be.launch(k("sample_radix_pass"), (S, R), RADIX_THREADS, args + (I32(p),))
    be.launch(k("sample_radix_keep"), (S, R), RADIX_THREADS, args, io=(R * vocab * 8, 0))
    be.launch(k("sample_radix_pick"), (1, R), RADIX_THREADS, args, io=(R * RADIX_SEG * 8, R * 4))


def seen_update(be, R: int, vocab: int, seen_bits, slots, clear, add_off, add_ids, counts, count_n,
                block: int = 128) -> None:
    """Only step 0 of sample_rows: bring R rows' history slots (bits and counts) up to date."""
    be.launch(kernel(be, "sampling.cu", "seen_update"), R, block,
              (seen_bits, I32(history_words(vocab)), slots, clear, add_off, add_ids, counts, I32(count_words(vocab)),
               count_n, I32(vocab)))


def history_arrays(with_slot: Sequence[bool], seen: Sequence[Sequence[int]],
                   generated: Sequence[Sequence[int]] | None = None) -> tuple[np.ndarray, ...]:
    """(slots, clear, add_off, add_ids, count_n) that give row r a fresh slot r holding seen[r]
    (its history bits) followed by generated[r] (also counted) when with_slot[r] (else no
    history); add_ids has at least one entry."""
    R = len(seen)
    generated = generated if generated is not None else [()] * R
    slots = np.array([r if p else -1 for r, p in enumerate(with_slot)], I32)
    lists, count_n = [], np.zeros(R, I32)
    for r, (p, s, g) in enumerate(zip(with_slot, seen, generated)):
        if p:
            lists.append(np.concatenate([np.asarray(s, np.int64), np.asarray(g, np.int64)]).clip(-1, 2**31 - 1))
            count_n[r] = len(g)
        else:
            lists.append(np.zeros(0, np.int64))
    add_off = np.concatenate([[0], np.cumsum([len(a) for a in lists])]).astype(I32)
    add_ids = np.concatenate(lists + [np.full(1, -1)]).astype(I32)
    return slots, np.ones(R, I32), add_off, add_ids, count_n


def mask_arrays(masks: Sequence[np.ndarray | None] | None, R: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """(mask_idx i32 [R], packed masks u32 [max(1, M), words]) from per-row masks (None: no mask)."""
    words = history_words(vocab)
    masks = masks if masks is not None else [None] * R
    idx = np.full(R, -1, I32)
    rows = []
    for r, m in enumerate(masks):
        if m is not None:
            m = np.asarray(m).view(np.uint32).reshape(-1)
            if m.size != words:
                raise ValueError(f"sample: row {r}'s mask has {m.size} words, the vocab needs {words}")
            idx[r] = len(rows)
            rows.append(m)
    packed = np.stack(rows) if rows else np.zeros((1, words), np.uint32)
    return idx, packed


def sample(be, logits_dev, R: int, vocab: int, params_list: Sequence[SamplingParams], seeds: Sequence[int],
           steps: Sequence[int], seen: Sequence[Sequence[int]], out_dev, scratch_dev=None, block: int = BLOCK,
           generated: Sequence[Sequence[int]] | None = None, masks: Sequence[np.ndarray | None] | None = None,
           kernels: str | None = None):
    """Sample one token per row of logits_dev (float32 [R, vocab]) into out_dev (int32 [R]).

    seeds: one int in [0, 2**63) per row (RequestSeeds: the engine assigns one to seedless requests);
    steps: tokens each request has generated so far; seen: per row, the ids the repetition
    penalty applies to (prompt + generated); generated: per row, the ids presence/frequency
    count (default none); masks: per row None or the allowed-token bits (u32 [words]).
    scratch_dev: float32 [R, 2*vocab], allocated when None; kernels: the sample variant's name (None:
    the baseline; `sharpinf kernels list`). Returns out_dev. A one-off call: each
    row that needs a slot gets a fresh one from its lists (the engine's step plan keeps slots on
    the device across steps instead).
    """
    if not (len(params_list) == len(seeds) == len(steps) == len(seen) == R):
        raise ValueError(f"sample: {R} rows but {len(params_list)} params, {len(seeds)} seeds, "
                         f"{len(steps)} steps, {len(seen)} seen lists")
    if any(s is None for s in seeds):
        raise ValueError("sample: every row needs a seed (assign one at submission)")
    p, k = pack_params(params_list)
    slots, clear, add_off, add_ids, count_n = history_arrays([needs_slot(sp) for sp in params_list], seen, generated)
    mask_idx, packed = mask_arrays(masks, R, vocab)
    if scratch_dev is None:
        scratch_dev = be.empty((R, 2 * vocab), F32)
    n = max(1, R)
    bits = be.empty((n, history_words(vocab)), np.uint32)  # cleared by the kernel (clear = 1)
    counts = be.empty((n, count_words(vocab)), np.uint32)
    bias = np.zeros((n, BIAS_STRIDE), I32)
    for r, sp in enumerate(params_list):
        bias[r] = bias_row(sp)
    from sharpinf.ops.variants import baseline, variant  # (the registry imports this module)

    (baseline("sample") if kernels is None else variant("sample", kernels)).launch(
        be, logits_dev, R, vocab, be.upload(p), be.upload(k), be.upload(np.array([int(s) for s in seeds], U64)),
        be.upload(np.asarray(steps, I32)), bits, be.upload(slots), be.upload(clear), be.upload(add_off),
        be.upload(add_ids), counts, be.upload(count_n), be.upload(bias), be.upload(mask_idx), be.upload(packed),
        out_dev, scratch_dev, **({} if block == BLOCK else {"block": block}))
    return out_dev
