"""What each registered variant serves (the registry's `fits`): (cfg, model) -> why it cannot serve
the model, or None. model may be None (shapes only). Named by sharpinf/ops/variants.toml."""

from __future__ import annotations

from sharpinf.model import quants
from sharpinf.ops import attention as attn_ops
from sharpinf.ops import matmul_mma as mma_ops


def split_attention(cfg, model=None) -> str | None:
    if cfg.head_dim not in attn_ops.HEAD_DIMS:
        return f"split attention is compiled for head_dim {attn_ops.HEAD_DIMS}, the model has {cfg.head_dim}"
    return None


def flash_attention(cfg, model=None) -> str | None:
    if getattr(cfg, "attn_softcap", 0.0):
        return attn_ops.FLASH_NO_SOFTCAP
    return attn_ops.flash_fits(getattr(cfg, "n_head", 1), getattr(cfg, "n_head_kv", 1), cfg.head_dim)


def quantized_weights(cfg, model=None) -> str | None:
    """The int8 kernels (mma, mmq, the fused FFN and link) read quantized weights."""
    if model is None:
        return None
    types = {t.qtype for t in model.tensors.values() if len(t.shape) == 2}
    if not any(mma_ops.supports(q) for q in types):
        served = ", ".join(quants.qtype_name(q) for q in sorted(mma_ops.MMA_TYPES))
        held = ", ".join(quants.qtype_name(q) for q in sorted(types))
        return f"the int8 kernels serve {served}; the model's matrices are {held}"
    return None


def fused_ffn(cfg, model=None) -> str | None:
    """The fused FFN adds into x itself: a model whose FFN output goes through a post-norm (gemma3)
    would never take it."""
    if getattr(cfg, "post_norms", False):
        return "the fused FFN adds into the residual itself: this model's FFN output goes through a post-norm"
    return quantized_weights(cfg, model)
