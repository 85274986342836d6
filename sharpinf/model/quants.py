"""GGML block formats in NumPy: our reference dequantizer and a plain quantizer (Q8_0: ggml's own).

Every quantized row is a run of fixed-size blocks; each block holds BLOCK_ELEMS
values in BLOCK_BYTES bytes, little-endian. One small function per type below;
each works on all blocks at once as a (n_blocks, BLOCK_BYTES) uint8 array and
returns (n_blocks, BLOCK_ELEMS) float32. The CUDA dequant kernels are checked
against these functions, so they are written for clarity first.

The float arithmetic follows ggml's order (e.g. Q4_K: (d*sc)*q - (dmin*m)),
so results equal ggml / gguf-py bit for bit.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

F32, F16, BF16 = int(T.F32), int(T.F16), int(T.BF16)
Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 = int(T.Q8_0), int(T.Q4_0), int(T.Q4_1), int(T.Q5_0), int(T.Q5_1)
Q4_K, Q5_K, Q6_K = int(T.Q4_K), int(T.Q5_K), int(T.Q6_K)
Q2_K, Q3_K, IQ4_NL, IQ4_XS = int(T.Q2_K), int(T.Q3_K), int(T.IQ4_NL), int(T.IQ4_XS)
MXFP4 = int(T.MXFP4)  # gpt-oss's experts: e2m1 values, one e8m0 scale a block of 32

# Held by the baseline kernels alone (the simple matmul, dp4a and its MoE form, embedding): the faster
# variants (gemv, mma, mmq, the fused FFN and link, moe=gemv and moe=mmq) hand them to dp4a, the same bits.
BASE_ONLY = (Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4)
KERNEL_TYPES = (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, *BASE_ONLY)
SUPPORTED = KERNEL_TYPES

QK = 32  # elements per block of the legacy formats
QK_K = 256  # elements per super-block of the K-quants

BLOCK_ELEMS: dict[int, int] = {
    F32: 1, F16: 1, BF16: 1,
    Q8_0: QK, Q4_0: QK, Q4_1: QK, Q5_0: QK, Q5_1: QK,
    Q4_K: QK_K, Q5_K: QK_K, Q6_K: QK_K,
    Q2_K: QK_K, Q3_K: QK_K, IQ4_NL: QK, IQ4_XS: QK_K, MXFP4: QK,
}
BLOCK_BYTES: dict[int, int] = {
    F32: 4, F16: 2, BF16: 2,
    Q8_0: 2 + 32,
    Q4_0: 2 + 16,
    Q4_1: 2 + 2 + 16,
    Q5_0: 2 + 4 + 16,
    Q5_1: 2 + 2 + 4 + 16,
    Q4_K: 2 + 2 + 12 + 128,
    Q5_K: 2 + 2 + 12 + 32 + 128,
    Q6_K: 128 + 64 + 16 + 2,
    Q2_K: 16 + 64 + 2 + 2,
    Q3_K: 32 + 64 + 12 + 2,
    IQ4_NL: 2 + 16,
    IQ4_XS: 2 + 2 + 4 + 128,
    MXFP4: 1 + 16,
}


def qtype_name(qtype: int) -> str:
    try:
        return T(qtype).name
    except ValueError:
        return f"type#{qtype}"


def qtype_from_name(name: str) -> int:
    """"Q4_K" (any case) -> its GGML type id; ValueError if we do not support it."""
    try:
        qtype = int(T[name.upper()])
    except KeyError:
        qtype = -1
    if qtype not in SUPPORTED:
        raise ValueError(f"unsupported quant type {name!r}: {why_unsupported(qtype)}")
    return qtype


def why_unsupported(qtype: int) -> str:
    """One line for a type sharpinf does not read: what is supported."""
    return "supported: " + ", ".join(qtype_name(q) for q in SUPPORTED)


def row_bytes(qtype: int, n_cols: int) -> int:
    """Bytes of one row of n_cols values; n_cols must be a whole number of blocks."""
    elems = BLOCK_ELEMS[qtype]
    if n_cols % elems:
        raise ValueError(f"{qtype_name(qtype)} rows need a multiple of {elems} values, got {n_cols}")
    return n_cols // elems * BLOCK_BYTES[qtype]


# ---------------------------------------------------------------- helpers

def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The fp16 field at byte `at` of every block, as float32 (n_blocks, 1)."""
    return blocks[:, at:at + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, k) bytes -> (n, 2k): all low nibbles first, then all high nibbles.

    This is the legacy-format order: element j is the low nibble of byte j,
    element j + k the high nibble of byte j.
    """
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _bits(qh: np.ndarray) -> np.ndarray:
    """(n, k) bytes -> (n, 8k) bits, bit j of the little-endian bit string at column j."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


