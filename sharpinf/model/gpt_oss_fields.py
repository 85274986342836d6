"""What llama.cpp's openai-moe graph (src/models/openai-moe.cpp: gpt-oss) adds to llama's, as ModelConfig
fields: sliding windows (attention.sliding_window, required) on every other layer unless
attention.sliding_window_pattern says otherwise, the windowed layers' RoPE base (rope.freq_base_swa) with
the full layers' scaling, attention sinks, the output projection's bias, a biased router whose top k are
taken on its logits and softmaxed over the chosen, biased experts with OpenAI's clamped SwiGLU. The
loader calls gpt_oss_fields; the sinks and biases are required tensors (loader.expected_shapes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ..errors import ModelError

GPT_OSS_SWA_PERIOD = 2  # load_swa_pattern(ml, 2): layer i is windowed when i % 2 == 0
# The clamped SwiGLU (llama.cpp's LLM_FFN_SWIGLU_OAI_MOE, constants in the graph, no GGUF key):
#   x = min(gate, LIMIT), y = clamp(up, -LIMIT, LIMIT), out = x / (1 + e^(ALPHA * -x)) * (y + 1)
SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT = 1.702, 7.0


def _pattern(get: Callable, path: Path, meta: dict[str, Any], arch: str, n_layer: int) -> tuple[bool, ...]:
    """Which layers slide: the pattern key as a per-layer bool array, or as a period n (layer i slides
    when n == 0 or i % n < n - 1), else the period 2 (llama_hparams::set_swa_pattern)."""
    key = f"{arch}.attention.sliding_window_pattern"
    value = meta.get(key, GPT_OSS_SWA_PERIOD)
    if isinstance(value, list):
        if len(value) != n_layer or not all(isinstance(v, bool) for v in value):
            raise ModelError(path, f"bad metadata: {key} must be {n_layer} booleans, got {value!r:.80}")
        return tuple(value)
    n = get(path, meta, key, int, GPT_OSS_SWA_PERIOD)
    if n < 0:
        raise ModelError(path, f"bad metadata: {key} = {n}")
    return tuple(n == 0 or i % n < n - 1 for i in range(n_layer))


def gpt_oss_fields(get: Callable, path: Path, meta: dict[str, Any], arch: str, n_layer: int, n_tensors: int,
                   n_embd: int, n_head: int, head_dim: int) -> dict[str, Any]:
    window = get(path, meta, f"{arch}.attention.sliding_window", int)
    if window <= 0:
        raise ModelError(path, f"bad metadata: attention.sliding_window = {window} (must be positive)")
    slides = _pattern(get, path, meta, arch, max(0, min(n_layer, n_tensors)))
    base = get(path, meta, f"{arch}.rope.freq_base", float, 10000.0)
    return dict(layer_window=tuple(window if s else 0 for s in slides),
                rope_theta_local=get(path, meta, f"{arch}.rope.freq_base_swa", float, base),
                local_rope_scaled=True, ffn_act="swiglu_oai", has_attn_sinks=True, has_attn_out_bias=True,
                has_moe_bias=True, moe_gating="topk_softmax")
