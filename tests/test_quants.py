"""Our GGML block (de)quantizers against gguf-py's, which is the comparison truth here.

Equality is bitwise: our float ops follow ggml's order ((d*sc)*q - dmin*m, ...), so the
float32 results have identical bits, zeros' signs included.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import quants as gq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharpinf.model import quants as q

NAMES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
# held by the baseline kernels alone (quants.BASE_ONLY)
BASE_ONLY = ["Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS", "MXFP4"]
QUANTIZED = NAMES[3:] + BASE_ONLY
ALL = NAMES + BASE_ONLY
# byte offsets of the fp16 scale fields inside one block
F16_FIELDS = {
    "Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2],
    "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "Q2_K": [80, 82], "Q3_K": [108], "IQ4_NL": [0], "IQ4_XS": [0],
    "MXFP4": [],  # its scale is an e8m0 byte: every value is a power of two (255: 2^127, inf past 6)
}
# worst |dequantize(quantize(x)) - x| as a fraction of the block's (super-block's) max |x|.
# Symmetric types (Q4_0, Q5_0, Q6_K) map the largest-magnitude value to -2^(b-1), so a value
# of equal size and opposite sign clips to 2^(b-1) - 1: up to one full step of error.
ROUND_TRIP_BOUND = {
    "Q8_0": 0.005, "Q4_0": 0.13, "Q4_1": 0.07, "Q5_0": 0.065, "Q5_1": 0.035,
    "Q4_K": 0.075, "Q5_K": 0.037, "Q6_K": 0.035,
    # 2 bits of an affine sub-block range (half a step of a third of it, scales rounded up); Q3_K's
    # symmetric 3 bits clip as Q4_0's do (a full step, of a quarter); the IQ4 levels run -127..113, so
    # a value as large as the block's (negative) largest but positive lands 14/127 short
    "Q2_K": 0.38, "Q3_K": 0.26, "IQ4_NL": 0.12, "IQ4_XS": 0.125,
    # MXFP4's top level is 6 of a power-of-two scale s with max|x| in [4s, 8s): up to 2s = max|x| / 4 clipped
    "MXFP4": 0.25,
}
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def gguf_dequant(raw: np.ndarray, name: str, shape: tuple[int, ...]) -> np.ndarray:
    qtype = gguf.GGMLQuantizationType[name]
    if name in ("F32", "F16", "BF16"):  # gguf-py wants the typed view for these
        raw = raw.reshape(-1).view({"F32": np.float32, "F16": np.float16, "BF16": np.uint8}[name])
        if name == "BF16":
            raw = raw.reshape(shape[:-1] + (shape[-1] * 2,))
    return np.asarray(gq.dequantize(raw, qtype), np.float32).reshape(shape)


def qt(name: str) -> int:
    return int(gguf.GGMLQuantizationType[name])


def random_raw(name: str, n_blocks: int, seed: int) -> np.ndarray:
    """Random block bytes with every fp16 scale field finite and of sane size."""
    rng = np.random.default_rng(seed)
    if name in ("F32", "F16", "BF16"):
        x = (rng.standard_normal(n_blocks * 32) * 10).astype(np.float32)
        return q.quantize(x, q.qtype_from_name(name)).reshape(-1)
    qtype = qt(name)
    blocks = rng.integers(0, 256, size=(n_blocks, q.BLOCK_BYTES[qtype]), dtype=np.uint8)
    for at in F16_FIELDS[name]:
        scale = (rng.standard_normal((n_blocks, 1)) * 0.05).astype(np.float16)
        blocks[:, at:at + 2] = scale.view(np.uint8)
    return blocks.reshape(-1)


def test_block_tables_match_ggml():
    assert [q.qtype_name(t) for t in q.SUPPORTED] == ALL and [q.qtype_name(t) for t in q.BASE_ONLY] == BASE_ONLY
    for name in ALL:
        qtype = qt(name)
        assert (q.BLOCK_ELEMS[qtype], q.BLOCK_BYTES[qtype]) == gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]]


def test_qtype_from_name_and_row_bytes():
    assert q.qtype_from_name("q4_k") == q.Q4_K and q.qtype_from_name("iq4_xs") == q.IQ4_XS
    for bad in ("Q8_1", "IQ2_XXS", "nope"):
        with pytest.raises(ValueError, match="unsupported"):
            q.qtype_from_name(bad)
    assert q.row_bytes(q.Q8_0, 64) == 68
    assert q.row_bytes(q.Q6_K, 512) == 420
    assert q.row_bytes(q.F32, 7) == 28
    with pytest.raises(ValueError):
        q.row_bytes(q.Q4_K, 128)


@pytest.mark.parametrize("name", ALL)
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), n_blocks=st.integers(1, 6))
def test_dequantize_random_blocks_matches_gguf(name, seed, n_blocks):
    qtype = qt(name)
    raw = random_raw(name, n_blocks, seed)
    n = raw.size // q.BLOCK_BYTES[qtype] * q.BLOCK_ELEMS[qtype]
    shape = (1, n)
    ours = q.dequantize(raw, qtype, shape)
    assert ours.dtype == np.float32 and ours.shape == shape
    assert bits_equal(ours, gguf_dequant(raw, name, shape))


@pytest.mark.parametrize("name", ALL)
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 4), blocks_per_row=st.integers(1, 3),
       scale=st.sampled_from([0.05, 1.0, 30.0]))
def test_quantize_round_trip(name, seed, rows, blocks_per_row, scale):
    # scales stay where the fp16 block scales are normal numbers: far smaller values lose
    # precision to fp16 subnormals (Q6_K's d is max|x| / 4064), in ggml as here
    qtype = qt(name)
    cols = blocks_per_row * max(q.BLOCK_ELEMS[qtype], 32)
    x = (np.random.default_rng(seed).standard_normal((rows, cols)) * scale).astype(np.float32)
    raw = q.quantize(x, qtype)
    assert raw.dtype == np.uint8 and raw.shape == (rows, q.row_bytes(qtype, cols))
    y = q.dequantize(raw, qtype, x.shape)
    assert bits_equal(y, gguf_dequant(raw, name, x.shape))
    if name == "F32":
        assert bits_equal(y, x)
    elif name in ("F16", "BF16"):
        rel = 2.0**-11 if name == "F16" else 2.0**-8
        assert np.all(np.abs(y - x) <= np.abs(x) * rel + 1e-7)
    else:
        blk = max(q.BLOCK_ELEMS[qtype], 32)
        xb, yb = x.reshape(-1, blk), y.reshape(-1, blk)
        err = np.abs(yb - xb).max(axis=1)
        assert np.all(err <= ROUND_TRIP_BOUND[name] * np.abs(xb).max(axis=1) + 1e-30)


@pytest.mark.parametrize("name", QUANTIZED)
def test_degenerate_blocks(name):
    """All-zero and constant blocks: no division by zero, exact zeros back."""
    qtype = qt(name)
    n = q.BLOCK_ELEMS[qtype] * 2
    zero = np.zeros((1, n), np.float32)
    assert np.array_equal(q.dequantize(q.quantize(zero, qtype), qtype, zero.shape), zero)
    const = np.full((2, n), -0.75, np.float32)
    y = q.dequantize(q.quantize(const, qtype), qtype, const.shape)
    assert np.allclose(y, const, atol=ROUND_TRIP_BOUND[name] * 0.75)


def test_q8_0_is_ggmls_quantizer():
    """Q8_0 quantizes as ggml's quantize_row_q8_0_ref (gguf-py copies it) bit for bit: d = amax / 127
    in float32, q = roundf(x / d), ties away from zero. The KV cache's q8_0 uses this quantizer too."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((64, 32)) * rng.uniform(1e-3, 1e3, (64, 1))).astype(np.float32)
    ties = np.concatenate([[127.0], np.arange(-15, 16) + 0.5]).astype(np.float32)  # d = 1: every x.5 a tie
    x[0], x[1] = ties, 0.0
    raw = q.quantize(x, q.Q8_0)
    assert np.array_equal(raw, gq.quantize(x, gguf.GGMLQuantizationType.Q8_0))
    half_away = np.sign(ties) * np.floor(np.abs(ties) + 0.5)
    assert raw[0, :2].view(np.float16)[0] == 1.0 and np.array_equal(raw[0, 2:].view(np.int8), half_away)
    assert not raw[1].any()


def test_dequantize_rejects_wrong_sizes():
    with pytest.raises(ValueError):
        q.dequantize(np.zeros(33, np.uint8), q.Q8_0, (32,))
    with pytest.raises(ValueError):
        q.dequantize(np.zeros(34, np.uint8), q.Q8_0, (16,))
    with pytest.raises(ValueError):
        q.dequantize(np.zeros(4, np.uint8), 10, (1,))  # Q2_K is not ours


def test_quantize_layouts_known_values():
    """A hand-checked Q8_0 and Q4_0 block: the layout, not only the round trip."""
    x = np.arange(32, dtype=np.float32) - 16  # -16..15, max magnitude -16
    raw8 = q.quantize(x, q.Q8_0).reshape(-1)
    d = np.float16(16 / 127)
    assert raw8[:2].view(np.float16)[0] == d
    assert raw8[2:].view(np.int8)[0] == -127
    raw4 = q.quantize(x, q.Q4_0).reshape(-1)
    assert raw4[:2].view(np.float16)[0] == np.float16(2.0)  # -16 / -8
    assert raw4[2] & 0x0F == 0 and raw4[2] >> 4 == 8  # x[0] = -16 -> 0, x[16] = 0 -> 8
