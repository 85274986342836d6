"""Sampling, the one rule of every backend: the device kernel (kernels_cu/sampling.cu) and its NumPy twin.

`sample` picks one token for each of R rows of logits on the device; only the ids come
back. `sample_reference` applies the kernel's exact rule in NumPy (float64 masses), with
the same counter-based uniform `uniform(seed, step)`: the kernel's choice is checked against
it token for token (up to float rounding when a running mass lands within ~1e-6 of a cut),
and the reference backend samples with it, so a seed gives the same tokens on reference, emu
and cuda. `RequestSeeds` gives a request without a seed the same one on every backend.

The rule (see the kernel's header): repetition penalty on the raw logits; temperature 0 =
greedy argmax (ties to the lowest id); else weights w = exp((z - max z) / T), tokens ranked
by z descending (ties by lowest id), kept = top-k prefix & top-p prefix (a token stays iff
the mass ranked before it is < top_p * total) & min-p (w >= min_p); the chosen token is the
first kept token in ascending id order whose running kept mass exceeds u * kept total.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from sharpinf.ops.launch import kernel
from sharpinf.sampling import SamplingParams

I32, F32, U64 = np.int32, np.float32, np.uint64
BLOCK = 256
N_PARAMS = 5  # temperature, top_p, min_p, repetition_penalty, unused

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


def uniform(seed: int, step: int) -> float:
    """The kernel's u for (seed, step): a float32 value in [0, 1), returned as a Python float."""
    return float(uniforms(seed, [step])[0])


class RequestSeeds:
    """The seed a request samples with: its own, else the next draw of a generator seeded once
    with `base` (EngineConfig.seed), so the n-th seedless request gets the same seed anywhere."""

    def __init__(self, base: int):
        self._rng = np.random.default_rng(base)

    def seed_for(self, params: SamplingParams) -> int:
        return params.seed if params.seed is not None else int(self._rng.integers(0, 2**63))


# -- launchers ----------------------------------------------------------------------------
def pack_params(params_list: Sequence[SamplingParams]) -> tuple[np.ndarray, np.ndarray]:
    """([R, 5] float32 temperature/top_p/min_p/repetition_penalty/0, [R] int32 top_k)."""
    p = np.zeros((len(params_list), N_PARAMS), F32)
    for r, sp in enumerate(params_list):
        p[r, :4] = (sp.temperature, sp.top_p, sp.min_p, sp.repetition_penalty)
    k = np.array([min(sp.top_k, 2**31 - 1) for sp in params_list], I32)
    return p, k


def history_words(vocab: int) -> int:
    """uint32 words of one history slot: a bit per token id."""
    return (vocab + 31) // 32


def sample_rows(be, logits, R: int, vocab: int, params, top_k, seeds, steps, seen_bits, slots, clear, add_off,
                add_ids, out, scratch, block: int = BLOCK) -> None:
    """The launch over device arrays (the forward pass's step plan uses this one): params f32 [R, 5],
    top_k i32 [R], seeds u64 [R], steps i32 [R], seen_bits u32 [slots, words], slots/clear i32 [R],
    add_off i32 [R+1], add_ids i32 [*], out i32 [R], scratch f32 [R, 2 * vocab]. Each chosen id is also
    set in its row's history slot (so the next step's history holds it without the host sending it)."""
    if block % 32 or not 32 <= block <= 1024:
        raise ValueError(f"sample: block must be a multiple of 32 in [32, 1024], got {block}")
    be.launch(kernel(be, "sampling.cu", "sample_rows"), R, block,
              (logits, I32(vocab), params, top_k, seeds, steps, seen_bits, I32(history_words(vocab)), slots, clear,
               add_off, add_ids, out, scratch),
              io=(R * vocab * 4 + R * 40, R * 4))


def seen_update(be, R: int, vocab: int, seen_bits, slots, clear, add_off, add_ids, block: int = 128) -> None:
    """Only step 0 of sample_rows: bring R rows' history slots up to date."""
    be.launch(kernel(be, "sampling.cu", "seen_update"), R, block,
              (seen_bits, I32(history_words(vocab)), slots, clear, add_off, add_ids, I32(vocab)))


def history_arrays(penalised: Sequence[bool], seen: Sequence[Sequence[int]]) -> tuple[np.ndarray, ...]:
    """(slots, clear, add_off, add_ids) that give row r a fresh slot r holding seen[r] when
    penalised[r] (else no history); add_ids has at least one entry."""
    R = len(seen)
    slots = np.array([r if p else -1 for r, p in enumerate(penalised)], I32)
    lists = [np.asarray(s, dtype=np.int64).clip(-1, 2**31 - 1) if p else np.zeros(0, np.int64)
             for p, s in zip(penalised, seen)]
    add_off = np.concatenate([[0], np.cumsum([len(a) for a in lists])]).astype(I32)
    add_ids = np.concatenate(lists + [np.full(1, -1)]).astype(I32)
    return slots, np.ones(R, I32), add_off, add_ids


