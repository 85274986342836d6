"""Sampling, the one rule of every backend: the device kernel (kernels_cu/sampling.cu) and its NumPy twin.

`sample` picks one token for each of R rows of logits on the device; only the ids come
back. `sample_reference` applies the kernel's exact rule in NumPy (masses in the same 40-bit
fixed point, exact integer sums), with the same counter-based uniform: the kernel's choice is
checked against it token for token (up to expf's rounding when a cut lands within an ulp),
and the reference backend samples with it, so a seed gives the same tokens on reference, emu
and cuda. `RequestSeeds` gives a request without a seed the same one on every backend.

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


# -- NumPy reference ------------------------------------------------------------------------
def apply_repetition_penalty(logits: np.ndarray, seen: list[int], penalty: float) -> np.ndarray:
    """llama.cpp/CTRL rule: divide positive logits of seen tokens by the penalty, multiply negative ones."""
    if penalty == 1.0 or not seen:
        return logits
    out = logits.copy()
    ids = np.unique(np.asarray(seen, dtype=np.int64))
    vals = out[ids]
    out[ids] = np.where(vals > 0, vals / np.float32(penalty), vals * np.float32(penalty))
    return out


def apply_mask(z: np.ndarray, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """(z with -inf where mask disallows, the bool allowed [V]) -- or (z, None) without a mask."""
    if mask is None:
        return z, None
    V = z.size
    bits = np.unpackbits(np.asarray(mask).view(np.uint32).reshape(-1).view(np.uint8), bitorder="little")[:V]
    allowed = bits.astype(bool)  # little-endian words: byte 0 holds ids 0..7, bit i = id i
    return np.where(allowed, z, F32(-np.inf)).astype(F32), allowed


def apply_logit_bias(z: np.ndarray, bias) -> np.ndarray:
    """z[id] += bias (float32) for each (id, bias) in range."""
    if not bias:
        return z
    z = z.copy()
    for i, b in bias:
        if 0 <= i < z.size:
            z[i] = F32(z[i] + F32(b))
    return z


def generated_counts(generated: Sequence[int], V: int) -> np.ndarray:
    """int64 [V]: each id's count over the generated ids, saturating at COUNT_MAX as on the device."""
    g = np.asarray([int(i) for i in generated if 0 <= int(i) < V], np.int64)
    return np.minimum(np.bincount(g, minlength=V), COUNT_MAX)


def apply_presence_frequency(z: np.ndarray, counts: np.ndarray, presence: float, frequency: float) -> np.ndarray:
    """OpenAI's rule, rounded as the kernel: where c > 0, z = (z - c * frequency) - presence in float32."""
    if presence == 0.0 and frequency == 0.0:
        return z
    c = counts.astype(F32)
    with np.errstate(invalid="ignore", over="ignore"):
        pen = (z - c * F32(frequency)) - F32(presence)
    return np.where(counts > 0, pen, z).astype(F32)


def sort_key(z: np.ndarray) -> np.ndarray:
    """The kernel's order-preserving uint32 key of float32 values (-0 counts as +0)."""
    b = np.asarray(z, F32).view(np.uint32).copy()
    b[b == 0x80000000] = 0
    neg = (b & np.uint32(0x80000000)) != 0
    return np.where(neg, ~b, b | np.uint32(0x80000000)).astype(np.uint32)


Q_SCALE = 2**40  # weights in 40-bit fixed point: masses are exact integer sums (the kernel's rule 3)


def weights(z: np.ndarray, zmax, temperature: float) -> np.ndarray:
    """float32 w = exp((z - zmax) / T): the kernel's expression, (z - zmax) / T rounded in float32,
    then exp correctly rounded to float32 (CUDA's expf is within 2 ulp of it)."""
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        d = (np.asarray(z, F32) - F32(zmax)) / F32(temperature)
        return np.exp(d.astype(np.float64)).astype(F32)


def fixed_point(w: np.ndarray) -> np.ndarray:
    """uint64 floor(w * 2^40) of float32 weights in [0, 1] (exact: a float32 has 24 bits)."""
    return np.floor(np.asarray(w, np.float64) * Q_SCALE).astype(np.uint64)


def top_p_target(top_p, total: int) -> int:
    """top-p's threshold on the mass ranked before a token: max(1, trunc(top_p * Q)) in double."""
    return max(1, int(float(total) * float(F32(top_p))))


