"""Fused tensors as the graph reads them: phi3's files hold Q, K and V in one attn_qkv matrix and the
FFN's gate and up in one ffn_up (the gate's rows first, as llama.cpp's swiglu splits it). A GGUF
matrix is rows of whole blocks, so a block of rows is an exact view of the raw bytes: the loader gives
them under the usual names (attn_q/k/v, ffn_gate/ffn_up; gpt-oss's post_attention_norm, its FFN's
input norm, as ffn_norm) and every reader -- the reference, the
upload, the trace -- sees one layout."""

from __future__ import annotations

from .tensors import QTensor

# gpt-oss's files name the FFN's input norm post_attention_norm (llama.cpp's attn_post_norm, on the residual
# after attention); the loader checks it under that name and unfused gives it as ffn_norm
FFN_NORM_IN_FILE = {"gpt-oss": "post_attention_norm.weight"}


def row_view(t: QTensor, name: str, start: int, stop: int) -> QTensor:
    """Rows start..stop of a matrix, its raw blocks untouched."""
    return QTensor(name, t.qtype, (stop - start, *t.shape[1:]), t.raw[start:stop])


def unfused(cfg, tensors: dict[str, QTensor]) -> dict[str, QTensor]:
    """tensors with each fused matrix replaced by its parts (a copy of the dict; the same when none is)."""
    renamed = FFN_NORM_IN_FILE.get(cfg.arch)
    if not (cfg.fused_qkv or cfg.fused_gate_up or renamed):
        return tensors
    out = dict(tensors)
    for i in range(cfg.n_layer):
        b = f"blk.{i}."
        if renamed:
            t = out.pop(b + renamed)
            out[b + "ffn_norm.weight"] = QTensor(b + "ffn_norm.weight", t.qtype, t.shape, t.raw)
        if cfg.fused_qkv:
            qkv = out.pop(b + "attn_qkv.weight")
            q, kv = cfg.q_dim, cfg.kv_dim
            out[b + "attn_q.weight"] = row_view(qkv, b + "attn_q.weight", 0, q)
            out[b + "attn_k.weight"] = row_view(qkv, b + "attn_k.weight", q, q + kv)
            out[b + "attn_v.weight"] = row_view(qkv, b + "attn_v.weight", q + kv, q + 2 * kv)
        if cfg.fused_gate_up:
            gu = out.pop(b + "ffn_up.weight")
            out[b + "ffn_gate.weight"] = row_view(gu, b + "ffn_gate.weight", 0, cfg.n_ff)
            out[b + "ffn_up.weight"] = row_view(gu, b + "ffn_up.weight", cfg.n_ff, 2 * cfg.n_ff)
    return out