def sample(be, logits_dev, R: int, vocab: int, params_list: Sequence[SamplingParams], seeds: Sequence[int],
           steps: Sequence[int], seen: Sequence[Sequence[int]], out_dev, scratch_dev=None, block: int = BLOCK):
    """Sample one token per row of logits_dev (float32 [R, vocab]) into out_dev (int32 [R]).

    seeds: one int in [0, 2**63) per row (RequestSeeds: the engine assigns one to seedless requests);
    steps: tokens each request has generated so far; seen: per row, the ids the repetition
    penalty applies to (prompt + generated). scratch_dev: float32 [R, 2*vocab], allocated when
    None. Returns out_dev. A one-off call: each penalised row gets a fresh history slot from
    its `seen` list (the engine's step plan keeps slots on the device across steps instead).
    """
    if not (len(params_list) == len(seeds) == len(steps) == len(seen) == R):
        raise ValueError(f"sample: {R} rows but {len(params_list)} params, {len(seeds)} seeds, "
                         f"{len(steps)} steps, {len(seen)} seen lists")
    if any(s is None for s in seeds):
        raise ValueError("sample: every row needs a seed (assign one at submission)")
    p, k = pack_params(params_list)
    slots, clear, add_off, add_ids = history_arrays([sp.repetition_penalty != 1.0 for sp in params_list], seen)
    if scratch_dev is None:
        scratch_dev = be.empty((R, 2 * vocab), F32)
    bits = be.empty((max(1, R), history_words(vocab)), np.uint32)  # cleared by the kernel (clear = 1)
    sample_rows(be, logits_dev, R, vocab, be.upload(p), be.upload(k), be.upload(np.array([int(s) for s in seeds], U64)),
                be.upload(np.asarray(steps, I32)), bits, be.upload(slots), be.upload(clear), be.upload(add_off),
                be.upload(add_ids), out_dev, scratch_dev, block)
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


def sort_key(z: np.ndarray) -> np.ndarray:
    """The kernel's order-preserving uint32 key of float32 values (-0 counts as +0)."""
    b = np.asarray(z, F32).view(np.uint32).copy()
    b[b == 0x80000000] = 0
    neg = (b & np.uint32(0x80000000)) != 0
    return np.where(neg, ~b, b | np.uint32(0x80000000)).astype(np.uint32)


def sample_reference_detail(logits: np.ndarray, params: SamplingParams, seed: int, step: int,
                            seen: Sequence[int] = ()) -> tuple[int, float]:
    """(token, margin): margin is the smallest relative distance of any float decision the
    kernel takes (top-p cut, min-p cut, the final u * total crossing) to its threshold; where
    it is below ~1e-5 the kernel's float32 rounding may legitimately choose differently."""
    z = np.asarray(logits, F32).reshape(-1)
    V = z.size
    if V == 0:
        return -1, np.inf
    ids = [int(i) for i in seen if 0 <= int(i) < V]
    z = apply_repetition_penalty(z, ids, params.repetition_penalty).astype(F32)
    greedy = int(np.argmax(z))  # ties (and NaN) to the lowest id
    if params.temperature == 0.0:
        return greedy, np.inf
    m = np.float64(z.max())
    with np.errstate(invalid="ignore", over="ignore"):
        w = np.exp((z.astype(np.float64) - m) / np.float64(F32(params.temperature)))
    S = w.sum()
    if not (S > 0) or not np.isfinite(m):
        return greedy, np.inf
    margin = np.inf
    order = np.argsort(~sort_key(z), kind="stable")  # z descending, ties by lowest id
    ws = w[order]
    # Margins only count decisions that matter: a cut inside positions another filter removes
    # anyway cannot change the choice.
    keep = np.ones(V, bool)
    if 0 < params.top_k < V:
        keep[params.top_k:] = False
    top_p = F32(params.top_p)
    if top_p < 1:
        P = np.float64(top_p) * S
        before = np.concatenate([[0.0], np.cumsum(ws)[:-1]])
        relevant = keep.copy()
        relevant[0] = False  # the first-ranked token always stays: no decision to round
        if relevant.any():
            margin = min(margin, np.abs(before[relevant] - P).min() / S)
        keep &= before < P
    min_p = F32(params.min_p)
    if min_p > 0:
        relevant = keep & (z[order] != z.max())  # weight exactly 1 on both sides: no rounding
        if relevant.any():
            margin = min(margin, np.abs(ws[relevant] - np.float64(min_p)).min() / min_p)
        keep &= ws >= min_p
    kept = np.zeros(V, bool)
    kept[order[keep]] = True
    c = np.cumsum(np.where(kept, w, 0.0))
    total = c[-1]
    target = np.float64(uniform(seed, step)) * total
    i = int(np.searchsorted(c, target, side="right"))  # first c > target
    if i >= V:
        i = int(np.flatnonzero(kept & (w > 0))[-1])
    lo = c[i - 1] if i > 0 else 0.0
    margin = min(margin, (target - lo) / total, (c[i] - target) / total)
    return i, float(margin)


def sample_reference(logits: np.ndarray, params: SamplingParams, seed: int, step: int,
                     seen: Sequence[int] = ()) -> int:
    """The token the kernel picks for one row, by the same rule and the same uniform: step is the
    number of tokens the request has generated, seen its prompt + generated ids (as the engine's)."""
    return sample_reference_detail(logits, params, seed, step, seen)[0]
