"""Quantized matmul and embedding kernels (kernels_cu/matmul.cu, embedding.cu) against
sharpinf.model.quants, on every backend.

Tolerance of matmul: |Y - Y_ref| <= 1e-5 * sum_i |w_i x_i| per output, Y_ref computed in
float64 from quants.dequantize (the kernel dequantizes exactly, so only its float32
accumulation differs; that error is bounded by ~(chain length) * 2^-24 * sum |w x|, and a
chain here is at most 32 * ceil(n_in / 1024) fmas in a lane plus 5 tree additions).
Embedding must equal quants.dequantize exactly.
Packing invariance is checked bit for bit: a token's outputs are the same alone, in any
contiguous sub-batch, and in the full batch.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharpinf.model import quants
from sharpinf.ops.embedding import embed, embed_reference
from sharpinf.ops.matmul import matmul, matmul_error_bound, matmul_reference
from asserts import assert_same

TYPES = list(quants.KERNEL_TYPES)
TYPE_IDS = [quants.qtype_name(q) for q in TYPES]
FLOAT_TYPES = (quants.F32, quants.F16, quants.BF16)

# byte offsets of each block's fp16 scale fields
F16_FIELDS = {
    quants.Q8_0: (0,), quants.Q4_0: (0,), quants.Q5_0: (0,),
    quants.Q4_1: (0, 2), quants.Q5_1: (0, 2),
    quants.Q4_K: (0, 2), quants.Q5_K: (0, 2), quants.Q6_K: (208,),
    quants.Q2_K: (80, 82), quants.Q3_K: (108,), quants.IQ4_NL: (0,), quants.IQ4_XS: (0,), quants.MXFP4: (),
}
# and of its e8m0 exponent bytes (random ones: 2^-10 to 1 as the fp16 scales; every byte: the embedding test)
E8M0_FIELDS = {quants.MXFP4: (0,)}


def _rng(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _min_n_in(qtype: int) -> int:
    return max(32, quants.BLOCK_ELEMS[qtype])


def _quantized_weights(rng, qtype: int, n_out: int, n_in: int) -> np.ndarray:
    """quantize() of random float rows: (n_out, row_bytes) uint8."""
    w = (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)
    return quants.quantize(w, qtype)


def _random_raw(rng, qtype: int, n_out: int, n_in: int) -> np.ndarray:
    """Random block bytes (every quant bit pattern) with sane fp16 scales; random finite floats for F32/F16/BF16."""
    if qtype in FLOAT_TYPES:
        return quants.quantize(rng.standard_normal((n_out, n_in)).astype(np.float32), qtype)
    n_blocks = n_out * n_in // quants.BLOCK_ELEMS[qtype]
    blocks = rng.integers(0, 256, size=(n_blocks, quants.BLOCK_BYTES[qtype]), dtype=np.uint8)
    for at in F16_FIELDS[qtype]:
        scale = (rng.uniform(-1, 1, n_blocks) * 10.0 ** rng.uniform(-4, 0, n_blocks)).astype(np.float16)
        blocks[:, at:at + 2] = scale.reshape(-1, 1).view(np.uint8)
    for at in E8M0_FIELDS.get(qtype, ()):
        blocks[:, at] = rng.integers(118, 129, n_blocks)
    return blocks.reshape(n_out, -1)


def _run_matmul(backend, raw, qtype, X, bias=None, n_out=None):
    n_tokens, n_in = X.shape
    n_out = raw.shape[0] if n_out is None else n_out
    Y = backend.empty((n_tokens, n_out), np.float32)
    bias_dev = None if bias is None else backend.upload(bias)
    matmul(backend, backend.upload(raw), qtype, backend.upload(np.ascontiguousarray(X)), Y,
           n_tokens, n_out, n_in, bias_dev)
    return backend.download(Y)


def _check_close(got, raw, qtype, X, bias):
    want = matmul_reference(raw, qtype, X, bias)
    bound = matmul_error_bound(raw, qtype, X) + 1e-30
    err = np.abs(got.astype(np.float64) - want)
    assert np.all(np.isfinite(got))
    assert np.all(err <= bound), f"max err {err.max():.3g}, worst ratio {(err / bound).max():.3g}"


# -- matmul vs the NumPy reference ---------------------------------------------------------------
SHAPES = [  # (n_tokens, n_out, n_in as a multiple of the smallest)
    (1, 1, 1), (2, 31, 1), (7, 97, 2), (8, 31, 1), (9, 1, 3), (33, 31, 2),
]


@pytest.mark.parametrize("qtype", TYPES, ids=TYPE_IDS)
@pytest.mark.parametrize("n_tokens,n_out,k", SHAPES)
def test_matmul_quantized_rows(backend, qtype, n_tokens, n_out, k):
    rng = _rng("mm", qtype, n_tokens, n_out, k)
    n_in = _min_n_in(qtype) * k
    raw = _quantized_weights(rng, qtype, n_out, n_in)
    X = rng.standard_normal((n_tokens, n_in)).astype(np.float32)
    bias = rng.standard_normal(n_out).astype(np.float32) if (n_tokens + n_out) % 2 else None
    _check_close(_run_matmul(backend, raw, qtype, X, bias), raw, qtype, X, bias)


@pytest.mark.parametrize("qtype", TYPES, ids=TYPE_IDS)
@pytest.mark.parametrize("with_bias", [False, True])
def test_matmul_random_blocks(backend, qtype, with_bias):
    rng = _rng("mm-raw", qtype, with_bias)
    n_tokens, n_out, n_in = 9, 31, _min_n_in(qtype) * 2
    raw = _random_raw(rng, qtype, n_out, n_in)
    X = (rng.standard_normal((n_tokens, n_in)) * 10.0 ** rng.uniform(-2, 2)).astype(np.float32)
    bias = rng.standard_normal(n_out).astype(np.float32) if with_bias else None
    _check_close(_run_matmul(backend, raw, qtype, X, bias), raw, qtype, X, bias)


def test_matmul_larger_rows(backend):
    # several chunks per lane (n_in = 64 chunks), so the per-lane loop runs more than once
    qtype, n_tokens, n_out, n_in = quants.Q4_K, 3, 5, 2048
    rng = _rng("mm-large")
    raw = _quantized_weights(rng, qtype, n_out, n_in)
    X = rng.standard_normal((n_tokens, n_in)).astype(np.float32)
    _check_close(_run_matmul(backend, raw, qtype, X), raw, qtype, X, None)


def test_matmul_bias_is_added_and_unused_without_flag(backend):
    qtype, n_in, n_out = quants.F16, 32, 4
    raw = quants.quantize(np.eye(n_out, n_in, dtype=np.float32), qtype)  # exactly the identity
    X = np.arange(2 * n_in, dtype=np.float32).reshape(2, n_in)
    bias = np.array([10, 20, 30, 40], np.float32)
    assert_same(_run_matmul(backend, raw, qtype, X, bias), X[:, :n_out] + bias)
    assert_same(_run_matmul(backend, raw, qtype, X), X[:, :n_out])


def test_matmul_rejects_partial_blocks(backend):
    with pytest.raises(ValueError):
        matmul(backend, None, quants.Q4_K, None, None, 1, 1, 32 * 3)
    with pytest.raises(ValueError):
        matmul(backend, None, quants.F32, None, None, 1, 1, 48)


# -- packing invariance ---------------------------------------------------------------------------
def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize("qtype", TYPES, ids=TYPE_IDS)
def test_matmul_packing_invariance(backend, qtype):
    rng = _rng("pack", qtype)
    n_tokens, n_out, n_in = 33, 31, 1280  # 40 chunks: some lanes take two, all lanes' partials differ
    raw = _quantized_weights(rng, qtype, n_out, n_in)
    X = rng.standard_normal((n_tokens, n_in)).astype(np.float32)
    bias = rng.standard_normal(n_out).astype(np.float32)
    full = _bits(_run_matmul(backend, raw, qtype, X, bias))
    for t in range(n_tokens):  # each token alone
        assert_same(_bits(_run_matmul(backend, raw, qtype, X[t:t + 1], bias)), full[t:t + 1])
    for a, b in [(0, 8), (1, 9), (5, 6), (3, 20), (7, 33), (16, 25)]:  # sub-batches straddling 8-token tiles
        assert_same(_bits(_run_matmul(backend, raw, qtype, X[a:b], bias)), full[a:b])


def test_matmul_packing_invariance_300_tokens(backend):
    # one token computed alone and at every offset of a 300-token batch (its own row repeated)
    qtype, n_out, n_in = quants.Q6_K, 7, 2560
    rng = _rng("pack300")
    raw = _quantized_weights(rng, qtype, n_out, n_in)
    x = rng.standard_normal((1, n_in)).astype(np.float32)
    alone = _bits(_run_matmul(backend, raw, qtype, x))
    X = np.concatenate([x] * 300 + [rng.standard_normal((1, n_in)).astype(np.float32)])
    packed = _bits(_run_matmul(backend, raw, qtype, X))
    assert_same(packed[:300], np.repeat(alone, 300, axis=0))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(qtype=st.sampled_from(TYPES), n_tokens=st.integers(1, 40), n_out=st.integers(1, 70),
       k=st.integers(1, 3), data=st.data())
def test_matmul_shapes_and_sub_batches(backend, qtype, n_tokens, n_out, k, data):
    n_in = _min_n_in(qtype) * k
    rng = _rng("hyp", qtype, n_tokens, n_out, k)
    raw = _quantized_weights(rng, qtype, n_out, n_in)
    X = rng.standard_normal((n_tokens, n_in)).astype(np.float32)
    full = _run_matmul(backend, raw, qtype, X)
    _check_close(full, raw, qtype, X, None)
    a = data.draw(st.integers(0, n_tokens - 1), label="start")
    b = data.draw(st.integers(a + 1, n_tokens), label="stop")
    assert_same(_bits(_run_matmul(backend, raw, qtype, X[a:b])), _bits(full[a:b]))


@pytest.mark.parametrize("grid_x,warps", [(1, 1), (2, 4), (3, 2), (64, 4)])
def test_matmul_grid_shape_does_not_change_bits(backend, grid_x, warps):
    # warps stride over the rows: any grid.x / block size gives the same bits as the launcher's choice
    from sharpinf.ops.launch import kernel

    qtype, n_tokens, n_out, n_in = quants.Q5_K, 11, 45, 512
    rng = _rng("grid", grid_x, warps)
    raw = _quantized_weights(rng, qtype, n_out, n_in)
    X = rng.standard_normal((n_tokens, n_in)).astype(np.float32)
    bias = rng.standard_normal(n_out).astype(np.float32)
    want = _bits(_run_matmul(backend, raw, qtype, X, bias))
    Y = backend.empty((n_tokens, n_out), np.float32)
    backend.launch(kernel(backend, "matmul.cu", "matmul_q5_k"), (grid_x, -(-n_tokens // 8)), 32 * warps,
                   (backend.upload(raw), backend.upload(X), backend.upload(bias), Y, np.int32(n_tokens),
                    np.int32(n_out), np.int32(n_in), np.int32(1)))
    assert_same(_bits(backend.download(Y)), want)


def test_matmul_into_column_ranges_of_a_fused_buffer(backend):
    # y_stride / y_col: two matmuls of different types fill one [N, 80] buffer; same bits as alone
    rng = _rng("fused")
    n_tokens, n_in, stride = 9, 256, 80
    parts = [(quants.Q4_K, 0, 48), (quants.Q8_0, 48, 32)]
    X = rng.standard_normal((n_tokens, n_in)).astype(np.float32)
    bias = rng.standard_normal(stride).astype(np.float32)
    Y = backend.upload(np.full((n_tokens, stride), np.nan, np.float32))
    x_dev, bias_dev = backend.upload(X), backend.upload(bias)
    want = []
    for qtype, col, n_out in parts:
        raw = _quantized_weights(rng, qtype, n_out, n_in)
        b = bias[col:col + n_out]
        matmul(backend, backend.upload(raw), qtype, x_dev, Y, n_tokens, n_out, n_in, bias_dev[col:col + n_out],
               y_stride=stride, y_col=col)
        want.append(_run_matmul(backend, raw, qtype, X, b))
    assert_same(_bits(backend.download(Y)), _bits(np.concatenate(want, axis=1)))


# -- embedding ------------------------------------------------------------------------------------
def _run_embed(backend, raw, qtype, ids, n_embd, scale=1.0):
    out = backend.empty((len(ids), n_embd), np.float32)
    embed(backend, backend.upload(raw), qtype, backend.upload(ids.astype(np.int32)), out, len(ids), n_embd, scale)
    return backend.download(out)


@pytest.mark.parametrize("qtype", TYPES, ids=TYPE_IDS)
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("scale", [1.0, 640 ** 0.5], ids=["unscaled", "gemma-sqrt640"])
def test_embedding_exact(backend, qtype, k, scale):
    rng = _rng("embed", qtype, k)
    n_vocab, n_embd = 37, _min_n_in(qtype) * k
    for raw in (_quantized_weights(rng, qtype, n_vocab, n_embd), _random_raw(rng, qtype, n_vocab, n_embd)):
        ids = np.concatenate([[0, n_vocab - 1, 5, 5], rng.integers(0, n_vocab, 7)])
        got = _run_embed(backend, raw, qtype, ids, n_embd, scale)
        assert_same(_bits(got), _bits(embed_reference(raw, qtype, ids, n_embd, scale)))


@pytest.mark.parametrize("qtype", quants.BASE_ONLY, ids=[quants.qtype_name(q) for q in quants.BASE_ONLY])
def test_embedding_decodes_the_newest_types_exactly(backend, qtype):
    """ggml_blocks.cuh's decode of Q2_K, Q3_K, IQ4_NL, IQ4_XS and MXFP4 equals quants.dequantize, itself
    bit-equal to gguf-py's, on quantized rows and random block bytes."""
    rng = _rng("embed-new", qtype)
    n_vocab, n_embd = 9, _min_n_in(qtype) * 2
    for raw in (_quantized_weights(rng, qtype, n_vocab, n_embd), _random_raw(rng, qtype, n_vocab, n_embd)):
        ids = np.array([0, n_vocab - 1, 4, 4, 7], np.int32)
        assert_same(_bits(_run_embed(backend, raw, qtype, ids, n_embd)), _bits(embed_reference(raw, qtype, ids, n_embd)))


