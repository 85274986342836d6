"""The launches of one layer and of the logits head, op by op, in the kernel variants chosen
(ops/variants.py). forward.py says what a layer computes; this file says which kernels do it.

Which kernel runs each op is looked up in the variant registry (`sharpinf kernels list` prints it):
the chosen Variant's launcher is called, never a name tested here, so a registered variant runs its
own kernels. The norm and the gate+up kernels are the ones the matmul variant declares it brings, and
what the linear layers read (float or q8_1) is its declared activations (KernelChoice.q8_activations).
The dense FFN and the work between two attentions are strategies of their own (ops ffn and link):
their baselines (`separate`) run the other ops' launches; a fused variant's launcher runs them as one
cooperative launch where it serves the step and returns False (the separate launches run) where not.
What a variant needs besides (a grid barrier, the link's q8_1 buffer) is its declared scratch, in the
Workspace. A layer is 14 launches in the simple set (16 with qwen3's qk-norm), 9 in the fast one (7
with ffn=fused at decode, 2 with link=layer: the attention and the link); an MoE layer (qwen3moe) 15
and 12 (its FFN: the norm, then the moe variant's launches). Gemma 3 takes each layer's window and
RoPE base from the config, GeGLU in place of SwiGLU (the same kernels, another epilogue), and its
post-norms (one launch each, the projections no longer add into x themselves). An `Act` is an
activation in the form the next matmul reads: float rows, or their q8_1 copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


from sharpinf.errors import SharpinfError
from sharpinf.step.weights import DeviceLayer, DeviceMatrix
from sharpinf.model.config import ModelConfig
from sharpinf.ops import basic
from sharpinf.ops.layer_dp4a import LinkPost, LinkPre, LinkStep
from sharpinf.ops.quant_act import Q8Act, quantize_q8_1
from sharpinf.ops.variants import KernelChoice, Variant
from sharpinf.step.buffers import Workspace


@dataclass
class Act:
    """An activation as a matmul reads it: float32 rows (simple) or q8_1 (dp4a)."""

    f: Any = None
    q: Q8Act | None = None


@dataclass
class StepKernels:
    be: Any
    cfg: ModelConfig
    choice: KernelChoice
    ws: Workspace

    def __post_init__(self):
        self.mm: Variant = self.choice.of("matmul")
        self.dense_ffn: Variant = self.choice.of("ffn")
        self.link: Variant = self.choice.of("link")
        self.attn: Variant = self.choice.of("attention")
        self.rope: Variant = self.choice.of("rope_kv")
        self.moe: Variant = self.choice.of("moe")
        self.sampler: Variant = self.choice.of("sample")
        self.windows = tuple(sorted({self.cfg.window(li) for li in range(self.cfg.n_layer)}))  # 0: whole context
        self.shapes: tuple[str, ...] = ()  # the attention's launch shape per window for the step being emitted

    def attention_shapes(self, kv_dtype: str, N: int, n_seqs: int, keys: int | None,
                         mode: str | None = None) -> tuple[str, ...]:
        """The attention variant's launch shape ("split" or "walk", its `shape` function's choice) for
        each of the model's windows, in a step of N tokens of at most n_seqs sequences whose longest
        context is `keys` keys (None: not known); () for a variant with one shape. The forward pass keys
        a step's plan by it. mode forces one (where the kernel cannot walk, "walk" gives "split")."""
        if self.attn.shape is None:
            return ()
        cfg = self.cfg

        def shape(w: int) -> str:
            try:
                return self.attn.shape(self.be, kv_dtype, N, n_seqs, cfg.n_head, cfg.n_head_kv, cfg.head_dim, keys, w,
                                       mode, file=self.attn.files[0])
            except SharpinfError:
                if mode != "walk":
                    raise
                return "split"  # this head_dim does not walk (flash at 256)
        return tuple(shape(w) for w in self.windows)

    # -- norms and linear layers --------------------------------------------------------------
    def norm(self, x, w, rows: int, out_f=None, out_q: Q8Act | None = None) -> Act:
        """rmsnorm(x) * w for `rows` rows of n_embd, in the form the next matmul reads (by the matmul
        variant's own norm: float rows, or q8_1 written by the norm itself)."""
        q8 = self.choice.q8_activations
        self.mm.norm(self.be, x, w, out_q if q8 else out_f, rows, self.cfg.n_embd, self.cfg.rms_eps)
        return Act(q=out_q) if q8 else Act(f=out_f)

    def quantized(self, f, q: Q8Act, rows: int) -> Act:
        """Float rows the next matmul reads: as they are (f32 activations) or quantized to q8_1."""
        if not self.choice.q8_activations:
            return Act(f=f)
        quantize_q8_1(self.be, f, q, rows, q.n)
        return Act(f=f, q=q)

    def linear(self, W: DeviceMatrix, a: Act, Y, rows: int, bias=None, accumulate: bool = False,
               y_stride: int | None = None, y_col: int = 0) -> None:
        """Y (=, or += with accumulate) a W^T (+ bias); Y may be a column range of a wider buffer."""
        be, launch = self.be, self.mm.launch  # the variant's launcher, on its own file
        if self.choice.q8_activations:  # the q8_1 launchers also add into Y themselves
            return launch(be, W.raw, W.qtype, a.q, Y, rows, W.n_out, W.n_in, bias_dev=bias, accumulate=accumulate,
                          y_stride=y_stride, y_col=y_col)
        if not accumulate:
            return launch(be, W.raw, W.qtype, a.f, Y, rows, W.n_out, W.n_in, bias_dev=bias, y_stride=y_stride,
                          y_col=y_col)
        assert bias is None and y_stride is None, "the residual adds have neither"
        launch(be, W.raw, W.qtype, a.f, self.ws.proj, rows, W.n_out, W.n_in)
        basic.add(be, Y, self.ws.proj, Y, rows * W.n_out)

    # -- the layer's parts ----------------------------------------------------------------------
    def qkv(self, L: DeviceLayer, a: Act, N: int) -> None:
        """ws.qkv = a [Wq; Wk; Wv]^T (+ bias): one matmul, or three into their column ranges
        when Q, K and V have different quant types."""
        if len(L.wqkv) == 1:
            return self.linear(L.wqkv[0], a, self.ws.qkv, N, bias=L.bqkv)
        col, width = 0, self.cfg.q_dim + 2 * self.cfg.kv_dim
        for W in L.wqkv:
            bias = None if L.bqkv is None else L.bqkv[col : col + W.n_out]
            self.linear(W, a, self.ws.qkv, N, bias=bias, y_stride=width, y_col=col)
            col += W.n_out

    def rope_kv(self, L: DeviceLayer, kv, li: int, positions, slots, N: int) -> None:
        """(qwen3) per-head RMSNorm of Q and K, RoPE of Q and K (mistral3: Q times its attention temperature),
        then K and V into the paged cache."""
        cfg = self.cfg
        self.rope.launch(self.be, kv.kv_dtype, self.ws.qkv, cfg.q_dim + 2 * cfg.kv_dim, positions, slots, L.q_norm, L.k_norm,
           kv.k[li], kv.v[li], N, cfg.n_head, cfg.n_head_kv, cfg.head_dim, L.rope_freqs, cfg.rms_eps, cfg.rope_style,
           mscale=L.rope_mscale, temp_scale=cfg.attn_temp_scale, temp_floor=cfg.n_ctx_orig)

    def attention(self, kv, li: int, d, N: int, sinks=None) -> Act:
        """ws.att = varlen paged causal attention of the step's queries over their sequences' KV (sinks: the
        layer's attn_sinks, gpt-oss's, or None)."""
        be, cfg, ws, dv = self.be, self.cfg, self.ws, d.d
        args = (be, kv.kv_dtype, ws.qkv, cfg.q_dim + 2 * cfg.kv_dim, kv.k[li], kv.v[li], dv["block_tables"], d.width,
                dv["cu_seqlens"], dv["positions"], ws.att, N, d.cap.seqs + 1, cfg.n_head, cfg.n_head_kv,
                cfg.head_dim, kv.block_size, cfg.kq_scale)
        fused_q8 = self.attn.writes_q8 and self.choice.q8_activations and cfg.head_dim % 32 == 0  # its merge writes q8_1
        shape = dict(mode=self.shapes[self.windows.index(cfg.window(li))]) if self.shapes else {}
        self.attn.launch(*args, getattr(ws, "split", None), ws.attq if fused_q8 else None, sliding_window=cfg.window(li),
                         softcap=cfg.attn_softcap, sinks=sinks, **shape)
        if fused_q8:
            return Act(f=ws.att, q=ws.attq)
        return self.quantized(ws.att, getattr(ws, "attq", None), N)

    def ffn(self, L: DeviceLayer, a: Act, x, N: int) -> None:
        """x += (act(a Wg^T) * (a Wu^T)) Wd^T (through the post-norm when the model has one)."""
        be, cfg, ws = self.be, self.cfg, self.ws
        g, u = L.w_gate, L.w_up
        if not self.dense_ffn.separate and L.post_ffn_norm is None and self.dense_ffn.launch(
                be, g.raw, u.raw, L.w_down.raw, (g.qtype, u.qtype, L.w_down.qtype), a.q, ws.gate, ws.ffq, x, N,
                cfg.n_ff, cfg.n_embd, cfg.ffn_act, ws.grid_bar):
            return  # the ffn variant's one launch (it returns False where it does not serve: the launches below)
        if self.mm.gate_up is not None and g.qtype == u.qtype:
            self.mm.gate_up(be, g.raw, u.raw, g.qtype, a.q, ws.gate, N, cfg.n_ff, cfg.n_embd, act=cfg.ffn_act)
        else:  # the fused kernel's result bit for bit (its epilogue is act_gate's arithmetic)
            self.linear(g, a, ws.gate, N)
            self.linear(u, a, ws.up, N)
            basic.act_gate(be, ws.gate, ws.up, ws.gate, N * cfg.n_ff, cfg.ffn_act)
        self.residual(L.w_down, self.quantized(ws.gate, getattr(ws, "ffq", None), N), L.post_ffn_norm, x, N)

    def moe_ffn(self, L: DeviceLayer, li: int, x, N: int) -> None:
        """x += the MoE FFN of norm(x) (qwen3moe, gpt-oss): the norm in the form the moe variant reads, then its
        launcher (router, experts, rank-order combine into x; gpt-oss's biases and gating ride in L.moe,
        its clamped SwiGLU is cfg.ffn_act)."""
        assert L.post_ffn_norm is None, "no MoE arch has an FFN post-norm"
        ws, cfg = self.ws, self.cfg
        q8 = self.moe.activations == "q8_1"
        out = ws.xq if q8 else ws.h
        self.moe.norm(self.be, x, L.ffn_norm, out, N, cfg.n_embd, cfg.rms_eps)
        self.moe.launch(self.be, L.moe, x, ws.moe, N, x_f=None if q8 else out, x_q=out if q8 else None,
                        act=cfg.ffn_act, layer=li)

    def residual(self, W: DeviceMatrix, a: Act, post_norm, x, N: int, bias=None) -> None:
        """x += a W^T, or with a post-norm (gemma3) x += rmsnorm(a W^T) * post_norm; with a bias (gpt-oss's
        o-projection) x += (a W^T + bias), the sum formed first as the reference forms it."""
        if bias is not None:
            assert post_norm is None, "no arch has both"
            self.linear(W, a, self.ws.proj, N, bias=bias)
            return basic.add(self.be, x, self.ws.proj, x, N * W.n_out)
        if post_norm is None:
            return self.linear(W, a, x, N, accumulate=True)
        self.linear(W, a, self.ws.proj, N)
        basic.rmsnorm_add(self.be, self.ws.proj, post_norm, x, N, self.cfg.n_embd, self.cfg.rms_eps)

    # -- a whole layer, all layers, the head ---------------------------------------------------------
    def pre_attention(self, L: DeviceLayer, li: int, kv, d, N: int) -> None:
        """ws.qkv = norm(x) [Wq; Wk; Wv]^T, then QK-norm, RoPE and the KV append."""
        ws = self.ws
        a = self.norm(ws.x, L.attn_norm, N, getattr(ws, "h", None), getattr(ws, "xq", None))
        self.qkv(L, a, N)
        self.rope_kv(L, kv, li, d.d["positions"], d.d["slot_mapping"], N)

    def post_attention(self, L: DeviceLayer, li: int, o: Act, N: int) -> None:
        """x += o Wo^T; x += ffn(norm(x)) (or the MoE FFN)."""
        ws = self.ws
        x = ws.x
        self.residual(L.wo, o, L.post_attn_norm, x, N, bias=L.wo_b)
        if L.moe is not None:
            return self.moe_ffn(L, li, x, N)
        a = self.norm(x, L.ffn_norm, N, getattr(ws, "h", None), getattr(ws, "xq", None))
        self.ffn(L, a, x, N)

    def layer(self, L: DeviceLayer, li: int, kv, d, N: int) -> None:
        """x += attention(norm(x)); x += ffn(norm(x)) for the step's N tokens."""
        self.pre_attention(L, li, kv, d, N)
        self.post_attention(L, li, self.attention(kv, li, d, N, L.attn_sinks), N)

    def layers(self, layers: list[DeviceLayer], kv, d, N: int) -> None:
        """Every layer for the step's N tokens. With a link variant (not `separate`), each attention and
        one launch for all that lies between two attentions -- the layer's o-projection and FFN, the
        next layer's norm, QKV and RoPE/KV append; where the link declines (a larger step, mixed weight
        types, an MoE layer, post-norms) the separate launches run for that half. The same bits either
        way (the link requires the choice whose launches it stands for: variants.toml)."""
        if self.link.separate:
            for li, L in enumerate(layers):
                self.layer(L, li, kv, d, N)
            return
        step = self._link_step(N, kv, d)  # the same for every link of the step
        link = lambda post, pre: self.link.launch(self.be, post, pre, step)  # noqa: E731
        waiting = None  # (L, li, o): a layer past its attention, its o-projection and FFN still to run
        for li, L in enumerate(layers):
            pre = self._link_pre(L, li, kv)
            post = None if waiting is None else self._link_post(*waiting)
            if post is None or pre is None or not link(post, pre):
                if waiting is not None:  # its half alone, before this layer's
                    if post is None or not link(post, None):
                        self.post_attention(*waiting, N)
                if pre is None or not link(None, pre):
                    self.pre_attention(L, li, kv, d, N)
            waiting = (L, li, self.attention(kv, li, d, N, L.attn_sinks))
        post = self._link_post(*waiting)
        if post is None or not link(post, None):
            self.post_attention(*waiting, N)

    def _link_post(self, L: DeviceLayer, li: int, o: Act) -> LinkPost | None:
        """The link's post half for a dense layer with no post-norms, or None."""
        if (L.moe is not None or L.post_attn_norm is not None or L.post_ffn_norm is not None or L.wo_b is not None
                or o.q is None
                or getattr(self.ws, "ffq", None) is None):
            return None
        return LinkPost((L.wo.qtype, L.w_gate.qtype, L.w_up.qtype, L.w_down.qtype), L.wo.raw, o.q, L.ffn_norm,
                        L.w_gate.raw, L.w_up.raw, L.w_down.raw)

    def _link_pre(self, L: DeviceLayer, li: int, kv) -> LinkPre | None:
        """The link's pre half for a layer whose QKV is one matrix, or None (the rope_kv variant whose
        QK-norm the link runs is its requirement)."""
        if len(L.wqkv) != 1:
            return None
        return LinkPre(L.wqkv[0].qtype, L.attn_norm, L.wqkv[0].raw, L.bqkv, L.q_norm, L.k_norm, kv.k[li], kv.v[li],
                       L.rope_freqs, L.rope_mscale)

    def _link_step(self, N: int, kv, d) -> LinkStep:
        cfg, ws, dv = self.cfg, self.ws, d.d
        return LinkStep(ws.x, ws.xq, ws.linkq, getattr(ws, "gate", None), getattr(ws, "ffq", None), ws.qkv,
                        dv["positions"], dv["slot_mapping"], ws.grid_bar, kv.kv_dtype, N, cfg.n_embd, cfg.n_ff,
                        cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.rms_eps, cfg.rope_style, cfg.ffn_act,
                        cfg.attn_temp_scale, cfg.n_ctx_orig)

    def head(self, output_norm, output: DeviceMatrix, rows_dev, R: int) -> None:
        """ws.logits[:R] = LM head of the final norm of the rows of x that want logits."""
        ws = self.ws
        basic.gather_rows(self.be, ws.x, rows_dev, ws.sel, R, self.cfg.n_embd)
        a = self.norm(ws.sel, output_norm, R, ws.sel, getattr(ws, "selq", None))
        self.linear(output, a, ws.logits, R)
        if self.cfg.final_softcap:
            basic.softcap(self.be, ws.logits, R * self.cfg.n_vocab, self.cfg.final_softcap)
