"""Varlen paged causal attention, every registered variant, against its NumPy reference,
on every backend (emu everywhere, cuda on a GPU).

Attention batches are drawn by hypothesis: 1..8 sequences, each a cached prefix (0..70 keys)
plus a chunk of 1..20 query tokens, block tables in shuffled non-contiguous order, every slot
no sequence uses NaN-poisoned (as are the table entries past a sequence's last block), so any
illegal read shows up as NaN. Beyond the reference comparison, the outputs must be
bit-identical whatever else is packed in the batch and whichever physical blocks hold the keys.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oracles.tolerances import FLASH_ATTENTION_VS_REFERENCE
from sharpinf.model.rope_scaling import RopeTable
from sharpinf.ops import attention as attn_ops
from sharpinf.ops import kv_cache as kv_ops
from sharpinf.ops import rope as rope_ops
from sharpinf.ops.variants import variant as _registered
from sharpinf.ops.variants import variants_of
from asserts import assert_close, assert_same
from test_kernels_kv_cache import KV_DTYPES, _poison, _rng


def variant_of(name: str):
    return _registered("attention", name)


BASELINE = variants_of("attention")[0]


def tensor_cores(name: str) -> bool:
    """f16 operands (flash's tolerance): the variant's declared rounding (a copy of flash keeps it)."""
    return variant_of(name).rounding == "f16_operands"


# float32 accumulation vs a float64 reference over the same stored K/V values: the error is
# float rounding in q.k (head_dim terms), the softmax and the weighted sum. Measured <= 2.6e-7 * max|V|
# on the emulator for every dtype (the K/V rounding is in both sides); the tolerance leaves 10x.
TOL = {"f32": 3e-6, "f16": 3e-6, "bf16": 3e-6, "q8_0": 3e-6}  # atol, relative to max |V|
# flash multiplies f16 operands (Q, P; K and V of f32 / q8_0 caches): oracles/tolerances.py
FLASH_TOL = FLASH_ATTENTION_VS_REFERENCE


class Case:
    """A packed batch over a paged cache, with everything on the host."""

    def __init__(self, seed, kv_dtype, prefixes, chunks, block_size, group, n_kv_heads, head_dim, sliding_window=0,
                 softcap=0.0, sinks=None):
        self.softcap = softcap  # gemma2: scores cap * tanh(score / cap) before the softmax
        rng = np.random.default_rng(seed)
        self.sliding_window = sliding_window  # 0: causal; W > 0: a query at p sees keys p - W + 1 .. p
        self.kv_dtype, self.block_size, self.head_dim = kv_dtype, block_size, head_dim
        self.n_kv_heads, self.n_heads = n_kv_heads, n_kv_heads * group
        self.prefixes, self.chunks = list(prefixes), list(chunks)
        S = len(prefixes)
        lens = [p + c for p, c in zip(prefixes, chunks)]
        nblk = [-(-L // block_size) for L in lens]
        self.max_blocks = max(nblk) + 1  # one spare entry per row: never to be read
        spare = 3
        self.num_blocks = sum(nblk) + spare
        ids = rng.permutation(self.num_blocks)
        self.tables = np.empty((S, self.max_blocks), np.int32)
        at = 0
        for s in range(S):
            self.tables[s, :nblk[s]] = ids[at:at + nblk[s]]
            at += nblk[s]
            self.tables[s, nblk[s]:] = ids[sum(nblk) + s % spare]  # a poisoned, unused block
        shape, dt = kv_ops.kv_cache_shape(kv_dtype, self.num_blocks, block_size, n_kv_heads, head_dim)
        self.k, self.v = _poison(shape, dt), _poison(shape, dt)
        self.cu = np.concatenate([[0], np.cumsum(chunks)]).astype(np.int32)
        self.N = int(self.cu[-1])
        self.positions = np.concatenate([np.arange(p, p + c) for p, c in zip(prefixes, chunks)]).astype(np.int32)
        for s in range(S):
            j = np.arange(lens[s])
            slots = self.tables[s, j // block_size] * block_size + j % block_size
            kr = rng.standard_normal((lens[s], n_kv_heads, head_dim)).astype(np.float32)
            vr = (rng.standard_normal((lens[s], n_kv_heads, head_dim)) * 2).astype(np.float32)
            kv_ops.kv_append_reference(kv_dtype, kr, vr, slots, self.k, self.v)
        q_dim, kv_dim = self.n_heads * head_dim, n_kv_heads * head_dim
        self.stride = q_dim + 2 * kv_dim
        self.qkv = np.full((self.N, self.stride), np.nan, np.float32)  # only Q may be read
        self.qkv[:, :q_dim] = rng.standard_normal((self.N, q_dim)).astype(np.float32)
        self.scale = 1.0 / np.sqrt(head_dim)
        # gpt-oss: a logit a head (drawn last: the rest of the case is the sinkless one's), from below the
        # scores (~N(0, 1), max ~2-3) to well above them; sinks=-inf: every head's set to -inf
        self.sinks = None if sinks is None else (np.full(self.n_heads, sinks, np.float32) if sinks == -np.inf
                                                 else rng.uniform(-2.0, 6.0, self.n_heads).astype(np.float32))

    def run(self, be, tables=None, k=None, v=None, rows=None, variant=BASELINE, window=None, mode=None, out_q8=None):
        """Attention over the whole batch, or over the sequences `rows` alone (packed in that order),
        by the baseline kernel or the split-KV variant (its scratch `window` tokens, default the step);
        the split frame's launch shape `mode` (attention.walks; None: by the step's shape)."""
        tables = self.tables if tables is None else tables
        k, v = (self.k, self.v) if k is None else (k, v)
        if rows is None:
            qkv, cu, pos = self.qkv, self.cu, self.positions
        else:
            toks = np.concatenate([np.arange(self.cu[s], self.cu[s + 1]) for s in rows])
            qkv, pos = self.qkv[toks], self.positions[toks]
            cu = np.concatenate([[0], np.cumsum([self.chunks[s] for s in rows])]).astype(np.int32)
            tables = tables[rows]
        n = len(pos)
        out = be.full((n, self.n_heads * self.head_dim), np.nan, np.float32)
        args = (be, self.kv_dtype, be.upload(qkv), self.stride, be.upload(k), be.upload(v),
                be.upload(np.ascontiguousarray(tables)), self.max_blocks, be.upload(cu), be.upload(pos),
                out, n, len(cu) - 1, self.n_heads, self.n_kv_heads, self.head_dim, self.block_size, self.scale)
        v = variant_of(variant)
        scratch = attn_ops.SplitScratch.alloc(be, window or n, self.n_heads, self.n_kv_heads, self.head_dim) \
            if v.scratch else None
        v.launch(*args, scratch, out_q8, sliding_window=self.sliding_window, softcap=self.softcap,
                 sinks=self.sinks_on(be), **({"mode": mode} if mode else {}))
        if scratch is not None:
            assert not be.download(scratch.tickets).any(), "the merge must leave every ticket at zero"
        return be.download(out)

    def reference(self):
        q = self.qkv[:, :self.n_heads * self.head_dim].reshape(self.N, self.n_heads, self.head_dim)
        return attn_ops.paged_attention_reference(q, self.k, self.v, self.tables, self.cu, self.positions,
                                                  block_size=self.block_size, scale=self.scale,
                                                  kv_dtype=self.kv_dtype, sliding_window=self.sliding_window,
                                                  softcap=self.softcap, sinks=self.sinks)

    def sinks_on(self, be):
        return None if self.sinks is None else be.upload(self.sinks)

    def moved(self, seed):
        """The same logical cache in other physical blocks (a random relabelling)."""
        perm = np.random.default_rng(seed).permutation(self.num_blocks)  # old block b -> new block perm[b]
        bs = self.block_size

        def move(c):
            out = np.empty_like(c)
            out.reshape(self.num_blocks, bs, -1)[perm] = c.reshape(self.num_blocks, bs, -1)
            return out

        return perm[self.tables].astype(np.int32), move(self.k), move(self.v)

    def check_reference(self, got, variant=BASELINE):
        want = self.reference().reshape(got.shape)
        assert not np.isnan(got).any(), "NaN in the output: a poisoned slot was read"
        V = kv_ops.decode_kv(self.kv_dtype, self.v)
        vmax = np.abs(V[~np.isnan(V)]).max()
        tol = FLASH_TOL if tensor_cores(variant) else TOL[self.kv_dtype]
        assert_close(got, want, rtol=0, atol=tol * vmax)

    def run_token_alone(self, be, t, variant):
        """Token t as a step of its own (a decode of its position over the same cache)."""
        s = int(np.searchsorted(self.cu, t, side="right") - 1)
        n = self.n_heads * self.head_dim
        out = be.full((1, n), np.nan, np.float32)
        args = (be, self.kv_dtype, be.upload(self.qkv[t:t + 1]), self.stride, be.upload(self.k), be.upload(self.v),
                be.upload(np.ascontiguousarray(self.tables[s:s + 1])), self.max_blocks, be.upload(np.array([0, 1], np.int32)),
                be.upload(self.positions[t:t + 1]), out, 1, 1, self.n_heads, self.n_kv_heads, self.head_dim,
                self.block_size, self.scale)
        v = variant_of(variant)
        scratch = attn_ops.SplitScratch.alloc(be, 1, self.n_heads, self.n_kv_heads, self.head_dim) \
            if v.scratch else None
        v.launch(*args, scratch, sliding_window=self.sliding_window, sinks=self.sinks_on(be))
        return be.download(out)[0]


def _head_dims(kv_dtype):
    return [32, 64] if kv_dtype == "q8_0" else [16, 64]  # q8_0 blocks are 32 elements


@st.composite
def batches(draw, kv_dtype):
    S = draw(st.integers(1, 8))
    return dict(
        prefixes=draw(st.lists(st.integers(0, 70), min_size=S, max_size=S)),
        chunks=draw(st.lists(st.integers(1, 20), min_size=S, max_size=S)),
        block_size=draw(st.sampled_from([4, 16])),
        group=draw(st.integers(1, 3)),
        n_kv_heads=draw(st.integers(1, 2)),
        head_dim=draw(st.sampled_from(_head_dims(kv_dtype))),
        seed=draw(st.integers(0, 2**32 - 1)),
        # half the cases slide: windows of one key, inside a partition, across partitions (64 keys)
        sliding_window=draw(st.sampled_from([0, 0, 0, 1, 7, 40])),
    )


def _check_case(backend, kv_dtype, b, variant=BASELINE):
    case = Case(b["seed"], kv_dtype, b["prefixes"], b["chunks"], b["block_size"], b["group"], b["n_kv_heads"],
                b["head_dim"], b.get("sliding_window", 0), sinks=b.get("sinks"))
    got = case.run(backend, variant=variant)
    case.check_reference(got, variant)
    # placement invariance: the same keys in other physical blocks give the same bits
    tables, k, v = case.moved(b["seed"] ^ 0x5EED)
    assert_same(case.run(backend, tables, k, v, variant=variant), got)
    # packing invariance: a sequence alone, and the batch in reverse order, give the same bits
    S = len(case.chunks)
    s = b["seed"] % S
    assert_same(case.run(backend, rows=[s], variant=variant), got[case.cu[s]:case.cu[s + 1]])
    if S > 1:
        rev = case.run(backend, rows=list(range(S))[::-1], variant=variant)
        at = 0
        for r in range(S - 1, -1, -1):
            n = case.chunks[r]
            assert_same(rev[at:at + n], got[case.cu[r]:case.cu[r + 1]])
            at += n
    return case, got


VARIANTS = variants_of("attention")  # every registered attention variant (sharpinf/ops/variants.toml)
SPLIT_FRAME = [v for v in VARIANTS if variant_of(v).scratch]  # split, flash and their copies
FLASH = [v for v in VARIANTS if tensor_cores(v)]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_attention_property(backend, kv_dtype, variant):
    n = 30 if variant == BASELINE else 15  # make test: half (make test-all: these)
    @settings(max_examples=n if os.environ.get("SHARPINF_TEST_TIER") == "all" else n // 2, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(b=batches(kv_dtype))
    def prop(b):
        _check_case(backend, kv_dtype, b, variant)

    prop()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_attention_decode_and_mixed(backend, kv_dtype, variant):
    """A fixed mixed step: decodes (chunk 1) at block boundaries, a fresh prefill, a long prefix, head_dim 128."""
    b = dict(prefixes=[0, 3, 4, 15, 16, 70, 0], chunks=[1, 1, 1, 1, 1, 20, 17], block_size=4, group=2,
             n_kv_heads=2, head_dim=128, seed=1234)
    _check_case(backend, kv_dtype, b, variant)


@pytest.mark.parametrize("variant", VARIANTS)
def test_attention_one_key(backend, variant):
    """Position 0: the output is exactly V[0] (softmax of one score is 1). An f16 cache: flash's
    operands are f16, so its V is exact there."""
    case = Case(7, "f32" if not tensor_cores(variant) else "f16", [0], [1], 16, 1, 1, 32)
    got = case.run(backend, variant=variant)
    slot = case.tables[0, 0] * 16
    assert_same(got[0], kv_ops.decode_kv(case.kv_dtype, case.v)[slot, 0])


@pytest.mark.parametrize("variant", VARIANTS)
def test_attention_decode_equals_prefill(backend, variant):
    """A token's output inside a prefill chunk (beside other sequences) and as a step of its own --
    a decode at its position over the same cache -- are the same bits: one kernel serves both."""
    case = Case(21, "f16", [70, 0, 5], [20, 9, 1], 4, 3, 2, 64)
    got = case.run(backend, variant=variant)
    for t in (0, 7, 19, 20, 28, 29):
        assert_same(case.run_token_alone(backend, t, variant), got[t], err_msg=f"token {t}")


@pytest.mark.parametrize("variant", SPLIT_FRAME)
@pytest.mark.parametrize("kv_dtype", ["f16", "q8_0"])
def test_split_attention_over_many_partitions(backend, kv_dtype, variant):
    """Contexts of 1,100 keys: 18 partitions of 64 over the 16 splits, a GQA group of 9 (three blocks
    of query heads for split; 7 tokens x 9 heads a tile for flash), a decode beside a prefill chunk."""
    b = dict(prefixes=[1099, 640, 0], chunks=[1, 3, 5], block_size=16, group=9, n_kv_heads=1, head_dim=64, seed=99)
    _check_case(backend, kv_dtype, b, variant)


@pytest.mark.parametrize("variant", FLASH)
@pytest.mark.parametrize("kv_dtype", ["bf16", "q8_0"])
def test_flash_attention_head_dim_256_and_long_tiles(backend, kv_dtype, variant):
    """head_dim 256 (2 warps, partitions of 32 keys), GQA 4: tiles of 8 tokens; chunks of 30 and 45
    tokens cut into several tiles, one ending mid-partition."""
    b = dict(prefixes=[33, 0, 100], chunks=[30, 45, 1], block_size=16, group=4, n_kv_heads=2, head_dim=256, seed=5)
    _check_case(backend, kv_dtype, b, variant)


@pytest.mark.parametrize("variant", SPLIT_FRAME)
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_walk_and_split_launches_give_the_same_bits(backend, kv_dtype, variant):
    """The split frame's two launch shapes -- one block a (query block, KV head) walking every split
    and merging as it goes, or 16 blocks merged by the last (attention.walks) -- give the same bits,
    the q8_1 copy included: contexts of up to 1,100 keys (splits of two partitions), GQA 3, causal
    and with a window that leaves whole splits empty."""
    from sharpinf.ops.quant_act import Q8Act

    hd = 32 if kv_dtype == "q8_0" else 64
    for window in (0, 100):
        case = Case(41 + window, kv_dtype, [1099, 640, 0, 70], [1, 3, 20, 9], 16, 3, 2, hd, sliding_window=window)
        got = {}
        for mode in ("split", "walk"):
            q8 = Q8Act.empty(backend, case.N, case.n_heads * hd)
            got[mode] = [case.run(backend, variant=variant, mode=mode, out_q8=q8)] + [
                backend.download(a) for a in (q8.q, q8.d, q8.s)]
        case.check_reference(got["walk"][0], variant)
        for walked, split in zip(got["walk"], got["split"]):
            assert_same(walked, split)
    # head_dim 128, GQA 5, the split launch in windows of 7 tokens (other tile cuts than the walk's)
    case = Case(47, kv_dtype, [300, 0, 1029], [12, 17, 2], 16, 5, 1, 128, sliding_window=90)
    assert_same(case.run(backend, variant=variant, mode="walk"), case.run(backend, variant=variant, mode="split", window=7))


def test_attention_launch_shape_rule(monkeypatch):
    """auto: on a GPU the walk where walk_pays' estimate says the step gains, given the step's deepest
    partitions (the split launch when they are not known); the walk from EMU_WALK_BLOCKS blocks on the
    emulator, whatever the contexts; above a kernel's walk head_dim it splits; a forced mode is obeyed
    (the environment's falls back where the kernel cannot walk; an explicit one is refused in one
    line), a bad one refused."""
    from types import SimpleNamespace

    from sharpinf.errors import SharpinfError

    monkeypatch.delenv("SHARPINF_ATTENTION_MODE", raising=False)
    gpu, emu = SimpleNamespace(multiprocessors=132), SimpleNamespace(multiprocessors=0)
    walks, flash_max, parts = attn_ops.walks, attn_ops.FLASH_WALK_MAX_HEAD_DIM, attn_ops.partitions
    h200 = lambda: (528, 528)  # noqa: E731  -- 4 blocks an SM of either split kernel, 132 SMs
    assert not walks(gpu, 10_000, 128) and not walks(gpu, 10_000, 128, slots=h200)  # no context known: split
    # the header's cases: the 8B shape's 64-sequence decode walks at 513 keys and splits at 4,097; one
    # sequence splits; flash's 512-token prefill (33 tiles x 8 KV heads, 2 blocks an SM) walks
    assert parts(513, 64) == 9 and parts(4097, 64) == 65
    assert walks(gpu, 512, 128, parts=9, splits=9, slots=h200) and not walks(gpu, 512, 128, parts=65, splits=16,
                                                                             slots=h200)
    assert not walks(gpu, 8, 128, parts=9, splits=9, slots=h200)
    assert walks(gpu, 264, 128, None, flash_max, parts=8, splits=8, slots=lambda: (264, 264))
    assert walks(gpu, 8, 128, parts=1, splits=1, slots=h200)  # one partition: the same work, 15 empty blocks fewer
    # a window bounds the depth, not the splits: a query deep in a long context keeps its 16, each
    # writing its state for the merge -- at 4,097 keys and a 100-key window the 64-sequence decode walks
    assert parts(4097, 64, 100) == 3 and parts(4097, 64, 64) == 2 and parts(4097, 64, 1) == 1 and parts(10, 64, 100) == 1
    assert walks(gpu, 512, 128, parts=3, splits=16, slots=h200)
    # the rule is walk_pays at every depth up to the step's: where walk_pays alone flips back to the
    # walk at a deeper context (the split's ceil(P / 16) steps up at 33 partitions), the rule stays split
    pays, every = attn_ops.walk_pays, attn_ops.walks_pays
    flips = [p for p in range(2, 300) if pays(256, p, min(16, p), 528, 528) != pays(256, p - 1, min(16, p - 1), 528, 528)]
    assert len(flips) > 1, "walk_pays alone should not be monotone here (else this check shows nothing)"
    first_split = next(p for p in range(1, 300) if not pays(256, p, min(16, p), 528, 528))
    assert all(every(256, p, min(16, p), 528, 528) == (p < first_split) for p in range(1, 300))
    assert not walks(emu, 3, 64) and walks(emu, 4, 64) and not walks(emu, 4, 256, None, flash_max)
    assert walks(emu, 4, 64, parts=10_000, splits=16, slots=h200)  # the emulator's rule reads no context
    assert walks(gpu, 1, 64, "walk") and not walks(emu, 1000, 64, "split")
    with pytest.raises(SharpinfError, match="head_dim <= 128"):
        walks(gpu, 1, 256, "walk", flash_max)
    monkeypatch.setenv("SHARPINF_ATTENTION_MODE", "walk")
    assert walks(gpu, 1, 128) and not walks(gpu, 1, 256, None, flash_max)
    monkeypatch.setenv("SHARPINF_ATTENTION_MODE", "split")
    assert not walks(gpu, 512, 128, parts=9, splits=9, slots=h200)
    monkeypatch.setenv("SHARPINF_ATTENTION_MODE", "both")
    with pytest.raises(SharpinfError, match="choose from auto, split, walk"):
        walks(gpu, 1, 64)


@pytest.mark.parametrize("variant", SPLIT_FRAME)
def test_split_attention_in_windows_is_bit_identical(backend, variant):
    """A step longer than the scratch runs in several launches (windows of 3 tokens here, cutting
    flash's tiles): the output is the one-launch output bit for bit, and the tickets end at zero."""
    case = Case(11, "f16", [40, 0, 7], [1, 6, 4], 8, 2, 2, 32)
    whole = case.run(backend, variant=variant)
    assert_same(case.run(backend, variant=variant, window=3), whole)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kv_dtype", ["f16", "q8_0"])
def test_sliding_window_attention(backend, kv_dtype, variant):
    """Gemma 3's local layers: windows of 100 keys over contexts up to 1,100 (the first visible key
    mid-partition, whole partitions and whole splits skipped), decodes beside a prefill chunk that
    straddles the window's edge; plus the exact edge: a window of W keys at position W - 1 still sees
    key 0, at W no longer (llama.cpp's is_masked_swa)."""
    b = dict(prefixes=[1099, 640, 0, 90], chunks=[1, 3, 5, 30], block_size=16, group=2, n_kv_heads=1,
             head_dim=64, seed=7, sliding_window=100)
    _check_case(backend, kv_dtype, b, variant)
    case = Case(3, kv_dtype, [0], [9], 4, 2, 1, 32, sliding_window=8)
    got = case.run(backend, variant=variant)
    case.check_reference(got, variant)
    ref = attn_ops.paged_attention_reference  # the reference's own edge, checked against a direct formula
    q = case.qkv[:, :case.n_heads * 32].reshape(case.N, case.n_heads, 32)
    want7 = ref(q[7:8], case.k, case.v, case.tables, np.array([0, 1]), case.positions[7:8], block_size=4,
                scale=case.scale, kv_dtype=kv_dtype, sliding_window=0)  # position 7 with W = 8: all 8 keys
    want8 = ref(q[8:9], case.k, case.v, case.tables, np.array([0, 1]), np.array([8]), block_size=4,
                scale=case.scale, kv_dtype=kv_dtype, sliding_window=0)
    tol = (FLASH_TOL if tensor_cores(variant) else TOL[kv_dtype]) * 8
    assert_close(got[7], want7.reshape(-1), rtol=0, atol=tol)
    # without key 0 the output moves by ~0.5 here, far outside any tolerance
    assert np.abs(got[8] - want8.reshape(-1)).max() > 0.05, "position 8 must no longer see key 0"


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kv_dtype", ["f16", "q8_0"])
def test_sliding_window_never_reads_below_the_window(backend, kv_dtype, variant):
    """Blocks every query of a sequence has left behind may be freed and reused (an all-windowed
    model's block manager does so): pointing their table entries at a NaN-poisoned block changes
    no bit of the output -- the kernels neither look those keys up nor read them."""
    case = Case(31, kv_dtype, [200, 90, 37, 0], [1, 30, 3, 12], 4, 2, 1, 64, sliding_window=20)
    got = case.run(backend, variant=variant)
    case.check_reference(got, variant)
    poisoned = case.tables[0, -1]  # every row's spare entry: a block nobody wrote
    tables = case.tables.copy()
    slid = 0
    for s in range(len(case.chunks)):
        first_key = max(0, case.prefixes[s] - case.sliding_window + 1)  # of the sequence's first query
        n = first_key // case.block_size
        tables[s, :n] = poisoned
        slid += n
    assert slid >= 50
    assert_same(case.run(backend, tables, variant=variant), got)


@pytest.mark.parametrize("variant", VARIANTS)
def test_softcapped_scores_as_gemma2_caps_them(backend, variant):
    """gemma2: every score cap * tanh(score / cap) before the mask and softmax (softcap.cuh), on every
    variant that softcaps (flash refuses, in one line: a set then takes the baseline), with a window on
    the side: the reference's output within tolerance, the step's bits under placement, and the cap
    really bends the scores (without it the output moves by far more than the tolerance)."""
    from sharpinf.errors import SharpinfError

    b = dict(prefixes=[70, 0, 9], chunks=[1, 12, 3], block_size=16, group=2, n_kv_heads=1, head_dim=64, seed=5)
    case = Case(5, "f16", b["prefixes"], b["chunks"], 16, 2, 1, 64, sliding_window=40, softcap=0.3)
    if tensor_cores(variant):
        with pytest.raises(SharpinfError, match="flash attention does not softcap scores"):
            case.run(backend, variant=variant)
        return
    got = case.run(backend, variant=variant)
    case.check_reference(got, variant)
    tables, k, v = case.moved(0x5EED)
    assert_same(case.run(backend, tables, k, v, variant=variant), got)
    uncapped = Case(5, "f16", b["prefixes"], b["chunks"], 16, 2, 1, 64, sliding_window=40).run(backend, variant=variant)
    assert np.abs(got - uncapped).max() > 20 * (FLASH_TOL if tensor_cores(variant) else TOL["f16"])


# gpt-oss's sinks: decodes beside prefill chunks of packed sequences, contexts of one split (<= 64
# keys) and of several (up to 131 keys: the split merge), 2 KV heads of 2 query heads each
SINK_STEP = dict(prefixes=[130, 0, 9, 70], chunks=[1, 12, 3, 2], block_size=16, group=2, n_kv_heads=2, head_dim=64,
                 seed=5, sinks=True)


@pytest.mark.parametrize("variant", VARIANTS)
def test_attention_sinks_as_gpt_oss_weighs_them(backend, variant):
    """gpt-oss: each head's sink logit z in the softmax's max and sum, no key and no value (llama.cpp's
    soft_max_ext): the reference's output within tolerance, the same bits under placement (shuffled
    blocks) and packing (a sequence alone, the batch reversed), causal and with a window, a token as a
    decode of its own equal to it inside its chunk; the sinks really weigh (without them the output moves
    by far more than the tolerance); all -inf sinks are no sinks, bit for bit."""
    case, got = _check_case(backend, "f16", SINK_STEP, variant)
    for t in (0, 1, 12, 16):
        assert_same(case.run_token_alone(backend, t, variant), got[t], err_msg=f"token {t}")
    tol = FLASH_TOL if tensor_cores(variant) else TOL["f16"]
    plain = Case(5, "f16", SINK_STEP["prefixes"], SINK_STEP["chunks"], 16, 2, 2, 64).run(backend, variant=variant)
    assert np.abs(got - plain).max() > 20 * tol
    none = Case(5, "f16", SINK_STEP["prefixes"], SINK_STEP["chunks"], 16, 2, 2, 64, sinks=-np.inf)
    assert_same(none.run(backend, variant=variant), plain)
    _check_case(backend, "f16", {**SINK_STEP, "sliding_window": 40, "seed": 6}, variant)


@pytest.mark.parametrize("variant", SPLIT_FRAME)
def test_attention_sinks_walk_and_split_give_the_same_bits(backend, variant):
    """With sinks, the split frame's two launch shapes give the same bits, the q8_1 copy included, and
    so does the split launch in windows of 3 tokens (other tile cuts): one split and several (up to 1,100
    keys), GQA 3, causal and with a window that leaves whole splits empty; head_dim 128 too (flash's
    fullest register tiles)."""
    from sharpinf.ops.quant_act import Q8Act

    for window, hd in ((0, 64), (100, 64), (0, 128)):
        case = Case(43 + window + hd, "f16", [1099, 0, 70], [1, 9, 3], 16, 3, 1, hd, sliding_window=window, sinks=True)
        got = {}
        for mode, win in (("split", None), ("walk", None), ("split", 3)):
            q8 = Q8Act.empty(backend, case.N, case.n_heads * hd)
            got[mode, win] = [case.run(backend, variant=variant, mode=mode, out_q8=q8, window=win)] + [
                backend.download(a) for a in (q8.q, q8.d, q8.s)]
        case.check_reference(got["walk", None][0], variant)
        for other in (("split", None), ("split", 3)):
            for walked, split in zip(got["walk", None], got[other]):
                assert_same(walked, split)


@pytest.mark.parametrize("variant", VARIANTS)
def test_sliding_window_decode_equals_prefill(backend, variant):
    """With a window too, a token inside a prefill chunk and as a decode of its own are the same bits
    (flash: a tile whose rows have different first keys)."""
    case = Case(23, "f16", [70, 0, 5], [20, 9, 1], 4, 3, 2, 64, sliding_window=13)
    got = case.run(backend, variant=variant)
    for t in (0, 7, 19, 20, 28, 29):
        assert_same(case.run_token_alone(backend, t, variant), got[t], err_msg=f"token {t}")


@pytest.mark.parametrize("variant", VARIANTS)
def test_sliding_window_head_dim_256(backend, variant):
    """Gemma 3 270M's shape: head_dim 256, one KV head for 4 query heads, a window of 48 (flash: partitions of 32)."""
    b = dict(prefixes=[100, 0], chunks=[1, 40], block_size=16, group=4, n_kv_heads=1, head_dim=256, seed=11,
             sliding_window=48)
    _check_case(backend, "f16", b, variant)


def test_flash_attention_rejects_groups_it_cannot_hold(backend):
    from sharpinf.errors import SharpinfError

    assert attn_ops.flash_fits(65, 1, 64) and attn_ops.flash_fits(33, 1, 256) and not attn_ops.flash_fits(64, 1, 64)
    with pytest.raises(SharpinfError, match="GQA groups of up to 64"):
        Case(1, "f16", [0], [1], 4, 65, 1, 16).run(backend, variant="flash")


@pytest.mark.parametrize("variant", SPLIT_FRAME)
def test_split_attention_q8_1_output(backend, variant):
    """The fused q8_1 copy of the output is exactly quantize_q8_1 of the float output."""
    from sharpinf.ops.quant_act import Q8Act, quantize_q8_1_reference

    case = Case(5, "f16", [30, 0], [2, 7], 4, 2, 2, 64)
    be = backend
    n, width = case.N, case.n_heads * case.head_dim
    out, q8 = be.empty((n, width), np.float32), Q8Act.empty(be, n, width)
    scratch = attn_ops.SplitScratch.alloc(be, n, case.n_heads, case.n_kv_heads, case.head_dim)
    variant_of(variant).launch(be, case.kv_dtype, be.upload(case.qkv), case.stride, be.upload(case.k), be.upload(case.v),
       be.upload(case.tables), case.max_blocks, be.upload(case.cu), be.upload(case.positions),
       out, n, 2, case.n_heads, case.n_kv_heads, case.head_dim, case.block_size, case.scale, scratch, q8)
    q, d, s = quantize_q8_1_reference(be.download(out))
    assert_same(be.download(q8.q), q)
    assert_same(be.download(q8.d), d)
    assert_same(be.download(q8.s), s)


def test_attention_forward_matches_single_sequence_oracle(backend):
    """Through the whole chain: rope -> kv_append -> attention vs oracles.reference's math for one sequence."""
    rng = _rng("chain")
    n_heads, n_kv, hd, L, bs, theta = 4, 2, 64, 23, 4, 10000.0
    q_dim, kv_dim = n_heads * hd, n_kv * hd
    stride = q_dim + 2 * kv_dim
    qkv = rng.standard_normal((L, stride)).astype(np.float32)
    pos = np.arange(L, dtype=np.int32)
    tables = rng.permutation(8)[None, :].astype(np.int32)
    slots = (tables[0, pos // bs] * bs + pos % bs).astype(np.int32)
    shape, dt = kv_ops.kv_cache_shape("f32", 8, bs, n_kv, hd)
    kc, vc = backend.upload(_poison(shape, dt)), backend.upload(_poison(shape, dt))
    d_qkv, d_pos = backend.upload(qkv), backend.upload(pos)
    freqs = RopeTable.plain(theta, hd).freqs
    rope_ops.rope(backend, d_qkv, stride, d_pos, L, n_heads, hd, backend.upload(freqs), "neox", col=0)
    rope_ops.rope(backend, d_qkv, stride, d_pos, L, n_kv, hd, backend.upload(freqs), "neox", col=q_dim)
    kv_ops.kv_append(backend, "f32", d_qkv, stride, q_dim, q_dim + kv_dim, backend.upload(slots), kc, vc, L, n_kv, hd)
    out = backend.empty((L, q_dim), np.float32)
    attn_ops.attention(backend, "f32", d_qkv, stride, kc, vc, backend.upload(tables), 8,
                       backend.upload(np.array([0, L], np.int32)), d_pos, out, L, 1, n_heads, n_kv, hd, bs,
                       1.0 / np.sqrt(hd))
    q = rope_ops.rope_reference(qkv[:, :q_dim].reshape(L, n_heads, hd), pos, freqs, "neox").astype(np.float64)
    k = rope_ops.rope_reference(qkv[:, q_dim:q_dim + kv_dim].reshape(L, n_kv, hd), pos, freqs, "neox").astype(np.float64)
    v = qkv[:, q_dim + kv_dim:].reshape(L, n_kv, hd).astype(np.float64)
    want = np.zeros((L, n_heads, hd))
    for h in range(n_heads):
        sc = q[:, h] @ k[:, h // 2].T / np.sqrt(hd)
        sc[np.triu_indices(L, 1)] = -np.inf
        w = np.exp(sc - sc.max(-1, keepdims=True))
        want[:, h] = (w / w.sum(-1, keepdims=True)) @ v[:, h // 2]
    assert_close(backend.download(out).reshape(L, n_heads, hd), want, rtol=0, atol=2e-5)


def test_the_step_hands_each_layer_its_sinks(emu):
    """A layer's attn_sinks.weight is uploaded as DeviceLayer.attn_sinks (float32 [n_head]) and the step's
    attention launch takes it: the logits move with sinks (each layer's own), and -inf sinks are no
    sinks, bit for bit (the loader's gpt-oss side is another's: the tensors are set on a llama here)."""
    from oracles.paged_runner import PagedRunner
    from sharpinf.model.loader import load_model
    from sharpinf.model.synth import synthetic_model
    from sharpinf.model.tensors import QTensor
    from sharpinf.step.forward import ForwardPass
    from sharpinf.step.kv_pool import KVPool

    m = load_model(synthetic_model("llama", "Q8_0", n_embd=128))
    n_head, F32 = m.config.n_head, 0  # GGMLQuantizationType.F32
    sinks = [np.random.default_rng(i).uniform(-1.0, 4.0, n_head).astype(np.float32) for i in range(m.config.n_layer)]
    for i, z in enumerate(sinks):
        m.tensors[f"blk.{i}.attn_sinks.weight"] = QTensor(f"blk.{i}.attn_sinks.weight", F32, (n_head,),
                                                          z.view(np.uint8).reshape(1, -1))
    fp = ForwardPass(m, emu, kernels="simple")
    assert [emu.download(L.attn_sinks).tolist() for L in fp.layers] == [z.tolist() for z in sinks]

    def logits(layer_sinks):
        for L, z in zip(fp.layers, layer_sinks):
            L.attn_sinks = None if z is None else emu.upload(z)
        fp.release_plans()  # a plan holds each launch's arguments: the sinks' address with them
        run = PagedRunner(fp, KVPool(emu, fp.cfg, num_blocks=16, block_size=4))
        return np.asarray(run.step([(run.new_seq(), list(range(1, 12)))], all_logits=True)[0])

    with_sinks, none = logits(sinks), logits([None] * len(sinks))
    assert np.abs(with_sinks - none).max() > 1e-2
    assert_same(logits([np.full(n_head, -np.inf, np.float32)] * len(sinks)), none)
