"""The NumPy reference forward pass: the truth every fast path is judged by.

One sequence, a contiguous KV cache, weights dequantized to float32, float32 math.
It follows llama.cpp's graph for the archs we support:

    x = token_embd[ids] (* sqrt(n_embd): gemma3)
    per layer:  h = rmsnorm(x) * attn_norm
                q, k, v = h @ Wq.T (+bq), h @ Wk.T (+bk), h @ Wv.T (+bv)
                q, k = rmsnorm_per_head(q, k) * q_norm, k_norm      (qwen3, gemma3)
                q, k = rope(q, k, positions)                         (norm: pairs (2i, 2i+1); neox: (i, i+d/2);
                                                                      gemma3: base 10000 on windowed layers)
                q *= 1 + s ln(floor(p / n_ctx_orig) + 1)                 (mistral3 with a temperature_scale s)
                a = softmax(q k^T * scale + mask) v @ Wo.T           (query head h reads KV head h // group;
                                                                      gemma2: softcap((q * scale) k^T) + mask;
                                                                      mask: causal, and on a windowed layer
                                                                      keys p-W+1..p only; gpt-oss: each
                                                                      head's sink logit in the softmax,
                                                                      Wo's bias)
                x += a                     (gemma3: x += rmsnorm(a) * post_attention_norm)
                h = rmsnorm(x) * ffn_norm
                f = (act(h @ Wgate.T) * (h @ Wup.T)) @ Wdown.T       (act: silu; gemma3: gelu, tanh form;
                                                                      qwen3moe: the k experts the router
                                                                      picks, weighted, summed in rank
                                                                      order: ops/moe.py; gpt-oss: biased
                                                                      router, top k of its logits then
                                                                      a softmax, biased experts with a
                                                                      clamped SwiGLU)
                x += f                     (gemma3: x += rmsnorm(f) * post_ffw_norm)
    logits = (rmsnorm(x) * output_norm) @ W_out.T                    (W_out = token_embd when tied;
                                                                      cap * tanh(logits / cap) if declared)
With act_quant="q8_1" every matmul's input is first rounded to q8_1 (the dp4a kernels' input).
rmsnorm, RoPE and the activations are the ops' NumPy twins (ops/basic.py, ops/rope.py), in float32.

Every array is asserted float32: NumPy 2 promotes to float64 on a stray Python
float64 scalar, which would make the reference slower and no longer float32 math.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sharpinf.errors import RequestError
from sharpinf.model.config import ModelConfig
from sharpinf.model.loader import LoadedModel, load_model
from sharpinf.ops.basic import glu_reference, rmsnorm_reference
from sharpinf.ops.kv_cache import decode_kv, encode_kv
from sharpinf.ops.moe import WEIGHT_SUM_FLOOR, combine_reference, route_reference, router_logits_reference
from sharpinf.ops.quant_act import round_q8_1
from sharpinf.ops.rope import rope_reference
from sharpinf.model.rope_scaling import model_rope_tables

F32 = np.float32


def _f32(a: np.ndarray) -> np.ndarray:
    assert a.dtype == F32, f"reference: expected float32, got {a.dtype}"
    return a


def linear(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x [T, in] @ w[out, in]^T, computed as (w @ x^T)^T: BLAS then walks w's rows in
    memory order (the reference is bound by reading the weights)."""
    return _f32((w @ x.T).T)


def attention_mask(positions: np.ndarray, n_keys: int, window: int = 0) -> np.ndarray:
    """[T, n_keys] additive mask over absolute key positions: 0 where query p sees key j -- j <= p, and
    with a sliding window W also j > p - W (W keys, its own included; llama.cpp's is_masked_swa) -- else -inf."""
    j, p = np.arange(n_keys)[None, :], positions[:, None]
    visible = (j <= p) & ((j > p - window) if window else True)
    return np.where(visible, F32(0), F32(-np.inf))


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    return _f32(F32(cap) * np.tanh(x / F32(cap))) if cap else x