# ---------------------------------------------------------------- float types

def _dequant_f32(blocks: np.ndarray) -> np.ndarray:
    # 4-byte IEEE float32 per element
    return blocks.copy().view(np.float32)


def _dequant_f16(blocks: np.ndarray) -> np.ndarray:
    # 2-byte IEEE half per element
    return blocks.copy().view(np.float16).astype(np.float32)


def _dequant_bf16(blocks: np.ndarray) -> np.ndarray:
    # 2-byte bfloat16: the top half of a float32
    return (blocks.copy().view(np.uint16).astype(np.uint32) << 16).view(np.float32)


# ---------------------------------------------------------------- legacy 32-element blocks

def _dequant_q8_0(blocks: np.ndarray) -> np.ndarray:
    # [d: f16][qs: 32 x int8]            y = d * q
    d = _f16(blocks, 0)
    q = blocks[:, 2:].view(np.int8).astype(np.float32)
    return d * q


def _dequant_q4_0(blocks: np.ndarray) -> np.ndarray:
    # [d: f16][qs: 16 bytes, 32 nibbles]  y = d * (q - 8)
    # element j < 16: low nibble of qs[j]; element j + 16: high nibble of qs[j]
    d = _f16(blocks, 0)
    q = _nibbles(blocks[:, 2:]).astype(np.int8) - np.int8(8)
    return d * q.astype(np.float32)


def _dequant_q4_1(blocks: np.ndarray) -> np.ndarray:
    # [d: f16][m: f16][qs: 16 bytes]      y = d * q + m   (nibbles as Q4_0)
    d, m = _f16(blocks, 0), _f16(blocks, 2)
    q = _nibbles(blocks[:, 4:]).astype(np.float32)
    return d * q + m


def _dequant_q5_0(blocks: np.ndarray) -> np.ndarray:
    # [d: f16][qh: 4 bytes = 32 high bits][qs: 16 bytes]   y = d * (q - 16)
    # q = nibble (as Q4_0) | (bit j of qh) << 4
    d = _f16(blocks, 0)
    q = _nibbles(blocks[:, 6:]) | (_bits(blocks[:, 2:6]) << 4)
    return d * (q.astype(np.int8) - np.int8(16)).astype(np.float32)


def _dequant_q5_1(blocks: np.ndarray) -> np.ndarray:
    # [d: f16][m: f16][qh: 4 bytes][qs: 16 bytes]   y = d * q + m   (q as Q5_0)
    d, m = _f16(blocks, 0), _f16(blocks, 2)
    q = _nibbles(blocks[:, 8:]) | (_bits(blocks[:, 4:8]) << 4)
    return d * q.astype(np.float32) + m


# ---------------------------------------------------------------- K-quants, 256-element super-blocks

def _unpack_k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """12 bytes -> 8 six-bit scales and 8 six-bit mins, each (n, 8) uint8.

    Sub-blocks 0-3: sc = s[j] & 63,  m = s[j+4] & 63.
    Sub-blocks 4-7: low 4 bits in s[j+8] (sc low nibble, m high nibble),
                    high 2 bits in the top 2 bits of s[j] (sc) and s[j+4] (m).
    """
    a, b, c = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = np.concatenate([a & 63, (c & 0x0F) | ((a >> 6) << 4)], axis=-1)
    m = np.concatenate([b & 63, (c >> 4) | ((b >> 6) << 4)], axis=-1)
    return sc, m