def pick_target(u24: int, kept: int) -> int:
    """floor(u24 * K / 2^24), as the kernel computes it without a 128-bit product."""
    return (kept >> 24) * u24 + (((kept & 0xFFFFFF) * u24) >> 24)


def sample_reference_detail(logits: np.ndarray, params: SamplingParams, seed: int, step: int,
                            seen: Sequence[int] = (), generated: Sequence[int] = (),
                            mask: np.ndarray | None = None) -> tuple[int, float]:
    """(token, margin): margin is the smallest relative distance of any float decision the
    kernel takes (top-p cut, min-p cut, the final u * total crossing) to its threshold; where
    it is below ~1e-5 the kernel's float32 rounding may legitimately choose differently."""
    z = np.asarray(logits, F32).reshape(-1)
    V = z.size
    if V == 0:
        return -1, np.inf
    z, allowed = apply_mask(z, mask)
    if allowed is not None and not allowed.any():
        return -1, np.inf
    z = apply_logit_bias(z, params.logit_bias)
    ids = [int(i) for i in seen if 0 <= int(i) < V]
    z = apply_repetition_penalty(z, ids, params.repetition_penalty).astype(F32)
    z = apply_presence_frequency(z, generated_counts(generated, V), params.presence_penalty, params.frequency_penalty)
    if allowed is None:
        greedy = int(np.argmax(z))  # ties (and NaN) to the lowest id
    else:  # a disallowed id is never chosen, even when every allowed one is -inf
        ok = np.flatnonzero(allowed)
        greedy = int(ok[np.argmax(z[ok])])
    if params.temperature == 0.0:
        return greedy, np.inf
    zmax = z[greedy]  # the row maximum (NaN if any), as the kernel takes it
    if not np.isfinite(zmax):
        return greedy, np.inf
    w = weights(z, zmax, params.temperature)
    q = fixed_point(w)
    Q = int(q.sum(dtype=np.uint64))
    margin = np.inf
    order = np.argsort(~sort_key(z), kind="stable")  # z descending, ties by lowest id
    qs = q[order]  # uint64 sums are exact: vocab * 2^40 < 2^64
    # Margins only count decisions that matter: a cut inside positions another filter removes
    # anyway cannot change the choice. A weight the device's expf rounds the other way moves a
    # mass by ~2^-23 of that weight: a decision closer than that to its threshold may differ.
    keep = np.ones(V, bool)
    if 0 < params.top_k < V:
        keep[params.top_k:] = False
    top_p = F32(params.top_p)
    if top_p < 1:
        P = top_p_target(top_p, Q)
        before = np.concatenate([np.zeros(1, np.uint64), np.cumsum(qs, dtype=np.uint64)[:-1]])
        relevant = keep.copy()
        relevant[0] = False  # the first-ranked token always stays: no decision to round
        if relevant.any():
            margin = min(margin, float(np.abs(before[relevant].astype(np.float64) - float(P)).min()) / Q)
        keep &= before < np.uint64(P)
    min_p = F32(params.min_p)
    if min_p > 0:
        ws = w[order]
        relevant = keep & (z[order] != zmax)  # weight exactly 1 on both sides: no rounding
        if relevant.any():
            margin = min(margin, float(np.abs(ws[relevant].astype(np.float64) - np.float64(min_p)).min()) / min_p)
        keep &= ws >= min_p
    kept = np.zeros(V, bool)
    kept[order[keep]] = True
    c = np.cumsum(np.where(kept, q, np.uint64(0)), dtype=np.uint64)
    K = int(c[-1])
    if K == 0:  # nothing kept (min_p > 1)
        return greedy, np.inf
    target = pick_target(uniform_u24(seed, step), K)
    i = int(np.searchsorted(c, np.uint64(target), side="right"))  # the first c > target (< V: target < K)
    lo = int(c[i - 1]) if i > 0 else 0
    margin = min(margin, (target - lo) / K, (int(c[i]) - target) / K)
    return i, float(margin)


def sample_reference(logits: np.ndarray, params: SamplingParams, seed: int, step: int,
                     seen: Sequence[int] = (), generated: Sequence[int] = (), mask: np.ndarray | None = None) -> int:
    """The token the kernel picks for one row, by the same rule and the same uniform: step is the
    number of tokens the request has generated, seen its prompt + generated ids (as the engine's),
    generated the ids presence/frequency count, mask the allowed-token bits (-1: none allowed)."""
    return sample_reference_detail(logits, params, seed, step, seen, generated, mask)[0]