@dataclass
class LayerWeights:
    attn_norm: np.ndarray  # [d]
    wqkv: np.ndarray  # [q_dim + 2 kv_dim, d]: Q, K, V rows stacked (one matmul, same math)
    bqkv: np.ndarray | None  # [q_dim + 2 kv_dim] (qwen2)
    q_norm: np.ndarray | None  # [head_dim] (qwen3)
    k_norm: np.ndarray | None
    wo: np.ndarray  # [d, q_dim]
    ffn_norm: np.ndarray
    w_gate_up: np.ndarray | None  # [2 n_ff, d]: gate rows then up rows (None: an MoE layer)
    w_down: np.ndarray | None  # [d, n_ff]
    post_attn_norm: np.ndarray | None = None  # [d] (gemma3)
    post_ffn_norm: np.ndarray | None = None
    router: np.ndarray | None = None  # [n_expert, d] (qwen3moe)
    exps_gate_up: np.ndarray | None = None  # [n_expert, 2 n_ff_exp, d]: each expert's gate rows then up rows
    exps_down: np.ndarray | None = None  # [n_expert, d, n_ff_exp]
    wo_b: np.ndarray | None = None  # [d] (gpt-oss)
    sinks: np.ndarray | None = None  # [n_head]: one logit a query head in its softmax (gpt-oss)
    router_b: np.ndarray | None = None  # [n_expert]
    exps_gate_up_b: np.ndarray | None = None  # [n_expert, 2 n_ff_exp]: the gate's bias then the up's
    exps_down_b: np.ndarray | None = None  # [n_expert, d]


@dataclass
class KVCache:
    """Contiguous per-layer K and V: [n_layer, capacity, n_head_kv, head_dim]."""

    k: np.ndarray
    v: np.ndarray
    length: int = 0

    @classmethod
    def empty(cls, cfg: ModelConfig, capacity: int) -> "KVCache":
        return cls(*_zeros_kv((cfg.n_layer, capacity, cfg.n_head_kv, cfg.head_dim)))

    def reserve(self, n: int, limit: int) -> None:
        """Room for n positions. The capacity at least doubles (up to limit), so a cache that
        grows one token at a time copies O(n) in all and holds what the sequence uses."""
        cap = self.k.shape[1]
        if n <= cap:
            return
        k, v = _zeros_kv((self.k.shape[0], min(max(n, 2 * cap), limit), *self.k.shape[2:]))
        k[:, :cap], v[:, :cap] = self.k, self.v
        self.k, self.v = k, v