def _pack_k_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Inverse of _unpack_k_scales: (n, 8) six-bit sc and m -> (n, 12) bytes."""
    lo_sc, hi_sc, lo_m, hi_m = sc[:, :4], sc[:, 4:], m[:, :4], m[:, 4:]
    a = lo_sc | ((hi_sc >> 4) << 6)
    b = lo_m | ((hi_m >> 4) << 6)
    c = (hi_sc & 0x0F) | ((hi_m & 0x0F) << 4)
    return np.concatenate([a, b, c], axis=-1).astype(np.uint8)


def _k_nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 128) bytes -> (n, 8, 32) nibbles of Q4_K/Q5_K.

    Each 32-byte chunk c holds sub-block 2c in its low nibbles and 2c+1 in its high ones.
    """
    chunks = qs.reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (chunks & 0x0F).reshape(-1, 8, 32)


def _dequant_q4_k(blocks: np.ndarray) -> np.ndarray:
    # [d: f16][dmin: f16][scales: 12 bytes, 8 x (6-bit sc, 6-bit m)][qs: 128 bytes]
    # 8 sub-blocks of 32: y = (d * sc) * q - (dmin * m)
    n = blocks.shape[0]
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)
    sc, m = _unpack_k_scales(blocks[:, 4:16])
    dl = (d * sc.astype(np.float32)).reshape(n, 8, 1)
    ml = (dmin * m.astype(np.float32)).reshape(n, 8, 1)
    q = _k_nibbles(blocks[:, 16:]).astype(np.float32)
    return (dl * q - ml).reshape(n, QK_K)


def _dequant_q5_k(blocks: np.ndarray) -> np.ndarray:
    # [d: f16][dmin: f16][scales: 12 bytes][qh: 32 bytes][qs: 128 bytes]
    # as Q4_K, plus a 5th bit: element l of sub-block s has high bit (qh[l] >> s) & 1
    n = blocks.shape[0]
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)
    sc, m = _unpack_k_scales(blocks[:, 4:16])
    dl = (d * sc.astype(np.float32)).reshape(n, 8, 1)
    ml = (dmin * m.astype(np.float32)).reshape(n, 8, 1)
    qh = blocks[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    q = _k_nibbles(blocks[:, 48:]) | ((qh & 1) << 4)
    return (dl * q.astype(np.float32) - ml).reshape(n, QK_K)


def _dequant_q6_k(blocks: np.ndarray) -> np.ndarray:
    # [ql: 128 bytes][qh: 64 bytes][scales: 16 x int8][d: f16]
    # 16 sub-blocks of 16: y = (d * scale[e // 16]) * (q - 32), q 6 bits.
    # Two halves of 128 elements; half h uses ql[64h:64h+64], qh[32h:32h+32].
    # In a half, element 32k + l (k = 0..3, l = 0..31) takes
    #   low 4 bits:  nibble k // 2 of ql[64h + 32 * (k % 2) + l]
    #   high 2 bits: bits 2k, 2k+1 of qh[32h + l]
    n = blocks.shape[0]
    ql = blocks[:, 0:128].reshape(n, 2, 1, 2, 32)  # (half, nibble, k % 2, l)
    ql = (ql >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1, 1)) & 0x0F
    ql = ql.reshape(n, 2, 4, 32)  # k = 2 * nibble + k % 2
    qh = blocks[:, 128:192].reshape(n, 2, 1, 32)
    qh = (qh >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 0x03
    q = (ql | (qh << 4)).astype(np.int8) - np.int8(32)
    scales = blocks[:, 192:208].view(np.int8).astype(np.float32)
    dl = (_f16(blocks, 208) * scales).reshape(n, 16, 1)
    return (dl * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, QK_K)


def _dequant_q2_k(blocks: np.ndarray) -> np.ndarray:
    # [scales: 16 bytes, sc low nibble, m high][qs: 64 bytes][d: f16][dmin: f16]
    # 16 sub-blocks of 16: y = (d * sc) * q - (dmin * m), q 2 bits. Element 128h + 32j + l
    # (half h, j = 0..3, l = 0..31) is bits 2j, 2j+1 of qs[32h + l].
    n = blocks.shape[0]
    scales = blocks[:, :16]
    dl = (_f16(blocks, 80) * (scales & 0x0F).astype(np.float32)).reshape(n, 16, 1)
    ml = (_f16(blocks, 82) * (scales >> 4).astype(np.float32)).reshape(n, 16, 1)
    q = _crumbs(blocks[:, 16:80]).reshape(n, 16, 16).astype(np.float32)
    return (dl * q - ml).reshape(n, QK_K)


def _crumbs(qs: np.ndarray) -> np.ndarray:
    """(n, 64) bytes -> (n, 256) 2-bit values of Q2_K/Q3_K: element 128h + 32j + l is bits 2j, 2j+1 of
    byte 32h + l."""
    q = qs.reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    return (q & 3).reshape(-1, QK_K)


def _q3_k_scales(s: np.ndarray) -> np.ndarray:
    """12 bytes -> 16 six-bit scales, minus 32 (n, 16) int8: scale i's low 4 bits are nibble i // 8 of
    byte i % 8, its high 2 bits bits 2(i // 4), 2(i // 4) + 1 of byte 8 + i % 4."""
    lo = np.concatenate([s[:, :8] & 0x0F, s[:, :8] >> 4], axis=-1)
    hi = (s[:, 8:12].reshape(-1, 1, 4) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1)).reshape(-1, 16) & 3
    return (lo | (hi << 4)).astype(np.int8) - np.int8(32)


