"""The NumPy reference forward pass: the truth every fast path is judged by.

One sequence, a contiguous KV cache, weights dequantized to float32, float32 math.
It follows llama.cpp's graph for the archs we support:

    x = token_embd[ids]
    per layer:  h = rmsnorm(x) * attn_norm
                q, k, v = h @ Wq.T (+bq), h @ Wk.T (+bk), h @ Wv.T (+bv)
                q, k = rmsnorm_per_head(q, k) * q_norm, k_norm      (qwen3)
                q, k = rope(q, k, positions)                         (norm: pairs (2i, 2i+1); neox: (i, i+d/2))
                x += softmax(q k^T / sqrt(d) + causal) v @ Wo.T      (query head h reads KV head h // group)
                h = rmsnorm(x) * ffn_norm
                x += (silu(h @ Wgate.T) * (h @ Wup.T)) @ Wdown.T
    logits = (rmsnorm(x) * output_norm) @ W_out.T                    (W_out = token_embd when tied)

Every array is asserted float32: NumPy 2 promotes to float64 on a stray Python
float64 scalar, which would make the reference slower and no longer float32 math.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sharpinf.model.config import ModelConfig
from sharpinf.model.loader import LoadedModel, load_model
from sharpinf.ops.kv_cache import decode_kv, encode_kv

F32 = np.float32


def _f32(a: np.ndarray) -> np.ndarray:
    assert a.dtype == F32, f"reference: expected float32, got {a.dtype}"
    return a


def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x: [..., d] -> x / sqrt(mean(x^2) + eps) * weight."""
    ms = np.mean(x * x, axis=-1, keepdims=True, dtype=F32)
    return _f32(x / np.sqrt(ms + F32(eps)) * weight)


