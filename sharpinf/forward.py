"""ForwardPass: one step of the transformer over a packed, paged Batch, every op a kernel.

Prefill, chunked prefill, decode and mixed steps are the same call: the Batch says
which tokens of which sequences run and where their KV lives. Per layer:

    h   = rmsnorm(x) * attn_norm                        rmsnorm.cu
    qkv = h @ [Wq; Wk; Wv]^T (+ bias)                   matmul.cu   [N, q_dim + 2 kv_dim]
    q,k = rmsnorm per head (qwen3)                      rmsnorm.cu  (rows = N x heads)
    q,k = rope at each token's absolute position        rope.cu
    K/V of this step -> paged cache via slot_mapping    kv_cache.cu
    o   = varlen paged causal attention                 attention.cu
    x  += o @ Wo^T                                      matmul.cu, elementwise.cu
    x  += (silu(h2 @ Wg^T) * (h2 @ Wu^T)) @ Wd^T        matmul.cu, elementwise.cu
then only the rows that want logits: gather -> final rmsnorm -> LM head -> (argmax).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sharpinf.batch import Batch
from sharpinf.kv_pool import KVPool
from sharpinf.model.config import ModelConfig
from sharpinf.model.loader import LoadedModel
from sharpinf.ops import attention as attn_ops
from sharpinf.ops import basic
from sharpinf.ops import kv_cache as kv_ops
from sharpinf.ops import rope as rope_ops
from sharpinf.ops.embedding import embed
from sharpinf.ops.matmul import matmul
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
    w_gate: DeviceMatrix
    w_up: DeviceMatrix
    w_down: DeviceMatrix


def _upload_matrix(be: Backend, model: LoadedModel, names: list[str]) -> DeviceMatrix:
    """Upload one matrix, or several with the same type stacked by rows (rows are independent blocks)."""
    ts = [model.tensor(n) for n in names]
    raw = np.ascontiguousarray(np.concatenate([np.asarray(t.raw).reshape(t.shape[0], -1) for t in ts]))
    return DeviceMatrix(be.upload(raw), ts[0].qtype, sum(t.shape[0] for t in ts), ts[0].shape[1])


def _upload_f32(be: Backend, model: LoadedModel, name: str) -> Any | None:
    if name not in model.tensors:
        return None
    return be.upload(np.ascontiguousarray(model.tensor(name).dequantize().astype(np.float32).reshape(-1)))


@dataclass
class StepOutput:
    logits: Any  # device float32 [R, vocab], R = len(batch.logits_rows)
    argmax: Any  # device int32 [R]


@dataclass
class ForwardPass:
    model: LoadedModel
    backend: Backend
    cfg: ModelConfig = field(init=False)
    layers: list[DeviceLayer] = field(init=False)

    def __post_init__(self):
        be, m = self.backend, self.model
        self.cfg = m.config
        self.token_embd = _upload_matrix(be, m, ["token_embd.weight"])
        self.output = self.token_embd if self.cfg.tied_output else _upload_matrix(be, m, ["output.weight"])
        self.output_norm = _upload_f32(be, m, "output_norm.weight")
        self.layers = [self._upload_layer(i) for i in range(self.cfg.n_layer)]

    def _upload_layer(self, i: int) -> DeviceLayer:
        be, m, p = self.backend, self.model, f"blk.{i}."
        qkv_names = [p + f"attn_{n}.weight" for n in "qkv"]
        same_type = len({m.tensor(n).qtype for n in qkv_names}) == 1
        wqkv = [_upload_matrix(be, m, qkv_names)] if same_type else [_upload_matrix(be, m, [n]) for n in qkv_names]
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
            wo=_upload_matrix(be, m, [p + "attn_output.weight"]),
            ffn_norm=_upload_f32(be, m, p + "ffn_norm.weight"),
            w_gate=_upload_matrix(be, m, [p + "ffn_gate.weight"]),
            w_up=_upload_matrix(be, m, [p + "ffn_up.weight"]),
            w_down=_upload_matrix(be, m, [p + "ffn_down.weight"]),
        )

    # -- one step ---------------------------------------------------------------------------
    def forward(self, batch: Batch, kv: KVPool, validate: bool = True) -> StepOutput:
        """Run the step; K/V of its tokens land in `kv`; logits for batch.logits_rows come back on the device."""
        be, cfg = self.backend, self.cfg
        if validate:
            batch.validate(kv.num_blocks, cfg.n_vocab)
        N, d = batch.n_tokens, cfg.n_embd
        qkv_w = cfg.q_dim + 2 * cfg.kv_dim
        ids, pos = be.upload(batch.token_ids), be.upload(batch.positions)
        cu, slots = be.upload(batch.cu_seqlens), be.upload(batch.slot_mapping)
        tables = be.upload(np.ascontiguousarray(batch.block_tables))

        x = be.empty((N, d), np.float32)  # the residual stream
        h = be.empty((N, d), np.float32)
        qkv = be.empty((N, qkv_w), np.float32)
        att = be.empty((N, cfg.q_dim), np.float32)
        proj = be.empty((N, d), np.float32)
        gate = be.empty((N, cfg.n_ff), np.float32)
        up = be.empty((N, cfg.n_ff), np.float32)

        embed(be, self.token_embd.raw, self.token_embd.qtype, ids, x, N, d)
        for li, L in enumerate(self.layers):
            basic.rmsnorm(be, x, L.attn_norm, h, N, d, cfg.rms_eps)
            self._qkv(L, h, qkv, N)
            if L.q_norm is not None:
                self._qk_norm(L, qkv, N)
            rope_ops.rope(be, qkv, qkv_w, pos, N, cfg.n_head, cfg.head_dim, cfg.rope_theta, cfg.rope_style, col=0)
            rope_ops.rope(be, qkv, qkv_w, pos, N, cfg.n_head_kv, cfg.head_dim, cfg.rope_theta, cfg.rope_style, col=cfg.q_dim)
            kv_ops.kv_append(be, kv.kv_dtype, qkv, qkv_w, cfg.q_dim, cfg.q_dim + cfg.kv_dim, slots,
                             kv.k[li], kv.v[li], N, cfg.n_head_kv, cfg.head_dim)
            attn_ops.attention(be, kv.kv_dtype, qkv, qkv_w, kv.k[li], kv.v[li], tables, batch.block_tables.shape[1],
                               cu, pos, att, N, batch.n_seqs, cfg.n_head, cfg.n_head_kv, cfg.head_dim,
                               kv.block_size, 1.0 / float(np.sqrt(cfg.head_dim)))
            self._mm(L.wo, att, proj, N)
            basic.add(be, x, proj, x, N * d)
            basic.rmsnorm(be, x, L.ffn_norm, h, N, d, cfg.rms_eps)
            self._mm(L.w_gate, h, gate, N)
            self._mm(L.w_up, h, up, N)
            basic.silu_gate(be, gate, up, gate, N * cfg.n_ff)
            self._mm(L.w_down, gate, proj, N)
            basic.add(be, x, proj, x, N * d)
        return self._head(x, batch)

    def _mm(self, W: DeviceMatrix, X, Y, n_tokens: int, bias=None, y_stride: int | None = None, y_col: int = 0) -> None:
        if y_stride is None:
            return matmul(self.backend, W.raw, W.qtype, X, Y, n_tokens, W.n_out, W.n_in, bias_dev=bias)
        matmul(self.backend, W.raw, W.qtype, X, Y, n_tokens, W.n_out, W.n_in, bias_dev=bias,
               y_stride=y_stride, y_col=y_col)

    def _qkv(self, L: DeviceLayer, h, qkv, N: int) -> None:
        cfg = self.cfg
        if len(L.wqkv) == 1:
            return self._mm(L.wqkv[0], h, qkv, N, bias=L.bqkv)
        # mixed quant types: three matmuls write their column ranges of the fused buffer
        col = 0
        for W in L.wqkv:
            bias = None if L.bqkv is None else L.bqkv[col : col + W.n_out]
            self._mm(W, h, qkv, N, bias=bias, y_stride=cfg.q_dim + 2 * cfg.kv_dim, y_col=col)
            col += W.n_out

    def _qk_norm(self, L: DeviceLayer, qkv, N: int) -> None:
        """qwen3: RMSNorm over each head's head_dim for Q and K, in place in the fused buffer."""
        cfg, be = self.cfg, self.backend
        qw = cfg.q_dim + 2 * cfg.kv_dim
        basic.qk_norm(be, qkv, L.q_norm, N, cfg.n_head, cfg.head_dim, qw, 0, cfg.rms_eps)
        basic.qk_norm(be, qkv, L.k_norm, N, cfg.n_head_kv, cfg.head_dim, qw, cfg.q_dim, cfg.rms_eps)

    def _head(self, x, batch: Batch) -> StepOutput:
        be, cfg = self.backend, self.cfg
        R = len(batch.logits_rows)
        logits = be.empty((R, cfg.n_vocab), np.float32)
        best = be.empty((R,), np.int32)
        if R == 0:
            return StepOutput(logits, best)
        sel = be.empty((R, cfg.n_embd), np.float32)
        basic.gather_rows(be, x, be.upload(batch.logits_rows), sel, R, cfg.n_embd)
        basic.rmsnorm(be, sel, self.output_norm, sel, R, cfg.n_embd, cfg.rms_eps)
        self._mm(self.output, sel, logits, R)
        basic.argmax(be, logits, best, R, cfg.n_vocab)
        return StepOutput(logits, best)