def _dequant_q3_k(blocks: np.ndarray) -> np.ndarray:
    # [hmask: 32 bytes][qs: 64 bytes][scales: 12 bytes, 16 x 6 bits][d: f16]
    # 16 sub-blocks of 16: y = (d * (scale - 32)) * q, q = 2 low bits (as Q2_K) - 4 unless the
    # element's hmask bit is set (element 32k + l: bit k of hmask[l]).
    n = blocks.shape[0]
    dl = (_f16(blocks, 108) * _q3_k_scales(blocks[:, 96:108]).astype(np.float32)).reshape(n, 16, 1)
    h = (blocks[:, :32].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
    q = _crumbs(blocks[:, 32:96]).astype(np.int8) - ((h.reshape(n, QK_K) ^ 1) << 2).astype(np.int8)
    return (dl * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, QK_K)


# IQ4_NL's and IQ4_XS's 16 levels (ggml's kvalues_iq4nl): a nibble is an index into them
IQ4_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)


def _dequant_iq4_nl(blocks: np.ndarray) -> np.ndarray:
    # [d: f16][qs: 16 bytes, nibbles as Q4_0]   y = d * IQ4_LEVELS[nibble]
    return _f16(blocks, 0) * IQ4_LEVELS[_nibbles(blocks[:, 2:])].astype(np.float32)


def _dequant_iq4_xs(blocks: np.ndarray) -> np.ndarray:
    # [d: f16][scales_h: u16][scales_l: 4 bytes][qs: 128 bytes]   8 sub-blocks of 32:
    # y = (d * (ls - 32)) * IQ4_LEVELS[nibble], ls of sub-block s = nibble s % 2 of scales_l[s // 2]
    # | bits 2s, 2s+1 of scales_h << 4; its nibbles as Q4_0's in qs[16s:16s+16].
    n = blocks.shape[0]
    sh = blocks[:, 2:4].copy().view(np.uint16)  # (n, 1)
    sl = np.concatenate([blocks[:, 4:8, None] & 0x0F, blocks[:, 4:8, None] >> 4], axis=-1).reshape(n, 8)
    hi = ((sh >> (2 * np.arange(8, dtype=np.uint16))) & 3).astype(np.uint8)
    ls = (sl | (hi << 4)).astype(np.int8) - np.int8(32)
    dl = (_f16(blocks, 0) * ls.astype(np.float32)).reshape(n, 8, 1)
    q = IQ4_LEVELS[_nibbles(blocks[:, 8:].reshape(n * 8, 16))].reshape(n, 8, 32)
    return (dl * q.astype(np.float32)).reshape(n, QK_K)


# MXFP4's 16 e2m1 values, doubled to integers (ggml's kvalues_mxfp4): a nibble is an index into them
MXFP4_LEVELS = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """An e8m0 exponent byte -> 2^(e - 127) / 2 as float32 (ggml_e8m0_to_fp32_half: the half undoes the
    levels' doubling; e < 2 gives the subnormals 2^-128 and 2^-127)."""
    e = e.astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(np.float32)


