"""A deliberately naive float64 forward pass, written apart from reference.py.

Loops over tokens, heads and rotation pairs; no fused matrices, no einsum, no cache:
slow, but each line maps onto one formula, so it checks the reference's vectorised
tricks (stacked QKV, pair slicing, GQA head grouping) on tiny synthetic models.
"""

from __future__ import annotations

import math

import numpy as np

from sharpinf.model.loader import LoadedModel


def _rmsnorm(x, w, eps):
    return x / math.sqrt(float(np.mean(x * x)) + eps) * w


def _rotate(vec, pos, theta, style, scaling, factors=None):
    """ggml's rope_yarn, pair by pair: the extrapolated angle (frequency factors dividing it), the
    interpolated one, YaRN's ramp between them, and its magnitude factor on cos and sin."""
    d = len(vec)
    out = vec.copy()
    fs = scaling.freq_scale
    if scaling.ext_factor:
        def corr(n_rot):
            return d * math.log(scaling.n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(theta))
        low, high = max(0.0, math.floor(corr(scaling.beta_fast))), min(d - 1.0, math.ceil(corr(scaling.beta_slow)))
    for i in range(d // 2):
        extrap = pos / theta ** (2 * i / d) / (float(factors[i]) if factors is not None else 1.0)
        angle, mscale = fs * extrap, scaling.attn_factor
        if scaling.ext_factor:
            mix = (1 - min(1.0, max(0.0, (i - low) / max(0.001, high - low)))) * scaling.ext_factor
            angle = angle * (1 - mix) + extrap * mix
            mscale *= 1 + 0.1 * math.log(1 / fs)
        a, b = (2 * i, 2 * i + 1) if style == "norm" else (i, i + d // 2)
        c, s = math.cos(angle) * mscale, math.sin(angle) * mscale
        out[a] = vec[a] * c - vec[b] * s
        out[b] = vec[a] * s + vec[b] * c
    return out


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def _glu(cfg, g, u):
    """The gated activation: act(g) * u; gpt-oss's: the gate capped at 7, the up clamped to [-7, 7],
    x sigmoid(1.702 x) (y + 1)."""
    if cfg.ffn_act == "swiglu_oai":
        x, y = np.minimum(g, 7.0), np.clip(u, -7.0, 7.0)
        return x / (1 + np.exp(-1.702 * x)) * (y + 1)
    return (_gelu_tanh(g) if cfg.ffn_act == "gelu_tanh" else g / (1 + np.exp(-g))) * u


def _moe_ffn(model, cfg, w, p, h):
    """The router's k experts for one token: softmax over all, the k largest (lower id first on a
    tie), weights renormalised, their SwiGLU outputs added best first."""
    logits = [float(row @ h) for row in w(p + "ffn_gate_inp.weight")]
    if cfg.moe_gating == "topk_softmax":  # gpt-oss: biased logits, their top k, a softmax over the k
        logits = [v + float(b) for v, b in zip(logits, w(p + "ffn_gate_inp.bias"))]
        chosen = sorted(range(cfg.n_expert), key=lambda i: (-logits[i], i))[: cfg.n_expert_used]
        e = {i: math.exp(logits[i] - logits[chosen[0]]) for i in chosen}
        out = np.zeros_like(h)
        for i in chosen:
            g = w(p + "ffn_gate_exps.weight")[i] @ h + w(p + "ffn_gate_exps.bias")[i]
            u = w(p + "ffn_up_exps.weight")[i] @ h + w(p + "ffn_up_exps.bias")[i]
            y = w(p + "ffn_down_exps.weight")[i] @ _glu(cfg, g, u) + w(p + "ffn_down_exps.bias")[i]
            out = out + e[i] / sum(e.values()) * y
        return out
    m = max(logits)
    e = [math.exp(v - m) for v in logits]
    probs = [v / sum(e) for v in e]
    chosen = sorted(range(cfg.n_expert), key=lambda i: (-probs[i], i))[: cfg.n_expert_used]
    total = max(sum(probs[i] for i in chosen), 6.103515625e-5)
    out = np.zeros_like(h)
    for i in chosen:
        g, u = w(p + "ffn_gate_exps.weight")[i] @ h, w(p + "ffn_up_exps.weight")[i] @ h
        out = out + probs[i] / total * (w(p + "ffn_down_exps.weight")[i] @ _glu(cfg, g, u))
    return out


def naive_logits(model: LoadedModel, token_ids: list[int]) -> np.ndarray:
    """Logits [T, vocab] in float64 for a whole sequence."""
    cfg = model.config

    cache: dict[str, np.ndarray] = {}

    def w(name):
        if name not in cache:
            cache[name] = model.tensor(name).dequantize().astype(np.float64)
        return cache[name]

    def has(name):
        return name in model.tensors

    emb = w("token_embd.weight")
    xs = [emb[t] * cfg.embd_scale for t in token_ids]
    factors = w("rope_freqs.weight") if has("rope_freqs.weight") else None  # Llama 3.1+: every layer's
    if cfg.has_longrope:  # phi3: llama.cpp's get_rope_factors -- long past the original context
        run_ctx = cfg.n_ctx_seq if cfg.n_ctx_seq else cfg.context_length
        factors = w("rope_factors_long.weight" if run_ctx > cfg.n_ctx_orig else "rope_factors_short.weight")
    for li in range(cfg.n_layer):
        # gemma3: windowed layers rotate with the local base, unscaled; keys p-W+1..p only
        window = cfg.window(li)
        theta, scaling = cfg.rope_for(li)
        p = f"blk.{li}."
        Wq, Wk, Wv, Wo = (w(p + f"attn_{n}.weight") for n in ("q", "k", "v", "output"))
        ks, vs, attn_out = [], [], []
        for pos, x in enumerate(xs):
            h = _rmsnorm(x, w(p + "attn_norm.weight"), cfg.rms_eps)
            q, k, v = Wq @ h, Wk @ h, Wv @ h
            if has(p + "attn_q.bias"):
                q, k, v = q + w(p + "attn_q.bias"), k + w(p + "attn_k.bias"), v + w(p + "attn_v.bias")
            heads_q = [q[i * cfg.head_dim : (i + 1) * cfg.head_dim] for i in range(cfg.n_head)]
            heads_k = [k[i * cfg.head_dim : (i + 1) * cfg.head_dim] for i in range(cfg.n_head_kv)]
            heads_v = [v[i * cfg.head_dim : (i + 1) * cfg.head_dim] for i in range(cfg.n_head_kv)]
            if has(p + "attn_q_norm.weight"):
                heads_q = [_rmsnorm(hq, w(p + "attn_q_norm.weight"), cfg.rms_eps) for hq in heads_q]
                heads_k = [_rmsnorm(hk, w(p + "attn_k_norm.weight"), cfg.rms_eps) for hk in heads_k]
            if cfg.uses_rope(li):  # smollm3: no RoPE on every 4th layer
                heads_q = [_rotate(hq, pos, theta, cfg.rope_style, scaling, factors) for hq in heads_q]
                heads_k = [_rotate(hk, pos, theta, cfg.rope_style, scaling, factors) for hk in heads_k]
            if cfg.attn_temp_scale:  # mistral3: the queries' temperature (1 before n_ctx_orig)
                t = float(cfg.attn_temp([pos])[0])
                heads_q = [hq * t for hq in heads_q]
            ks.append(heads_k)
            vs.append(heads_v)
            out = []
            for hq_i, hq in enumerate(heads_q):
                kv = hq_i // (cfg.n_head // cfg.n_head_kv)
                seen = range(max(0, pos - window + 1) if window else 0, pos + 1)
                scale = cfg.attn_scale or 1 / math.sqrt(cfg.head_dim)
                scores = [float(hq @ ks[s][kv]) * scale for s in seen]
                if cfg.attn_softcap:  # gemma2: each score capped before the softmax
                    scores = [cfg.attn_softcap * math.tanh(sc / cfg.attn_softcap) for sc in scores]
                sink = float(w(p + "attn_sinks.weight")[hq_i]) if cfg.has_attn_sinks else None
                m = max(scores + ([sink] if sink is not None else []))
                e = [math.exp(sc - m) for sc in scores]
                total = sum(e) + (math.exp(sink - m) if sink is not None else 0.0)  # gpt-oss: a sink, no value
                out.append(sum(e[i] / total * vs[s][kv] for i, s in enumerate(seen)))
            attn_out.append(np.concatenate(out))
        new_xs = []
        for x, a in zip(xs, attn_out):
            a = Wo @ a
            if has(p + "attn_output.bias"):
                a = a + w(p + "attn_output.bias")
            if has(p + "post_attention_norm.weight"):
                a = _rmsnorm(a, w(p + "post_attention_norm.weight"), cfg.rms_eps)
            x = x + a
            h = _rmsnorm(x, w(p + "ffn_norm.weight"), cfg.rms_eps)
            if cfg.is_moe:
                f = _moe_ffn(model, cfg, w, p, h)
            else:
                g, u = w(p + "ffn_gate.weight") @ h, w(p + "ffn_up.weight") @ h
                f = w(p + "ffn_down.weight") @ _glu(cfg, g, u)
            if has(p + "post_ffw_norm.weight"):
                f = _rmsnorm(f, w(p + "post_ffw_norm.weight"), cfg.rms_eps)
            x = x + f
            new_xs.append(x)
        xs = new_xs
    out_w = w("output.weight") if has("output.weight") else emb
    logits = np.stack([out_w @ _rmsnorm(x, w("output_norm.weight"), cfg.rms_eps) for x in xs])
    cap = cfg.final_softcap
    return cap * np.tanh(logits / cap) if cap else logits
