"""A synthetic gpt-oss's tensors from the generic ones (synth._weights'): what llama.cpp's openai-moe graph
adds -- Q, K, V and output biases, a sink a query head, a biased router, biased experts -- and its names
(the FFN's input norm is post_attention_norm). The experts' gates and ups are widened so the clamped
SwiGLU's limit (7) bites on some values, their downs narrowed as much, so the residual keeps its size."""

from __future__ import annotations

import numpy as np

EXPERT_WIDEN = 4.0  # gate and up values ~4 wide: a few in a hundred past the clamp


def gpt_oss_weights(w: dict, seed: int, n_layer: int, n_head: int) -> dict:
    rng = np.random.default_rng(seed + 7919)  # apart from the generic weights' stream

    def bias(*shape: int, gain: float = 0.1) -> np.ndarray:
        return (gain * rng.standard_normal(shape)).astype(np.float32)

    out = {}
    for name, x in w.items():
        b = name[: name.index(".", 4) + 1] if name.startswith("blk.") else ""
        short = name[len(b):]
        if short == "ffn_norm.weight":
            out[b + "post_attention_norm.weight"] = x
            continue
        widen = isinstance(x, np.ndarray)  # a benchmark's tiled matrix (synth._Tiled) keeps its rows
        if widen and short in ("ffn_gate_exps.weight", "ffn_up_exps.weight"):
            x = (x * np.float32(EXPERT_WIDEN)).astype(np.float32)
        elif widen and short == "ffn_down_exps.weight":
            x = (x / np.float32(EXPERT_WIDEN)).astype(np.float32)
        out[name] = x
        if short in ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight"):
            out[b + short.replace(".weight", ".bias")] = bias(x.shape[0])
        if short == "attn_output.weight":
            out[b + "attn_sinks.weight"] = bias(n_head, gain=1.0)  # ~ the scores' own size
        if short == "ffn_gate_inp.weight":
            out[b + "ffn_gate_inp.bias"] = bias(x.shape[0], gain=0.5)
        if short.endswith("_exps.weight"):
            out[b + short.replace(".weight", ".bias")] = bias(*x.shape[:2])
    return out