def test_embedding_decodes_every_mxfp4_exponent_as_the_reference(backend):
    """All 256 e8m0 bytes, one a block, under random nibbles: the subnormal scales of e < 2, the ordinary
    ones, and the products past float's range (e >= 253) -- inf, bit for bit the reference's."""
    rng = _rng("embed-e8m0")
    raw = rng.integers(0, 256, (256, 17), dtype=np.uint8)
    raw[:, 0] = np.arange(256)
    raw = raw.reshape(8, 32 * 17)  # 8 rows of 1024 values
    ids = np.arange(8, dtype=np.int32)
    want = embed_reference(raw, quants.MXFP4, ids, 1024)
    assert np.isinf(want).any() and ((want != 0) & (np.abs(want) < np.finfo(np.float32).tiny)).any()
    assert_same(_bits(_run_embed(backend, raw, quants.MXFP4, ids, 1024)), _bits(want))


def test_embedding_takes_fed_ids_and_writes_them_back(backend):
    """A token with feed_rows[t] = r embeds feed_ids[r] (the previous step's sampled id: async
    scheduling) and leaves it in ids[t]; the others embed and keep their own ids."""
    qtype = quants.Q8_0
    rng = _rng("embed-feed", qtype)
    n_vocab, n_embd = 37, _min_n_in(qtype)
    raw = _quantized_weights(rng, qtype, n_vocab, n_embd)
    ids = np.array([4, 0, 9, 0], np.int32)  # tokens 1 and 3 are placeholders
    feed_rows, feed_ids = np.array([-1, 2, -1, 0], np.int32), np.array([30, 11, 17], np.int32)
    ids_dev, out = backend.upload(ids), backend.empty((4, n_embd), np.float32)
    embed(backend, backend.upload(raw), qtype, ids_dev, out, 4, n_embd, feed=(backend.upload(feed_rows),
                                                                             backend.upload(feed_ids)))
    real = np.array([4, 17, 9, 30], np.int32)
    assert backend.download(ids_dev).tolist() == real.tolist()
    assert_same(_bits(backend.download(out)), _bits(embed_reference(raw, qtype, real, n_embd)))


@pytest.mark.parametrize("qtype", FLOAT_TYPES, ids=[quants.qtype_name(q) for q in FLOAT_TYPES])
def test_embedding_float_odd_width(backend, qtype):
    rng = _rng("embed-odd", qtype)
    n_vocab, n_embd = 6, 333  # float tables need not be whole 32-value chunks
    raw = quants.quantize(rng.standard_normal((n_vocab, n_embd)).astype(np.float32), qtype)
    ids = np.array([5, 0, 3], np.int32)
    assert_same(_bits(_run_embed(backend, raw, qtype, ids, n_embd)),
                                  _bits(embed_reference(raw, qtype, ids, n_embd)))
