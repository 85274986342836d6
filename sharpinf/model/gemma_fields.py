"""What llama.cpp's gemma graphs add to llama's (src/models/gemma2.cpp, gemma3*.cpp), as ModelConfig
fields: sliding windows on a period of layers, GeGLU, sandwich norms, sqrt(n_embd) embeddings, the
attention scale (27B: 1/sqrt(n_embd / n_head)), softcaps. The loader calls the arch's own."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

from ..errors import ModelError

GEMMA3_SWA_PERIOD = 6  # llama.cpp hard-codes it: layer i is global when i % 6 == 5 (no GGUF key)
GEMMA3_LOCAL_ROPE_BASE = 10000.0  # and the windowed layers' RoPE base (no GGUF key either)
GEMMA2_SWA_PERIOD = 2  # gemma2: layer i is global when i % 2 == 1 (load_swa_pattern(ml, 2))
GEMMA2_WINDOW = 4096  # gemma2's window where the file gives none (llama.cpp's n_swa default)
GEMMA2_ATTN_SOFTCAP, GEMMA2_FINAL_SOFTCAP = 50.0, 30.0  # llama.cpp's defaults (llama-hparams.h)


def _windows(window: int, period: int, n_layer: int, n_tensors: int) -> tuple[int, ...]:
    """window on every layer but the last of each period. At most one window per tensor: a corrupt
    block_count of 2**31 then fails at the first missing layer without building 2**31 windows first."""
    return tuple(window if i % period < period - 1 else 0 for i in range(max(0, min(n_layer, n_tensors))))


def _window_key(get: Callable, path: Path, meta: dict, arch: str, default: int) -> int:
    window = get(path, meta, f"{arch}.attention.sliding_window", int, default)
    if window < 0:
        raise ModelError(path, f"bad metadata: attention.sliding_window = {window}")
    return window


def _common(n_embd: int, scale: float) -> dict[str, Any]:
    return dict(embd_scale=math.sqrt(n_embd), attn_scale=scale, ffn_act="gelu_tanh", post_norms=True)


def gemma3_fields(get: Callable, path: Path, meta: dict[str, Any], arch: str, n_layer: int, n_tensors: int,
                  n_embd: int, n_head: int, head_dim: int) -> dict[str, Any]:
    """gemma3: windows on 5 layers of every 6 when the GGUF declares one (their RoPE base 10000,
    unscaled), QK-norm (read from the tensors), an optional final softcap."""
    window = _window_key(get, path, meta, arch, 0)
    scale = 1.0 / math.sqrt(n_embd // n_head if n_layer == 62 else head_dim)  # llama.cpp: 62 layers = 27B
    return dict(layer_window=_windows(window, GEMMA3_SWA_PERIOD, n_layer, n_tensors) if window else (),
                rope_theta_local=GEMMA3_LOCAL_ROPE_BASE if window else 0.0, **_common(n_embd, scale),
                final_softcap=get(path, meta, f"{arch}.final_logit_softcapping", float, 0.0))


def gemma2_fields(get: Callable, path: Path, meta: dict[str, Any], arch: str, n_layer: int, n_tensors: int,
                  n_embd: int, n_head: int, head_dim: int) -> dict[str, Any]:
    """gemma2: windows on every other layer (4096 where the file gives none; the global RoPE on all),
    the attention's scores softcapped before the mask, the logits softcapped, each cap llama.cpp's
    default (50, 30) where the file gives none."""
    window = _window_key(get, path, meta, arch, GEMMA2_WINDOW)
    scale = 1.0 / math.sqrt(n_embd // n_head if n_layer == 46 else head_dim)  # llama.cpp: 46 layers = 27B
    caps = (get(path, meta, f"{arch}.attn_logit_softcapping", float, GEMMA2_ATTN_SOFTCAP),
            get(path, meta, f"{arch}.final_logit_softcapping", float, GEMMA2_FINAL_SOFTCAP))
    if min(caps) <= 0:
        raise ModelError(path, f"bad metadata: attn_logit_softcapping = {caps[0]}, final_logit_softcapping = {caps[1]}")
    return dict(layer_window=_windows(window, GEMMA2_SWA_PERIOD, n_layer, n_tensors) if window else (),
                **_common(n_embd, scale), attn_softcap=caps[0], final_softcap=caps[1])


GEMMA_FIELDS = {"gemma3": gemma3_fields, "gemma2": gemma2_fields}