def _zeros_kv(shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """K and V buffers, or one line when they cannot fit: a GGUF may declare a 2**24 context,
    hundreds of GiB of cache, and MemoryError is no message for a user."""
    need = 2 * math.prod(shape) * 4
    try:
        have = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # not on every OS
        have = None
    why = f"a KV cache of {shape[1]:,} positions needs {need / 2**30:.1f} GiB"
    if have is not None and need > have:
        raise RequestError(f"reference: {why}, more than this machine's {have / 2**30:.1f} GiB of memory")
    try:
        return np.zeros(shape, F32), np.zeros(shape, F32)
    except MemoryError:
        raise RequestError(f"reference: {why} and the allocation failed") from None


@dataclass
class Reference:
    model: LoadedModel
    # How the KV cache stores K and V. "f32" is the plain reference; "f16", "bf16" and
    # "q8_0" round each stored row exactly as the paged KV cache does (ops/kv_cache.py's
    # NumPy encoder), so kernels with a narrow KV cache can be held to a tight tolerance.
    kv_dtype: str = "f32"
    # What a linear layer reads. "f32" is the plain reference; "q8_1" rounds the input of every
    # matmul (the LM head's too) to q8_1 and back, as the dp4a kernels read their activations
    # (ops/quant_act.py's NumPy rule), so they are held to a tolerance as tight as the float ones.
    act_quant: str = "f32"
    # What an MoE layer's router and experts read (the moe kernel variant's activations, which may differ
    # from the other linear layers'); None: act_quant.
    moe_act_quant: str | None = None
    # The kernel path's routing of the same tokens, per layer ([T, k] ids), and the router-logit gap
    # within which a different choice is explained by rounding (kernel-vs-reference's route-flip rule):
    # where the kernels chose other experts and every one of them is within route_gap of the
    # reference's own k-th logit (ranked as the logits rank them, up to the gap), the reference
    # follows the kernels' choice; anywhere else it keeps its own. route_flips counts the followed.
    routes: dict[int, np.ndarray] | None = None
    route_gap: float = 0.0
    route_flips: int = 0
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
        self.rope = model_rope_tables(self.model)  # each layer's RoPE table (model/rope_scaling.py)
        self.layers = []
        for i in range(cfg.n_layer):
            p = f"blk.{i}."
            biases = [opt(p + f"attn_{n}.bias") for n in "qkv"]
            moe = cfg.is_moe
            self.layers.append(
                LayerWeights(
                    attn_norm=w(p + "attn_norm.weight"),
                    wqkv=np.concatenate([w(p + f"attn_{n}.weight") for n in "qkv"]),
                    bqkv=np.concatenate(biases) if biases[0] is not None else None,
                    q_norm=opt(p + "attn_q_norm.weight"),
                    k_norm=opt(p + "attn_k_norm.weight"),
                    wo=w(p + "attn_output.weight"),
                    ffn_norm=w(p + "ffn_norm.weight"),
                    w_gate_up=None if moe else np.concatenate([w(p + "ffn_gate.weight"), w(p + "ffn_up.weight")]),
                    w_down=None if moe else w(p + "ffn_down.weight"),
                    post_attn_norm=opt(p + "post_attention_norm.weight"),
                    post_ffn_norm=opt(p + "post_ffw_norm.weight"),
                    router=w(p + "ffn_gate_inp.weight") if moe else None,
                    exps_gate_up=np.concatenate([w(p + "ffn_gate_exps.weight"), w(p + "ffn_up_exps.weight")], axis=1)
                    if moe else None,
                    exps_down=w(p + "ffn_down_exps.weight") if moe else None,
                    wo_b=opt(p + "attn_output.bias"),
                    sinks=opt(p + "attn_sinks.weight"),
                    router_b=opt(p + "ffn_gate_inp.bias"),
                    exps_gate_up_b=np.concatenate([w(p + "ffn_gate_exps.bias"), w(p + "ffn_up_exps.bias")], axis=1)
                    if cfg.has_moe_bias else None,
                    exps_down_b=opt(p + "ffn_down_exps.bias"),
                )
            )

    def _stored(self, rows: np.ndarray) -> np.ndarray:
        """K or V rows [T, kv_heads, head_dim] as the cache will hand them back."""
        if self.kv_dtype == "f32":
            return rows
        return _f32(decode_kv(self.kv_dtype, encode_kv(self.kv_dtype, rows)))

    def _lin(self, x: np.ndarray, w: np.ndarray, act: str | None = None) -> np.ndarray:
        """A linear layer, its input rounded as act (default: act_quant) says."""
        act = act or self.act_quant
        if act == "q8_1":
            x = round_q8_1(x)
        elif act != "f32":
            raise ValueError(f"reference: act_quant must be 'f32' or 'q8_1', got {act!r}")
        return linear(x, w)

    @classmethod
    def from_path(cls, path: str | Path) -> "Reference":
        return cls(load_model(path))

    def new_cache(self, capacity: int | None = None) -> KVCache:
        """A cache of `capacity` positions (default: the whole declared context; it can grow with reserve)."""
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
        x = self.token_embd[ids]  # [T, d]
        if cfg.embd_scale != 1.0:
            x = _f32(x * F32(cfg.embd_scale))
        for li, L in enumerate(self.layers):
            h = self._norm(x, L.attn_norm)
            qkv = self._lin(h, L.wqkv)
            if L.bqkv is not None:
                qkv = qkv + L.bqkv
            q = qkv[:, : cfg.q_dim].reshape(T, cfg.n_head, cfg.head_dim)
            k = qkv[:, cfg.q_dim : cfg.q_dim + cfg.kv_dim].reshape(T, cfg.n_head_kv, cfg.head_dim)
            v = qkv[:, cfg.q_dim + cfg.kv_dim :].reshape(T, cfg.n_head_kv, cfg.head_dim)
            if L.q_norm is not None:
                q, k = self._norm(q, L.q_norm), self._norm(k, L.k_norm)
            rope = self.rope[li]
            # Q and K heads rotate alike: one call over [T, n_head + n_head_kv, d]
            qk = _f32(rope_reference(np.concatenate([q, k], axis=1), positions, rope.freqs, cfg.rope_style, rope.mscale))
            q, k = qk[:, : cfg.n_head], qk[:, cfg.n_head :]
            if cfg.attn_temp_scale:  # mistral3: the queries' temperature by position (1 before n_ctx_orig)
                q = _f32(q * cfg.attn_temp(positions)[:, None, None])
            cache.k[li, start : start + T] = self._stored(k)
            cache.v[li, start : start + T] = self._stored(v)
            mask = attention_mask(positions, start + T, cfg.window(li))
            a = self._lin(self._attention(q, cache.k[li, : start + T], cache.v[li, : start + T], mask, L.sinks), L.wo)
            if L.wo_b is not None:  # gpt-oss
                a = a + L.wo_b
            x = _f32(x + self._post(a, L.post_attn_norm))
            h = self._norm(x, L.ffn_norm)
            f = self._moe(h, L, li, start) if L.router is not None else self._ffn(h, L.w_gate_up, L.w_down)
            x = _f32(x + self._post(f, L.post_ffn_norm))
        cache.length = start + T
        return softcap(self._lin(self._norm(x, self.output_norm), self.output), cfg.final_softcap)

    def _ffn(self, h: np.ndarray, w_gate_up: np.ndarray, w_down: np.ndarray, act: str | None = None,
             b_gate_up: np.ndarray | None = None, b_down: np.ndarray | None = None) -> np.ndarray:
        """glu(h Wg^T + bg, h Wu^T + bu) Wd^T + bd (glu: act(gate) * up, or gpt-oss's clamped SwiGLU), the
        gate and up rows (and biases) stacked; the biases are gpt-oss's experts'."""
        n = w_down.shape[1]
        gu = self._lin(h, w_gate_up, act)
        if b_gate_up is not None:
            gu = gu + b_gate_up
        y = self._lin(_f32(glu_reference(self.cfg.ffn_act, gu[:, :n], gu[:, n:])), w_down, act)
        return y if b_down is None else y + b_down

    @property
    def moe_act(self) -> str:
        return self.moe_act_quant or self.act_quant

    def route(self, h: np.ndarray, L: LayerWeights, li: int | None = None, start: int = 0
              ) -> tuple[np.ndarray, np.ndarray]:
        """(expert ids [T, k], weights [T, k]) the router gives the normed rows h (rounded to q8_1 first
        when the MoE reads q8_1: the fast router reads that copy); with routes for layer li, the
        kernels' choice where a near tie explains it (rows start.. of those routes)."""
        hin = round_q8_1(h) if self.moe_act == "q8_1" else h
        logits = router_logits_reference(hin, L.router)
        if L.router_b is not None:  # gpt-oss
            logits = logits + L.router_b
        ids, w = route_reference(logits, self.cfg.n_expert_used, gating=self.cfg.moe_gating)
        if self.routes is None or li not in self.routes:
            return ids, w
        theirs = self.routes[li][start : start + len(ids)]
        for t in np.nonzero((theirs != ids).any(axis=1))[0]:
            if self._explained(logits[t], ids[t], theirs[t]):
                ids[t] = theirs[t]
                w[t] = self._weights_of(logits[t], theirs[t], self.cfg.moe_gating)
                self.route_flips += 1
        return ids, w

    def _explained(self, logits: np.ndarray, ours: np.ndarray, theirs: np.ndarray) -> bool:
        """The kernels' experts differ from ours only where rounding can reorder the router's logits."""
        kth, chosen = logits[ours[-1]], logits[theirs]
        if len(set(theirs.tolist())) != len(theirs) or not ((0 <= theirs) & (theirs < len(logits))).all():
            return False
        return bool((chosen >= kth - self.route_gap).all() and (chosen[1:] <= chosen[:-1] + self.route_gap).all())

    @staticmethod
    def _weights_of(logits: np.ndarray, ids: np.ndarray, gating: str = "softmax") -> np.ndarray:
        """route_reference's weights for a given choice of experts (softmax over all, renormalised; or
        topk_softmax's softmax over the chosen)."""
        if gating == "topk_softmax":
            e = np.exp(logits[ids] - logits[ids[0]])
            total = e[0]
            for v in e[1:]:
                total = total + v
            return (e / total).astype(F32)
        p = np.exp(logits - logits.max())
        p = (p / p.sum(dtype=F32)).astype(F32)
        w = p[ids]
        total = w[0]
        for v in w[1:]:
            total = total + v
        return (w / max(total, WEIGHT_SUM_FLOOR)).astype(F32)

    def _moe(self, h: np.ndarray, L: LayerWeights, li: int | None = None, start: int = 0) -> np.ndarray:
        """The k chosen experts' FFNs of each token, weighted and summed in rank order (ops/moe.py)."""
        ids, weights = self.route(h, L, li, start)
        y = np.zeros((h.shape[0], ids.shape[1], h.shape[1]), F32)  # [T, k, d]: slot r of token t
        for e in np.unique(ids):  # every (token, slot) that chose expert e, in one matmul
            t, r = np.nonzero(ids == e)
            gub, db = (None if b is None else b[e] for b in (L.exps_gate_up_b, L.exps_down_b))  # gpt-oss's biases
            y[t, r] = self._ffn(h[t], L.exps_gate_up[e], L.exps_down[e], self.moe_act, gub, db)
        return combine_reference(y, weights)

    def _norm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        """rmsnorm(x) * weight over the last axis (float32: x is)."""
        return _f32(rmsnorm_reference(x, weight, self.cfg.rms_eps))

    def _post(self, y: np.ndarray, norm: np.ndarray | None) -> np.ndarray:
        """A sublayer's output as the residual adds it: itself, or rmsnorm(y) * norm (gemma3's post-norms)."""
        return y if norm is None else self._norm(y, norm)

    def _attention(self, q: np.ndarray, keys: np.ndarray, vals: np.ndarray, mask: np.ndarray,
                   sinks: np.ndarray | None = None) -> np.ndarray:
        """Masked GQA attention. q [T, H, d]; keys, vals [S, H_kv, d]; mask [T, S] -> [T, H * d].

        Query heads are grouped by the KV head they read (h // group), so each group is
        one batched matmul against its own keys."""
        cfg = self.cfg
        T, g = q.shape[0], cfg.gqa_group
        qg = q.reshape(T, cfg.n_head_kv, g, cfg.head_dim).transpose(1, 2, 0, 3)  # [H_kv, g, T, d]
        if cfg.attn_softcap:  # gemma2, as llama.cpp: Q scaled, the scores softcapped, then the mask
            scores = softcap((qg * F32(cfg.kq_scale)) @ keys.transpose(1, 2, 0)[:, None], cfg.attn_softcap) + mask
        else:
            scores = qg @ keys.transpose(1, 2, 0)[:, None] * F32(cfg.kq_scale) + mask  # [H_kv, g, T, S]
        if sinks is None:
            p = np.exp(scores - scores.max(axis=-1, keepdims=True))
            p /= p.sum(axis=-1, keepdims=True)
        else:  # gpt-oss: head h's sink joins the max and the sum, and has no value
            z = sinks.reshape(cfg.n_head_kv, g, 1, 1)
            m = np.maximum(scores.max(axis=-1, keepdims=True), z)
            p = np.exp(scores - m)
            p /= p.sum(axis=-1, keepdims=True) + np.exp(z - m)
        out = p @ vals.transpose(1, 0, 2)[:, None]  # [H_kv, g, T, d]
        return _f32(out.transpose(2, 0, 1, 3).reshape(T, cfg.q_dim))

    def logits(self, token_ids) -> np.ndarray:
        """Teacher-forced logits [T, vocab] for a whole sequence from an empty cache."""
        return self.forward(token_ids, self.new_cache(len(token_ids)))