def rope_cos_sin(positions: np.ndarray, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin of shape [T, head_dim // 2]: angle = pos * theta^(-2i/d) for pair i."""
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = positions.astype(np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(F32), np.sin(angles).astype(F32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, style: str) -> np.ndarray:
    """x: [T, heads, d]; rotate each pair by its angle. `norm`: (2i, 2i+1); `neox`: (i, i + d/2)."""
    c, s = cos[:, None, :], sin[:, None, :]
    if style == "norm":
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * c - b * s
        out[..., 1::2] = a * s + b * c
        return _f32(out)
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return _f32(np.concatenate([a * c - b * s, a * s + b * c], axis=-1))


def silu(x: np.ndarray) -> np.ndarray:
    return _f32(x / (F32(1) + np.exp(-x)))


@dataclass
class LayerWeights:
    attn_norm: np.ndarray  # [d]
    wqkv: np.ndarray  # [q_dim + 2 kv_dim, d]: Q, K, V rows stacked (one matmul, same math)
    bqkv: np.ndarray | None  # [q_dim + 2 kv_dim] (qwen2)
    q_norm: np.ndarray | None  # [head_dim] (qwen3)
    k_norm: np.ndarray | None
    wo: np.ndarray  # [d, q_dim]
    ffn_norm: np.ndarray
    w_gate_up: np.ndarray  # [2 n_ff, d]: gate rows then up rows
    w_down: np.ndarray  # [d, n_ff]


@dataclass
class KVCache:
    """Contiguous per-layer K and V: [n_layer, capacity, n_head_kv, head_dim]."""

    k: np.ndarray
    v: np.ndarray
    length: int = 0

    @classmethod
    def empty(cls, cfg: ModelConfig, capacity: int) -> "KVCache":
        shape = (cfg.n_layer, capacity, cfg.n_head_kv, cfg.head_dim)
        return cls(np.zeros(shape, F32), np.zeros(shape, F32))


@dataclass
class Reference:
    model: LoadedModel
    # How the KV cache stores K and V. "f32" is the plain reference; "f16", "bf16" and
    # "q8_0" round each stored row exactly as the paged KV cache does (ops/kv_cache.py's
    # NumPy encoder), so kernels with a narrow KV cache can be held to a tight tolerance.
    kv_dtype: str = "f32"
    cfg: ModelConfig = field(init=False)
    layers: list[LayerWeights] = field(init=False)

    def __post_init__(self):
        m, cfg = self.model, self.model.config
        self.cfg = cfg

        def w(name: str) -> np.ndarray:
            return np.ascontiguousarray(_f32(m.tensor(name).dequantize()))

        def opt(name: str) -> np.ndarray | None:
            return w(name) if name in m.tensors else None

        self.token_embd = w("token_embd.weight")
        self.output_norm = w("output_norm.weight")
        self.output = self.token_embd if cfg.tied_output else w("output.weight")
        self.layers = []
        for i in range(cfg.n_layer):
            p = f"blk.{i}."
            biases = [opt(p + f"attn_{n}.bias") for n in "qkv"]
            self.layers.append(
                LayerWeights(
                    attn_norm=w(p + "attn_norm.weight"),
                    wqkv=np.concatenate([w(p + f"attn_{n}.weight") for n in "qkv"]),
                    bqkv=np.concatenate(biases) if biases[0] is not None else None,
                    q_norm=opt(p + "attn_q_norm.weight"),
                    k_norm=opt(p + "attn_k_norm.weight"),
                    wo=w(p + "attn_output.weight"),
                    ffn_norm=w(p + "ffn_norm.weight"),
                    w_gate_up=np.concatenate([w(p + "ffn_gate.weight"), w(p + "ffn_up.weight")]),
                    w_down=w(p + "ffn_down.weight"),
                )
            )

    def _stored(self, rows: np.ndarray) -> np.ndarray:
        """K or V rows [T, kv_heads, head_dim] as the cache will hand them back."""
        if self.kv_dtype == "f32":
            return rows
        return _f32(decode_kv(self.kv_dtype, encode_kv(self.kv_dtype, rows)))

    @classmethod
    def from_path(cls, path: str | Path) -> "Reference":
        return cls(load_model(path))

    def new_cache(self, capacity: int | None = None) -> KVCache:
        return KVCache.empty(self.cfg, capacity or self.cfg.context_length)

    # -- the forward pass ----------------------------------------------------------
    def forward(self, token_ids, cache: KVCache) -> np.ndarray:
        """Run tokens at positions cache.length.. ; append their K/V; return logits [T, vocab]."""
        cfg = self.cfg
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        T, start = len(ids), cache.length
        if T == 0:
            raise ValueError("reference.forward: no tokens")
        if start + T > cache.k.shape[1]:
            raise ValueError(f"reference.forward: {start + T} tokens exceed the cache of {cache.k.shape[1]}")
        if ids.min() < 0 or ids.max() >= cfg.n_vocab:
            raise ValueError(f"reference.forward: token id out of range [0, {cfg.n_vocab})")
        positions = np.arange(start, start + T)
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta)
        # causal mask over the whole context: query t (absolute start+t) sees keys 0..start+t
        mask = np.where(np.arange(start + T)[None, :] <= positions[:, None], F32(0), F32(-np.inf))
        scale = F32(1.0 / np.sqrt(cfg.head_dim))

        x = self.token_embd[ids]  # [T, d]
        for li, L in enumerate(self.layers):
            h = rmsnorm(x, L.attn_norm, cfg.rms_eps)
            qkv = h @ L.wqkv.T
            if L.bqkv is not None:
                qkv = qkv + L.bqkv
            q = qkv[:, : cfg.q_dim].reshape(T, cfg.n_head, cfg.head_dim)
            k = qkv[:, cfg.q_dim : cfg.q_dim + cfg.kv_dim].reshape(T, cfg.n_head_kv, cfg.head_dim)
            v = qkv[:, cfg.q_dim + cfg.kv_dim :].reshape(T, cfg.n_head_kv, cfg.head_dim)
            if L.q_norm is not None:
                q = rmsnorm(q, L.q_norm, cfg.rms_eps)
                k = rmsnorm(k, L.k_norm, cfg.rms_eps)
            q = apply_rope(q, cos, sin, cfg.rope_style)
            k = apply_rope(k, cos, sin, cfg.rope_style)
            cache.k[li, start : start + T] = self._stored(k)
            cache.v[li, start : start + T] = self._stored(v)
            keys = cache.k[li, : start + T]  # [S, kv_heads, d]
            vals = cache.v[li, : start + T]
            attn = np.empty((T, cfg.n_head, cfg.head_dim), F32)
            for kvh in range(cfg.n_head_kv):
                heads = slice(kvh * cfg.gqa_group, (kvh + 1) * cfg.gqa_group)  # query heads of this KV head
                s = np.einsum("thd,sd->hts", q[:, heads], keys[:, kvh]) * scale + mask  # [g, T, S]
                p = np.exp(s - s.max(axis=-1, keepdims=True))
                p /= p.sum(axis=-1, keepdims=True)
                attn[:, heads] = np.einsum("hts,sd->thd", p, vals[:, kvh])
            x = _f32(x + attn.reshape(T, cfg.q_dim) @ L.wo.T)
            h = rmsnorm(x, L.ffn_norm, cfg.rms_eps)
            gu = h @ L.w_gate_up.T
            x = _f32(x + (silu(gu[:, : cfg.n_ff]) * gu[:, cfg.n_ff :]) @ L.w_down.T)
        cache.length = start + T
        return _f32(rmsnorm(x, self.output_norm, cfg.rms_eps) @ self.output.T)

    def logits(self, token_ids) -> np.ndarray:
        """Teacher-forced logits [T, vocab] for a whole sequence from an empty cache."""
        return self.forward(token_ids, self.new_cache(len(token_ids)))

    def generate(self, prompt_ids, max_tokens: int, stop_ids=(), on_token=None) -> list[int]:
        """Greedy: prefill the prompt, then decode one token at a time (ties to the lowest id)."""
        cache = self.new_cache(min(self.cfg.context_length, len(prompt_ids) + max_tokens))
        last = self.forward(prompt_ids, cache)[-1]
        out: list[int] = []
        while len(out) < max_tokens:
            tok = int(np.argmax(last))
            out.append(tok)
            if on_token is not None:
                on_token(tok)
            if tok in stop_ids or len(out) == max_tokens or cache.length >= cache.k.shape[1]:
                break
            last = self.forward([tok], cache)[-1]
        return out