def _dequant_mxfp4(blocks: np.ndarray) -> np.ndarray:
    # [e: e8m0 byte][qs: 16 bytes, nibbles as Q4_0]   y = e8m0_half(e) * MXFP4_LEVELS[nibble]
    with np.errstate(over="ignore"):  # e = 255: 2^127 * 12 is inf, as in ggml
        return e8m0_half(blocks[:, :1]) * MXFP4_LEVELS[_nibbles(blocks[:, 1:])].astype(np.float32)


_DEQUANT = {
    F32: _dequant_f32, F16: _dequant_f16, BF16: _dequant_bf16,
    Q8_0: _dequant_q8_0, Q4_0: _dequant_q4_0, Q4_1: _dequant_q4_1,
    Q5_0: _dequant_q5_0, Q5_1: _dequant_q5_1,
    Q4_K: _dequant_q4_k, Q5_K: _dequant_q5_k, Q6_K: _dequant_q6_k,
    Q2_K: _dequant_q2_k, Q3_K: _dequant_q3_k, IQ4_NL: _dequant_iq4_nl, IQ4_XS: _dequant_iq4_xs,
    MXFP4: _dequant_mxfp4,
}


def dequantize(raw: np.ndarray, qtype: int, shape: tuple[int, ...]) -> np.ndarray:
    """Raw GGML bytes (any shape, row-major) -> float32 array of `shape` (numpy order)."""
    if qtype not in _DEQUANT:
        raise ValueError(f"unsupported quant type {qtype_name(qtype)}")
    shape = tuple(int(s) for s in shape)
    n_elems = int(np.prod(shape, dtype=np.int64))
    if shape and shape[-1] % BLOCK_ELEMS[qtype]:
        raise ValueError(f"{qtype_name(qtype)}: last dim {shape[-1]} is not a multiple of {BLOCK_ELEMS[qtype]}")
    n_blocks = n_elems // BLOCK_ELEMS[qtype]
    flat = np.asarray(raw).view(np.uint8).reshape(-1)
    if flat.size != n_blocks * BLOCK_BYTES[qtype]:
        raise ValueError(f"{qtype_name(qtype)} {shape}: expected {n_blocks * BLOCK_BYTES[qtype]} bytes, got {flat.size}")
    blocks = flat.reshape(n_blocks, BLOCK_BYTES[qtype])  # (n_blocks, block_bytes)
    return _DEQUANT[qtype](blocks).reshape(shape)


# ---------------------------------------------------------------- quantizers (synthetic weights; Q8_0: the KV cache too)

def _safe_inv(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d == 0, 0, 1 / np.where(d == 0, 1, d)).astype(np.float32)


