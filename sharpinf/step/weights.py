"""The model's weights on the device, uploaded once in their GGUF quantized form.

Matrices stay raw GGML blocks (the kernels dequantize them); norms and biases become float32.
Q, K and V are stacked into one fused matrix when their types agree (one matmul per layer).
An MoE layer's experts stay stacked as GGUF stores them ([n_expert * rows, row_bytes]: the kernels
address expert e's rows from e); its router becomes float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sharpinf.errors import ModelError
from sharpinf.model import quants
from sharpinf.model.loader import LoadedModel
from sharpinf.model.rope_scaling import model_rope_tables
from sharpinf.ops.moe import DeviceExperts
from sharpinf.runtime.backend import Backend


@dataclass
class DeviceMatrix:
    """A weight matrix on the device in its GGUF quantized form: raw rows + type."""

    raw: Any  # uint8 [n_out, row_bytes]
    qtype: int
    n_out: int
    n_in: int


@dataclass
class DeviceLayer:
    attn_norm: Any
    wqkv: list[DeviceMatrix]  # one fused matrix, or Q, K, V when their types differ
    bqkv: Any | None
    q_norm: Any | None
    k_norm: Any | None
    wo: DeviceMatrix
    ffn_norm: Any
    w_gate: DeviceMatrix | None  # None: an MoE layer (moe holds its FFN)
    w_up: DeviceMatrix | None
    w_down: DeviceMatrix | None
    rope_freqs: Any = None  # float64 [head_dim/2]: the layer's RoPE table (model/rope_scaling.py), shared by its kind
    rope_mscale: float = 1.0  # its factor on cos and sin
    post_attn_norm: Any | None = None  # gemma3's sandwich norms
    post_ffn_norm: Any | None = None
    moe: DeviceExperts | None = None  # qwen3moe
    wo_b: Any | None = None  # the attention output's bias (gpt-oss)
    attn_sinks: Any | None = None  # gpt-oss: float32 [n_head], a logit a head in the attention's softmax


def _upload_matrix(be: Backend, model: LoadedModel, names: list[str]) -> DeviceMatrix:
    """Upload one matrix, or several with the same type stacked by rows (rows are independent blocks)."""
    ts = [model.tensor(n) for n in names]
    raw = np.ascontiguousarray(np.concatenate([np.asarray(t.raw).reshape(t.shape[0], -1) for t in ts]))
    return DeviceMatrix(be.upload(raw), ts[0].qtype, sum(t.shape[0] for t in ts), ts[0].shape[1])


def _upload_f32(be: Backend, model: LoadedModel, name: str) -> Any | None:
    if name not in model.tensors:
        return None
    return be.upload(np.ascontiguousarray(model.tensor(name).dequantize().astype(np.float32).reshape(-1)))


def _upload_experts(be: Backend, m: LoadedModel, p: str) -> DeviceExperts:
    c = m.config
    gate, up, down = (m.tensor(p + f"ffn_{n}_exps.weight") for n in ("gate", "up", "down"))
    if gate.qtype != up.qtype:  # one decoder reads both in the gate+up kernels
        raise ModelError(m.path, f"{gate.name} is {gate.qtype_name} but {up.name} is {up.qtype_name}: "
                                 "the MoE kernels need the gate and up experts in one type")

    def raw(t) -> Any:
        return be.upload(np.ascontiguousarray(np.asarray(t.raw).reshape(-1, quants.row_bytes(t.qtype, t.shape[-1]))))

    def f32(name: str) -> np.ndarray | None:
        return m.tensor(p + name).dequantize().astype(np.float32) if p + name in m.tensors else None

    # gpt-oss's biases (None elsewhere: the kernels then take today's path); the gate's and up's side
    # by side a row, as the gate+up kernels read them (moe_args.cuh)
    bg, bu, bd = (f32(f"ffn_{n}_exps.bias") for n in ("gate", "up", "down"))
    gate_up_bias = None if bg is None else np.stack([bg.reshape(c.n_expert, -1), bu.reshape(c.n_expert, -1)], axis=-1)
    return DeviceExperts(_upload_f32(be, m, p + "ffn_gate_inp.weight"), raw(gate), raw(up), raw(down), gate.qtype,
                         down.qtype, c.n_expert, c.n_expert_used, c.n_ff_exp, c.n_embd,
                         router_bias=_upload_f32(be, m, p + "ffn_gate_inp.bias"),
                         gate_up_bias=None if gate_up_bias is None else be.upload(np.ascontiguousarray(gate_up_bias)),
                         down_bias=None if bd is None else be.upload(np.ascontiguousarray(bd.reshape(-1))),
                         gating=c.moe_gating)


def _upload_layer(be: Backend, m: LoadedModel, i: int, rope: tuple[Any, float]) -> DeviceLayer:
    p = f"blk.{i}."
    qkv_names = [p + f"attn_{n}.weight" for n in "qkv"]
    same_type = len({m.tensor(n).qtype for n in qkv_names}) == 1
    wqkv = [_upload_matrix(be, m, qkv_names)] if same_type else [_upload_matrix(be, m, [n]) for n in qkv_names]
    moe = m.config.is_moe
    bias = None
    if p + "attn_q.bias" in m.tensors:
        host = np.concatenate([m.tensor(p + f"attn_{n}.bias").dequantize().reshape(-1) for n in "qkv"])
        bias = be.upload(np.ascontiguousarray(host.astype(np.float32)))
    return DeviceLayer(
        attn_norm=_upload_f32(be, m, p + "attn_norm.weight"),
        wqkv=wqkv,
        bqkv=bias,
        q_norm=_upload_f32(be, m, p + "attn_q_norm.weight"),
        k_norm=_upload_f32(be, m, p + "attn_k_norm.weight"),
        rope_freqs=rope[0],
        rope_mscale=rope[1],
        wo=_upload_matrix(be, m, [p + "attn_output.weight"]),
        ffn_norm=_upload_f32(be, m, p + "ffn_norm.weight"),
        w_gate=None if moe else _upload_matrix(be, m, [p + "ffn_gate.weight"]),
        w_up=None if moe else _upload_matrix(be, m, [p + "ffn_up.weight"]),
        w_down=None if moe else _upload_matrix(be, m, [p + "ffn_down.weight"]),
        post_attn_norm=_upload_f32(be, m, p + "post_attention_norm.weight"),
        post_ffn_norm=_upload_f32(be, m, p + "post_ffw_norm.weight"),
        moe=_upload_experts(be, m, p) if moe else None,
        wo_b=_upload_f32(be, m, p + "attn_output.bias"),
        attn_sinks=_upload_f32(be, m, p + "attn_sinks.weight"),
    )


@dataclass
class DeviceWeights:
    token_embd: DeviceMatrix
    output: DeviceMatrix  # the LM head: token_embd itself when the model ties them
    output_norm: Any
    layers: list[DeviceLayer]


def upload_weights(be: Backend, m: LoadedModel) -> DeviceWeights:
    emb = _upload_matrix(be, m, ["token_embd.weight"])
    tables = model_rope_tables(m)
    on_device = {id(t): (be.upload(t.freqs), t.mscale) for t in tables}  # one copy a layer kind
    return DeviceWeights(emb, emb if m.config.tied_output else _upload_matrix(be, m, ["output.weight"]),
                         _upload_f32(be, m, "output_norm.weight"),
                         [_upload_layer(be, m, i, on_device[id(t)]) for i, t in enumerate(tables)])
