"""Seeded synthetic GGUF models: small, valid llama.cpp-shaped files for tests.

Same arguments -> same bytes. Weights are random but scaled like a trained model's
(unit-RMS residual stream, 1/sqrt(fan_in) projections) so a 2-layer model's logits
spread out and greedy decoding has clear winners.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from . import quants
from .config import MOE_ARCHS, MOE_MAX_EXPERTS, MOE_MAX_USED, SUPPORTED_ARCHS
from .synth_gpt_oss import gpt_oss_weights

# the types of 256-value super-blocks: their rows (n_embd, n_ff) default to 256 values
K_QUANTS = ("Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K", "IQ4_XS")
GEMMA = ("gemma3", "gemma2")  # their norms, embedding scale and SentencePiece vocabulary
# overrides that are not raw GGUF keys
_KNOWN_OVERRIDES = {"n_vocab", "head_dim", "rope_theta", "rms_eps", "sliding_window"}


def write_synthetic_model(
    path: str | Path,
    arch: str = "llama",
    qtype: str = "Q8_0",
    *,
    seed: int = 0,
    n_layer: int = 2,
    n_embd: int | None = None,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int | None = None,
    context_length: int = 1024,
    tied: bool = True,
    norm_qtype: str = "F32",
    tile_rows: int | None = None,
    n_expert: int | None = None,
    n_expert_used: int = 2,
    n_ff_exp: int | None = None,
    routing: str = "spread",
    extra_tensors: dict[str, Any] | None = None,
    rope_factors: int = 0,
    longrope: int = 0,
    expert_qtype: str | None = None,
    **overrides: Any,
) -> Path:
    """Write a GGUF model and return its path.

    tile_rows: for benchmark models of real size (8B-class shapes): each matrix is `tile_rows`
    random rows, quantized once and repeated down the matrix -- valid blocks, real sizes and
    bytes to read, made in seconds without the float matrix ever existing. Not for oracles.

    overrides: n_vocab (512), head_dim (n_embd // n_head; written as key_length for any arch
    when it differs), rope_theta (10000), rms_eps (1e-5), sliding_window (gemma3, gemma2: 16; 0 writes
    no window); any other key containing a dot is written as raw GGUF metadata, replacing the
    generated value. extra_tensors: {name: float array} written as F32 after the model's own (a
    file with a tensor the graph may not read). rope_factors: a Llama 3.1-style rope_freqs.weight
    (llama3_rope_factors) for an original context of that many tokens (0: none). longrope (phi3): LongRoPE
    over an original context of that many tokens -- rope_factors_long/short.weight, the type, the
    original context and Phi-3's attention factor sqrt(1 + ln(context / original) / ln(original)).

    gpt-oss: windows (sliding_window, default 16) on every other layer, YaRN (4x over 256), n_expert (8) experts
    in expert_qtype (MXFP4), an untied head, the biases and sinks of synth_gpt_oss.
    gemma2: gemma3's norms and vocabulary without Q/K norms, a window on every other layer, llama.cpp's
    default softcaps (attention 50, logits 30) written out.
    gemma3: Q/K norms and the post-attention and post-FFN norms, a SentencePiece vocabulary, and, as
    llama.cpp reads it, a window on every layer but 5, 11, ... (6 layers or more have both kinds).

    qwen3moe: qwen3's attention, and in every layer n_expert (default 8) SwiGLU experts of n_ff_exp
    (default n_ff) and an F32 router (as llama.cpp's quantize leaves it). llama with n_expert > 0:
    Mixtral-style, llama's attention and the same experts, their length written as
    feed_forward_length (llama.cpp reads no expert_feed_forward_length for llama). routing: "spread" (random router
    rows scaled so the logits are a few units wide: tokens spread over the experts), "skewed"
    (every router row the same: all logits tie exactly, so every token takes experts 0..k-1 with
    weights 1/k -- one group holds every token), "ties" (rows 2j and 2j+1 equal: every expert ties
    with its neighbour, so the lower-id rule decides the rank order and, with an odd k, the set).
    """
    from .synth_vocab import synthetic_spm_tokenizer_metadata, synthetic_tokenizer_metadata  # lazily: BPE training

    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"unknown arch {arch!r}; supported: {', '.join(SUPPORTED_ARCHS)}")
    bad = [k for k in overrides if k not in _KNOWN_OVERRIDES and "." not in k]
    if bad:
        raise TypeError(f"unknown overrides {bad}")
    wq, nq = quants.qtype_from_name(qtype), quants.qtype_from_name(norm_qtype)
    k_quant = qtype.upper() in K_QUANTS
    n_embd = n_embd or (256 if k_quant else 64)
    n_ff = n_ff or (256 if k_quant else 128)
    head_dim = overrides.get("head_dim", n_embd // n_head)
    n_vocab = overrides.get("n_vocab", 512)
    q_dim, kv_dim = n_head * head_dim, n_head_kv * head_dim
    if n_expert and arch not in MOE_ARCHS:
        raise ValueError(f"{arch} has no experts (the MoE archs: {', '.join(MOE_ARCHS)})")
    moe = arch in ("qwen3moe", "gpt-oss") or bool(n_expert)
    tied, oss = tied and arch != "gpt-oss", arch == "gpt-oss"
    eq = quants.qtype_from_name(expert_qtype or ("MXFP4" if oss else qtype))
    n_expert = 8 if n_expert is None and moe else n_expert
    if moe and not (0 < n_expert <= MOE_MAX_EXPERTS and 0 < n_expert_used <= min(n_expert, MOE_MAX_USED)):
        raise ValueError(f"experts: {n_expert} a layer, {n_expert_used} a token (must be 1..{MOE_MAX_EXPERTS} and "
                         f"1..min(experts, {MOE_MAX_USED}))")
    if moe and routing not in ROUTINGS:
        raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
    n_ff_exp = n_ff_exp or n_ff
    if moe and arch == "llama":  # the experts' length is the FFN length
        n_ff = n_ff_exp

    meta: dict[str, Any] = {
        # not "phi3" in a phi3 file's name: llama.cpp (and sharpinf: tokenizer.py's RSTRIP_NAMES) then strips
        # spaces after its special tokens, and llama.cpp wants a "</s>", which the synthetic vocabulary lacks
        "general.name": f"sharpinf-synthetic-{'phi' if arch == 'phi3' else arch}-{qtype}",
        f"{arch}.block_count": n_layer,
        f"{arch}.context_length": context_length,
        f"{arch}.embedding_length": n_embd,
        f"{arch}.feed_forward_length": n_ff,
        f"{arch}.attention.head_count": n_head,
        f"{arch}.attention.head_count_kv": n_head_kv,
        f"{arch}.rope.freq_base": float(overrides.get("rope_theta", 1e6 if arch == "gemma3" else 10000.0)),
        f"{arch}.attention.layer_norm_rms_epsilon": float(overrides.get("rms_eps", 1e-5)),
        f"{arch}.vocab_size": n_vocab,
        "general.file_type": _FILE_TYPE[qtype.upper()],
        "general.quantization_version": 2,
    }
    if (arch in GEMMA or oss) and overrides.get("sliding_window", 16):
        meta[f"{arch}.attention.sliding_window"] = int(overrides.get("sliding_window", 16))
    if arch == "gemma2":  # llama.cpp's defaults, written out
        meta.update({f"{arch}.attn_logit_softcapping": 50.0, f"{arch}.final_logit_softcapping": 30.0})
    if moe:
        meta[f"{arch}.expert_count"] = n_expert
        meta[f"{arch}.expert_used_count"] = n_expert_used
        if arch in ("qwen3moe", "gpt-oss"):
            meta[f"{arch}.expert_feed_forward_length"] = n_ff_exp
    if oss:  # YaRN as the real files have it (factor 32 over 4096 there)
        meta.update({f"{arch}.rope.scaling.type": "yarn", f"{arch}.rope.scaling.factor": 4.0,
                     f"{arch}.rope.scaling.original_context_length": 256})
    if arch in ("qwen3", "gemma3", "qwen3moe", "gpt-oss") or head_dim != n_embd // n_head:
        meta[f"{arch}.attention.key_length"] = head_dim
        meta[f"{arch}.attention.value_length"] = head_dim
    # gemma3 comes with a SentencePiece vocabulary, as the real ones do; the others byte-level BPE
    vocab = synthetic_spm_tokenizer_metadata if arch in GEMMA else synthetic_tokenizer_metadata
    meta.update(vocab(n_vocab=n_vocab, seed=0))
    if longrope:
        meta.update({f"{arch}.rope.scaling.type": "longrope", f"{arch}.rope.scaling.original_context_length": longrope,
                     f"{arch}.rope.scaling.attn_factor": float(np.sqrt(1 + np.log(context_length / longrope)
                                                                          / np.log(longrope)))})
    meta.update({k: v for k, v in overrides.items() if "." in k})

    weights = _weights(arch, seed, n_layer, n_embd, n_ff, n_vocab, q_dim, kv_dim, head_dim, tied, tile_rows,
                       (n_expert, n_ff_exp, routing) if moe else None)
    if oss:
        weights = gpt_oss_weights(weights, seed, n_layer, n_head)
    if arch == "phi3":
        if tile_rows:
            raise ValueError("phi3's fused matrices are not written tiled (tile_rows)")
        weights = _fused_phi3(weights, n_layer)

    path = Path(path)
    writer = gguf.GGUFWriter(path, arch)
    for key, value in meta.items():
        _add_kv(writer, key, value)
    for name, x in weights.items():
        t = nq if x.ndim == 1 or name.endswith(".bias") else eq if "_exps." in name else wq  # norms and biases
        if name.endswith(("ffn_gate_inp.weight", "attn_sinks.weight")):
            t = quants.F32  # the router and the sinks: llama.cpp's quantize keeps them in F32
        raw = x.quantize(t) if isinstance(x, _Tiled) else quants.quantize(x, t)  # (rows, row_bytes)
        raw = raw.reshape(_byte_shape(x.shape, t))  # experts: [n_expert, rows, row_bytes]
        writer.add_tensor(name, raw, raw_shape=_byte_shape(x.shape, t), raw_dtype=gguf.GGMLQuantizationType(t))
    if longrope:  # short: mild, long: Llama 3.1-like, both over [head_dim / 2]
        extra_tensors = {"rope_factors_long.weight": llama3_rope_factors(head_dim, meta[f"{arch}.rope.freq_base"],
                                                                         longrope, factor=4.0),
                         "rope_factors_short.weight": np.linspace(1.0, 1.5, head_dim // 2, dtype=np.float32),
                         **(extra_tensors or {})}
    if rope_factors:
        extra_tensors = {"rope_freqs.weight": llama3_rope_factors(
            head_dim, meta[f"{arch}.rope.freq_base"], rope_factors), **(extra_tensors or {})}
    for name, x in (extra_tensors or {}).items():
        writer.add_tensor(name, np.ascontiguousarray(x, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def llama3_rope_factors(head_dim: int, base: float, n_ctx_orig: int, factor: float = 8.0,
                        low_freq_factor: float = 1.0, high_freq_factor: float = 4.0) -> np.ndarray:
    """Llama 3.1's RoPE frequency factors as its converter writes rope_freqs.weight (float32
    [head_dim / 2]): 1 for the pairs whose wavelength is under n_ctx_orig / high_freq_factor,
    `factor` for those over n_ctx_orig / low_freq_factor, a smooth blend between."""
    freqs = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * np.pi / freqs
    smooth = (n_ctx_orig / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blend = 1.0 / ((1 - smooth) / factor + smooth)
    out = np.where(wavelen < n_ctx_orig / high_freq_factor, 1.0, np.where(wavelen > n_ctx_orig / low_freq_factor,
                                                                          factor, blend))
    return out.astype(np.float32)


def _byte_shape(shape: tuple[int, ...], qtype: int) -> tuple[int, ...]:
    return (*shape[:-1], quants.row_bytes(qtype, shape[-1]))


# general.file_type (llama_ftype) llama.cpp writes for a file whose matrices are in qtype
_FILE_TYPE = {
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9,
    "Q4_K": 15, "Q5_K": 17, "Q6_K": 18, "BF16": 32,
    "Q2_K": 10, "Q3_K": 11, "IQ4_NL": 25, "IQ4_XS": 30, "MXFP4": 38,  # Q3_K: Q3_K_S; MXFP4: MXFP4_MOE
}


def _add_kv(writer, key: str, value: Any) -> None:
    """Write a KV with the type llama.cpp uses for it (ids and counts are uint32)."""
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        (writer.add_uint32 if value >= 0 else writer.add_int32)(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, (list, tuple)):
        writer.add_array(key, list(value))
    else:
        raise TypeError(f"cannot write metadata {key!r} of type {type(value).__name__}")


def _fused_phi3(w: dict[str, np.ndarray], n_layer: int) -> dict[str, np.ndarray]:
    """phi3's layout of the same weights: attn_qkv = Q's rows, K's, V's; ffn_up = the gate's, the up's."""
    out = {}
    for name, x in w.items():
        b = name[: name.index(".", 4) + 1] if name.startswith("blk.") else ""
        if name.endswith(("attn_k.weight", "attn_v.weight", "ffn_gate.weight")):
            continue
        if name.endswith("attn_q.weight"):
            out[b + "attn_qkv.weight"] = np.concatenate([x, w[b + "attn_k.weight"], w[b + "attn_v.weight"]])
        elif name.endswith("ffn_up.weight"):
            out[name] = np.concatenate([w[b + "ffn_gate.weight"], x])
        else:
            out[name] = x
    return out


class _Tiled:
    """A matrix of `rows` distinct rows repeated to n_out (write_synthetic_model's tile_rows); with
    n_expert, n_expert such matrices stacked ([n_expert, n_out, n_in], the rows repeated down all)."""

    def __init__(self, rows: np.ndarray, n_out: int, n_expert: int = 0):
        self.rows = rows
        self.shape = (n_expert, n_out, rows.shape[1]) if n_expert else (n_out, rows.shape[1])
        self.ndim = len(self.shape)

    def quantize(self, qtype: int) -> np.ndarray:
        raw = quants.quantize(self.rows, qtype)
        n = int(np.prod(self.shape[:-1]))
        return np.tile(raw, (-(-n // raw.shape[0]), 1))[:n]


ROUTINGS = ("spread", "skewed", "ties")


def _weights(arch, seed, n_layer, n_embd, n_ff, n_vocab, q_dim, kv_dim, head_dim, tied,
             tile_rows: int | None = None, experts: tuple[int, int, str] | None = None) -> dict[str, np.ndarray]:
    """name -> float32 array in numpy order ((out, in) for matrices), in GGUF file order."""
    rng = np.random.default_rng(seed)

    def mat(out_f: int, in_f: int, gain: float = 1.0) -> np.ndarray:
        if tile_rows:
            return _Tiled((rng.standard_normal((min(tile_rows, out_f), in_f)) * (gain / np.sqrt(in_f))).astype(np.float32),
                          out_f)
        return (rng.standard_normal((out_f, in_f)) * (gain / np.sqrt(in_f))).astype(np.float32)

    def stacked(n_expert: int, out_f: int, in_f: int, gain: float = 1.0) -> np.ndarray:
        """n_expert matrices [n_expert, out_f, in_f], each scaled like mat()."""
        if tile_rows:
            rows = rng.standard_normal((min(tile_rows, n_expert * out_f), in_f)) * (gain / np.sqrt(in_f))
            return _Tiled(rows.astype(np.float32), out_f, n_expert)
        return (rng.standard_normal((n_expert, out_f, in_f)) * (gain / np.sqrt(in_f))).astype(np.float32)

    def router(n_expert: int, routing: str) -> np.ndarray:
        # gain 2: the normed h has unit RMS, so the logits are ~2 wide and the top-k varies by token
        r = (rng.standard_normal((n_expert, n_embd)) * (2.0 / np.sqrt(n_embd))).astype(np.float32)
        if routing == "skewed":
            r[:] = r[0]
        elif routing == "ties":
            r[1::2] = r[0::2][: n_expert // 2]
        return r

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    def bias(n: int) -> np.ndarray:
        return (0.1 * rng.standard_normal(n)).astype(np.float32)

    # Unit-variance embedding; tied, logits come out ~ sqrt(n_embd) wide. gemma3 scales the rows by
    # sqrt(n_embd) as it reads them, so they are stored that much smaller (as in the real model).
    emb_gain = 1.0 / np.sqrt(n_embd) if arch in GEMMA else 1.0
    w = {"token_embd.weight": mat(n_vocab, n_embd, np.sqrt(n_embd) * emb_gain) if tile_rows
         else (rng.standard_normal((n_vocab, n_embd)) * emb_gain).astype(np.float32)}
    for i in range(n_layer):
        b = f"blk.{i}."
        w[b + "attn_norm.weight"] = norm(n_embd)
        # gain 2 on q/k: sharper attention than pure 1/sqrt(fan_in), so positions matter
        w[b + "attn_q.weight"] = mat(q_dim, n_embd, 2.0)
        w[b + "attn_k.weight"] = mat(kv_dim, n_embd, 2.0)
        w[b + "attn_v.weight"] = mat(kv_dim, n_embd)
        if arch == "qwen2":
            w[b + "attn_q.bias"], w[b + "attn_k.bias"], w[b + "attn_v.bias"] = bias(q_dim), bias(kv_dim), bias(kv_dim)
        if arch in ("qwen3", "gemma3", "qwen3moe"):
            w[b + "attn_q_norm.weight"], w[b + "attn_k_norm.weight"] = norm(head_dim), norm(head_dim)
        # gain 4 on the residual writes: the layers then outweigh the unit embedding, so a
        # tied head does not just echo the input token back (checked: gaps ~1, few copies)
        w[b + "attn_output.weight"] = mat(n_embd, q_dim, 4.0)
        if arch in GEMMA:  # (llama.cpp's tensor order)
            w[b + "post_attention_norm.weight"] = norm(n_embd)
        w[b + "ffn_norm.weight"] = norm(n_embd)
        if experts:  # (llama.cpp's tensor order: router, gate, down, up)
            n_expert, n_ff_exp, routing = experts
            w[b + "ffn_gate_inp.weight"] = router(n_expert, routing)
            w[b + "ffn_gate_exps.weight"] = stacked(n_expert, n_ff_exp, n_embd)
            w[b + "ffn_down_exps.weight"] = stacked(n_expert, n_embd, n_ff_exp, 4.0)
            w[b + "ffn_up_exps.weight"] = stacked(n_expert, n_ff_exp, n_embd)
        else:
            w[b + "ffn_gate.weight"] = mat(n_ff, n_embd)
            w[b + "ffn_up.weight"] = mat(n_ff, n_embd)
            w[b + "ffn_down.weight"] = mat(n_embd, n_ff, 4.0)
        if arch in GEMMA:
            w[b + "post_ffw_norm.weight"] = norm(n_embd)
    # gemma3's post-norms keep the residual near unit size: gain 4 on the final norm spreads its
    # tied logits like the other archs' (clear greedy winners)
    w["output_norm.weight"] = norm(n_embd) * np.float32(4.0 if arch in GEMMA else 1.0)
    if not tied:
        # gain 4: logits ~4 wide, like a tied head on a small model
        w["output.weight"] = mat(n_vocab, n_embd, 4.0)
    return w


def _cache_dir() -> Path:
    d = Path(tempfile.gettempdir()) / f"sharpinf-synth-{os.getuid() if hasattr(os, 'getuid') else 0}"
    d.mkdir(parents=True, exist_ok=True)
    return d


def synthetic_model(arch: str = "llama", qtype: str = "Q8_0", **kw: Any) -> Path:
    """write_synthetic_model, cached on disk under a temp dir keyed by the arguments."""
    key_src = repr((arch, qtype, sorted(kw.items()), _GENERATOR_VERSION))
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    path = _cache_dir() / f"{arch}-{qtype}-{key}.gguf"
    if not path.exists():
        # write aside, then rename: parallel test workers never see a half-written file
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        write_synthetic_model(tmp, arch, qtype, **kw)
        os.replace(tmp, path)
    return path


# Bump when the generator's output changes, so stale cached files are not reused.
_GENERATOR_VERSION = 5