def _as_f16_bytes(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(n, 2k) values < 16 -> (n, k) bytes, inverse of _nibbles."""
    k = q.shape[1] // 2
    return (q[:, :k] | (q[:, k:] << 4)).astype(np.uint8)


def _signed_absmax(x: np.ndarray) -> np.ndarray:
    """The value with the largest magnitude in each row, with its sign, (n, 1)."""
    i = np.abs(x).argmax(axis=-1)[:, None]
    return np.take_along_axis(x, i, axis=-1)


def _round_half_away(x: np.ndarray) -> np.ndarray:
    """C's roundf: halves away from zero (np.round takes them to even)."""
    a = np.abs(x)
    r = np.floor(a)
    return np.copysign(r + (a - r >= 0.5), x)


def q8_blocks(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's 8-bit rule (quantize_row_q8_0_ref) on float32 blocks [..., 32]: d = amax / 127 in
    float32, q = roundf(x * (1 / d)), q = 0 where d = 0. Returns d [..., 1] float32, q int8. The one
    rounding of Q8_0 (weights, the KV cache) and of our q8_1 activations; every kernel follows it."""
    d = np.abs(x).max(axis=-1, keepdims=True) / np.float32(127)
    return d, _round_half_away(x * _safe_inv(d)).astype(np.int8)


def _quant_q8_0(x: np.ndarray) -> np.ndarray:
    d, q = q8_blocks(x)  # d stored as fp16, q computed with the float32 d
    return np.concatenate([_as_f16_bytes(d), q.view(np.uint8)], axis=-1)


def _quant_sym(x: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """ggml's legacy symmetric scheme: the largest-magnitude value maps to -levels/2."""
    d = (_signed_absmax(x) / -(levels // 2)).astype(np.float16).astype(np.float32)
    q = np.clip(np.round(x * _safe_inv(d)) + levels // 2, 0, levels - 1).astype(np.uint8)
    return d, q


def _quant_affine(x: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lo = x.min(axis=-1, keepdims=True).astype(np.float16).astype(np.float32)
    d = ((x.max(axis=-1, keepdims=True) - lo) / (levels - 1)).astype(np.float16).astype(np.float32)
    q = np.clip(np.round((x - lo) * _safe_inv(d)), 0, levels - 1).astype(np.uint8)
    return d, lo, q


def _quant_q4_0(x: np.ndarray) -> np.ndarray:
    d, q = _quant_sym(x, 16)
    return np.concatenate([_as_f16_bytes(d), _pack_nibbles(q)], axis=-1)


def _quant_q4_1(x: np.ndarray) -> np.ndarray:
    d, m, q = _quant_affine(x, 16)
    return np.concatenate([_as_f16_bytes(d), _as_f16_bytes(m), _pack_nibbles(q)], axis=-1)


def _split5(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """5-bit values (n, 32) -> (qh: 4 bytes of high bits, qs: 16 bytes of nibbles)."""
    qh = np.packbits(q >> 4, axis=-1, bitorder="little")
    return qh, _pack_nibbles(q & 0x0F)


def _quant_q5_0(x: np.ndarray) -> np.ndarray:
    d, q = _quant_sym(x, 32)
    qh, qs = _split5(q)
    return np.concatenate([_as_f16_bytes(d), qh, qs], axis=-1)


def _quant_q5_1(x: np.ndarray) -> np.ndarray:
    d, m, q = _quant_affine(x, 32)
    qh, qs = _split5(q)
    return np.concatenate([_as_f16_bytes(d), _as_f16_bytes(m), qh, qs], axis=-1)


def _f16_up(v: np.ndarray) -> np.ndarray:
    """Round to fp16 no smaller than v (v >= 0): the stored scale then covers the range."""
    return (v * np.float32(1 + 2**-10)).astype(np.float16).astype(np.float32)


def _quant_k_affine(x: np.ndarray, levels: int):
    """Q4_K/Q5_K: per 32-element sub-block y = (d*sc)*q - (dmin*m), sc and m 6-bit.

    Scales are rounded up so each sub-block's range is covered (no clipping).
    Returns d, dmin (n, 1) f32, sc, m (n, 8) uint8, q (n, 8, 32) uint8.
    """
    n = x.shape[0]
    sub = x.reshape(n, 8, 32)
    neg_lo = -np.minimum(sub.min(axis=-1), 0)  # the offset is subtracted, so it is >= 0
    dmin = _f16_up(neg_lo.max(axis=-1, keepdims=True) / 63)
    m = np.clip(np.ceil(neg_lo * _safe_inv(dmin)), 0, 63).astype(np.uint8)
    ml = dmin * m.astype(np.float32)  # (n, 8)
    scale = (sub.max(axis=-1) + ml) / (levels - 1)
    d = _f16_up(scale.max(axis=-1, keepdims=True) / 63)
    sc = np.clip(np.ceil(scale * _safe_inv(d)), 0, 63).astype(np.uint8)
    dl = (d * sc.astype(np.float32))[..., None]
    q = np.clip(np.round((sub + ml[..., None]) * _safe_inv(dl)), 0, levels - 1).astype(np.uint8)
    return d, dmin, sc, m, q


def _pack_k_nibbles(q: np.ndarray) -> np.ndarray:
    """(n, 8, 32) nibbles -> (n, 128) bytes, inverse of _k_nibbles."""
    pairs = q.reshape(-1, 4, 2, 32)
    return (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(-1, 128).astype(np.uint8)


def _quant_q4_k(x: np.ndarray) -> np.ndarray:
    d, dmin, sc, m, q = _quant_k_affine(x, 16)
    return np.concatenate(
        [_as_f16_bytes(d), _as_f16_bytes(dmin), _pack_k_scales(sc, m), _pack_k_nibbles(q)], axis=-1)


def _quant_q5_k(x: np.ndarray) -> np.ndarray:
    d, dmin, sc, m, q = _quant_k_affine(x, 32)
    # qh[l] bit s = high bit of element l of sub-block s
    hi = (q >> 4).astype(np.uint8)  # (n, 8, 32)
    qh = (hi << np.arange(8, dtype=np.uint8).reshape(1, 8, 1)).sum(axis=1, dtype=np.uint8)
    return np.concatenate(
        [_as_f16_bytes(d), _as_f16_bytes(dmin), _pack_k_scales(sc, m), qh, _pack_k_nibbles(q & 0x0F)],
        axis=-1)


def _quant_q6_k(x: np.ndarray) -> np.ndarray:
    n = x.shape[0]
    sub = x.reshape(n, 16, 16)
    scale = _signed_absmax(sub.reshape(n * 16, 16)).reshape(n, 16) / -32  # max-magnitude -> q = -32
    d = (np.abs(scale).max(axis=-1, keepdims=True) / 127).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(scale * _safe_inv(d)), -127, 127).astype(np.int8)
    dl = (d * sc.astype(np.float32))[..., None]  # (n, 16, 1)
    q = (np.clip(np.round(sub * _safe_inv(dl)), -32, 31) + 32).astype(np.uint8)
    q = q.reshape(n, 2, 4, 32)  # (half, k, l) as in _dequant_q6_k
    lo, hi = q & 0x0F, q >> 4
    ql = lo[:, :, 0:2] | (lo[:, :, 2:4] << 4)  # (n, 2, k % 2, 32): nibble k // 2
    qh = (hi << np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)).sum(axis=2, dtype=np.uint8)
    return np.concatenate(
        [ql.reshape(n, 128), qh.reshape(n, 64), sc.view(np.uint8), _as_f16_bytes(d)], axis=-1)


def _quant_q2_k(x: np.ndarray) -> np.ndarray:
    # per 16-value sub-block y = (d*sc)*q - (dmin*m), sc, m 4 bits, q 2 bits: _quant_k_affine's scheme
    n = x.shape[0]
    sub = x.reshape(n, 16, 16)
    neg_lo = -np.minimum(sub.min(axis=-1), 0)
    dmin = _f16_up(neg_lo.max(axis=-1, keepdims=True) / 15)
    m = np.clip(np.ceil(neg_lo * _safe_inv(dmin)), 0, 15).astype(np.uint8)
    ml = dmin * m.astype(np.float32)
    scale = (sub.max(axis=-1) + ml) / 3
    d = _f16_up(scale.max(axis=-1, keepdims=True) / 15)
    sc = np.clip(np.ceil(scale * _safe_inv(d)), 0, 15).astype(np.uint8)
    dl = (d * sc.astype(np.float32))[..., None]
    q = np.clip(np.round((sub + ml[..., None]) * _safe_inv(dl)), 0, 3).astype(np.uint8)
    return np.concatenate([sc | (m << 4), _pack_crumbs(q.reshape(n, QK_K)), _as_f16_bytes(d), _as_f16_bytes(dmin)],
                          axis=-1)


def _pack_crumbs(q: np.ndarray) -> np.ndarray:
    """(n, 256) 2-bit values -> (n, 64) bytes, inverse of _crumbs."""
    q = q.reshape(-1, 2, 4, 32) << np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    return q.sum(axis=2, dtype=np.uint8).reshape(-1, 64)


def _quant_q3_k(x: np.ndarray) -> np.ndarray:
    # per 16-value sub-block y = (d * sc) * q, sc 6 bits signed, q in -4..3 (the largest magnitude -> -4)
    n = x.shape[0]
    sub = x.reshape(n, 16, 16)
    scale = _signed_absmax(sub.reshape(n * 16, 16)).reshape(n, 16) / -4
    d = (np.abs(scale).max(axis=-1, keepdims=True) / 31).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(scale * _safe_inv(d)), -32, 31).astype(np.int8)
    dl = (d * sc.astype(np.float32))[..., None]
    q = (np.clip(np.round(sub * _safe_inv(dl)), -4, 3) + 4).astype(np.uint8).reshape(n, QK_K)
    hmask = ((q >> 2).reshape(n, 8, 32) << np.arange(8, dtype=np.uint8).reshape(1, 8, 1)).sum(axis=1, dtype=np.uint8)
    u = (sc.astype(np.int16) + 32).astype(np.uint8)  # (n, 16) six bits
    lo = (u[:, :8] & 0x0F) | ((u[:, 8:] & 0x0F) << 4)
    hi = ((u >> 4).reshape(n, 4, 4) << np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1)).sum(axis=1, dtype=np.uint8)
    return np.concatenate([hmask, _pack_crumbs(q & 3), lo, hi, _as_f16_bytes(d)], axis=-1)


def _nearest_level(v: np.ndarray) -> np.ndarray:
    """The index of the IQ4 level nearest each value (in units of the block's scale)."""
    return np.abs(v[..., None] - IQ4_LEVELS.astype(np.float32)).argmin(axis=-1).astype(np.uint8)


def _quant_iq4_nl(x: np.ndarray) -> np.ndarray:
    d = (_signed_absmax(x) / -127).astype(np.float16).astype(np.float32)  # the largest magnitude -> -127
    return np.concatenate([_as_f16_bytes(d), _pack_nibbles(_nearest_level(x * _safe_inv(d)))], axis=-1)


def _quant_iq4_xs(x: np.ndarray) -> np.ndarray:
    n = x.shape[0]
    sub = x.reshape(n, 8, 32)
    scale = _signed_absmax(sub.reshape(n * 8, 32)).reshape(n, 8) / -127
    d = (np.abs(scale).max(axis=-1, keepdims=True) / 31).astype(np.float16).astype(np.float32)
    ls = np.clip(np.round(scale * _safe_inv(d)), -32, 31).astype(np.int16) + 32  # (n, 8) six bits
    dl = (d * (ls - 32).astype(np.float32))[..., None]
    q = _nearest_level(sub * _safe_inv(dl)).reshape(n * 8, 32)
    sl = (ls[:, 0::2] & 0x0F) | ((ls[:, 1::2] & 0x0F) << 4)
    sh = ((ls >> 4) << (2 * np.arange(8))).sum(axis=-1).astype(np.uint16).reshape(n, 1)
    return np.concatenate([_as_f16_bytes(d), sh.view(np.uint8), sl.astype(np.uint8),
                           _pack_nibbles(q).reshape(n, 128)], axis=-1)


def _quant_mxfp4(x: np.ndarray) -> np.ndarray:
    # the exponent puts the block's largest magnitude in the levels' top octave (as gguf-py's quantizer)
    amax = np.abs(x).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        e = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1))) - 2 + 127, 0).astype(np.uint8)
    d = e8m0_half(e)[..., None]  # the nearest level compared at the values' scale, as gguf-py does (its ties)
    q = np.abs(d * MXFP4_LEVELS.astype(np.float32) - x[..., None]).argmin(axis=-1).astype(np.uint8)
    return np.concatenate([e, _pack_nibbles(q)], axis=-1)


def _quant_bf16(x: np.ndarray) -> np.ndarray:
    # round to nearest even on the dropped 16 bits (finite inputs)
    u = x.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16).view(np.uint8)


_QUANT = {
    F32: lambda x: x.view(np.uint8),
    F16: lambda x: x.astype(np.float16).view(np.uint8),
    BF16: _quant_bf16,
    Q8_0: _quant_q8_0, Q4_0: _quant_q4_0, Q4_1: _quant_q4_1,
    Q5_0: _quant_q5_0, Q5_1: _quant_q5_1,
    Q4_K: _quant_q4_k, Q5_K: _quant_q5_k, Q6_K: _quant_q6_k,
    Q2_K: _quant_q2_k, Q3_K: _quant_q3_k, IQ4_NL: _quant_iq4_nl, IQ4_XS: _quant_iq4_xs,
    MXFP4: _quant_mxfp4,
}


def quantize(x: np.ndarray, qtype: int) -> np.ndarray:
    """float array (..., n_cols) -> raw uint8 (rows, row_bytes); 1-D input is one row."""
    if qtype not in _QUANT:
        raise ValueError(f"unsupported quant type {qtype_name(qtype)}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    n_cols = x.shape[-1] if x.ndim else 1
    rb = row_bytes(qtype, n_cols)
    blocks = x.reshape(-1, BLOCK_ELEMS[qtype])  # (n_blocks, block_elems)
    out = _QUANT[qtype](blocks).reshape(-1)
    return np.ascontiguousarray(out, dtype=np.uint8).reshape(-1, rb)
