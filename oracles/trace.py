"""Where a kernel path leaves the reference: one prefill step, op by op, beside the NumPy reference.

When kernel-vs-reference reports a logit error too large, or non-finite logits, this names the
first op out of its bound -- layer, op, the kernels it launched (file:entry), its error against
the bound, and where (token, column) -- and the op where the first non-finite value appeared.

How: the prompt runs as one prefill step through the ForwardPass's own machinery (its weights,
a Workspace and descriptor of its own, StepKernels' methods: the units a step is made of), but
eagerly, one method at a time, downloading the buffers each wrote. Each op is checked LOCALLY:
the reference's version of the op (the formulas oracles/reference.py calls, the ops' NumPy
twins, and the Reference's dequantized weights, in float64) is fed the kernel path's own input to that op, downloaded just before, and
compared with the kernel's output. So an error never compounds over layers: the first op out of
its bound is the buggy one, and bounds can be as tight as one op's rounding (oracles/tolerances.py,
TRACE_BOUNDS, with the measured figures).

    op             what is compared (kernel output vs reference of the kernel's input)
    embedding      x vs the token_embd rows (x sqrt(n_embd): gemma3)
    attn_norm      the normed x as the QKV matmul reads it (float, or its q8_1 copy) vs rmsnorm
    qkv            ws.qkv vs input @ Wqkv^T (+ bias)
    rope           Q and K rotated in place (after QK-norm: qwen3, gemma3; Q times mistral3's
                   attention temperature), V untouched
    kv_append      the K/V rows read back from the paged cache through the block table vs the
                   kernel's own rotated K and V in the cache's dtype (bit for bit)
    attention      ws.att vs softmax(q K^T * scale + mask) V over the K/V read back from the cache
                   (gpt-oss: each head's sink in the softmax)
    attn_q8        (q8_1 matmuls) the attention output's q8_1 copy vs ws.att rounded
    o_proj         ws.proj vs att @ Wo^T (+ gpt-oss's bias), or, fused into the residual (dp4a), x vs x + att @ Wo^T
    attn_residual  x vs x + proj (gemma3: x + rmsnorm(proj) * post_attention_norm)
    ffn_norm, gate_up (act(h Wg^T) * h Wu^T), ffn_q8, down, ffn_residual: the FFN alike
  an MoE layer's FFN (qwen3moe, Mixtral-style llama, gpt-oss: each with its biases), after its ffn_norm:
    moe_route      the router's choice: the reference's probabilities (softmax of h Winp^T, float64;
                   gpt-oss: its logits, top-k softmax gating)
                   at the kernel's k experts vs its own top k in order -- 0 when the kernel picked the
                   reference's top k, a rounding-sized gap where a near tie flipped, large for a wrong
                   expert
    moe_weights    the kernel's renormalised weights vs the reference's for the kernel's experts
    moe_gate_up    each (token, expert) pair's act(h Wg_e^T) * h Wu_e^T (gpt-oss: the clamped SwiGLU),
                   for the kernel's experts
    moe_q8         (q8_1 experts) the pairs' q8_1 copy, as attn_q8
    moe_down       each pair's expert output, its own input @ Wd_e^T
    moe_combine    x vs x + the k pair outputs (+ their down biases), weighted by the kernel's own
                   weights, in rank order
    output_norm    the gathered rows of x, normed (head), and lm_head: the logits (softcapped)

A q8_1 activation (the fast set) is measured in steps of its 32-value block (amax/127): the
kernel's dequantized values sit within half a step of the float reference (plus slack), wherever
a rounding edge falls. Non-finite values fail every check; the first op whose output holds one is
its origin (`first_nonfinite`), and the report says whether that op's own input was finite.

trace_step(fp, tokens) -> TraceReport (records, first_divergence, first_nonfinite, describe(),
to_json()); `sharpinf verify MODEL --trace` runs it for each kernel set after the oracles. The
report is oracles/trace_report.py, the shared checks and float64 products oracles/trace_ops.py, an
MoE layer's FFN oracles/trace_moe.py; this file walks the step.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from oracles.paths import reference_for
from oracles.reference import Reference, attention_mask
from oracles.trace_moe import trace_moe
from oracles.trace_ops import F64, TINY, OpChecks, abs_dot, attention64, entry_of, file_of, linear64, q8_steps, \
    q8_values, row_unit
from oracles.trace_report import OpRecord, TraceReport
from sharpinf.errors import SharpinfError
from sharpinf.ops.basic import act_reference, rmsnorm_reference
from sharpinf.ops.kv_cache import decode_kv, encode_kv
from sharpinf.ops.rope import rope_reference
from sharpinf.step.batch import Batch, SeqChunk
from sharpinf.step.buffers import StepCapacity
from sharpinf.step.forward import ForwardPass
from sharpinf.step.kv_pool import KVPool, kv_dtype_name

HEAD_ROWS = 16  # logits rows the head is checked on


class _Tracer(OpChecks):
    """The step walked op by op: the dense layers' units in order, an MoE layer's FFN (trace_moe), the head."""

    def sublayer_out(self, layer, prefix: str, names, W, a_read, post_norm, x0, proj_dev, bias=None) -> np.ndarray:
        """The o-projection (gpt-oss: with its bias) or the FFN's down projection and its residual add;
        returns x after."""
        be = self.be
        adds = [n for n in names if entry_of(n) in ("add_f32", "rmsnorm_add_f32")]
        mm = [n for n in names if n not in adds]
        x1 = self.dl(self.fp.ws.x)
        proj_op, res_op = ("o_proj", "attn_residual") if prefix == "attn" else ("down", "ffn_residual")
        if post_norm is not None or bias is not None or not self.fp.choice.q8_activations:  # into ws.proj, then an add
            proj = be.download(proj_dev[: self.N])
            self.check_linear(layer, proj_op, mm, a_read, W, bias, proj)
            self.check_residual(layer, res_op, adds, x0, proj, post_norm, x1)
        else:  # a q8_1 matmul adds into x itself: x1 = x0 + a W^T
            self.check_linear(layer, proj_op, mm, a_read, W, None, x1, base=x0)
        return x1

    # -- the step -----------------------------------------------------------------------------------
    def run(self, d) -> None:
        fp, be, cfg, ref, N = self.fp, self.be, self.cfg, self.ref, self.N
        ws, k, dv = fp.ws, fp.step_kernels, d.d
        ids = np.asarray(self.batch.token_ids, np.int64)
        positions = np.asarray(self.batch.positions, np.int64)
        slots = np.asarray(self.batch.slot_mapping, np.int64)

        k.shapes = fp.step_shapes(self.batch, N, self.pool.kv_dtype, d)  # as submit() keys the step
        _, names = self.call(lambda: fp.launches.embed(N, d))
        x = self.dl(ws.x)
        want = ref.token_embd[ids].astype(F64) * float(np.float32(cfg.embd_scale))
        self.check(None, "embedding", names, "embedding", x, want, row_unit(want), (ref.token_embd[ids],))

        for li, (L, R) in enumerate(zip(fp.layers, ref.layers)):
            x0 = x
            a, names = self.call(lambda: k.norm(ws.x, L.attn_norm, N, getattr(ws, "h", None), getattr(ws, "xq", None)))
            h = self.check_norm(li, "attn_norm", names, x0, R.attn_norm, a)

            _, names = self.call(lambda: k.qkv(L, a, N))
            qkv0 = self.dl(ws.qkv)
            self.check_linear(li, "qkv", names, h, R.wqkv, R.bqkv, qkv0, columns=self.qkv_column)

            _, names = self.call(lambda: k.rope_kv(L, self.pool, li, dv["positions"], dv["slot_mapping"], N))
            qkv1 = self.dl(ws.qkv)
            self.check_rope(li, [n for n in names if file_of(n) in ("qk_norm.cu", "rope.cu", "rope_kv.cu")], qkv0,
                            qkv1, R, positions)
            kst = be.download(self.pool.k[li])[slots]
            vst = be.download(self.pool.v[li])[slots]
            keys, vals = self.check_kv(li, [n for n in names if file_of(n) in ("kv_cache.cu", "rope_kv.cu")], qkv1,
                                       kst, vst)

            o, names = self.call(lambda: k.attention(self.pool, li, d, N, L.attn_sinks))
            att = self.dl(ws.att)
            q8_names = [n for n in names if entry_of(n) == "quantize_q8_1"]
            att_names = [n for n in names if file_of(n).startswith("attention")]
            self.check_attention(li, att_names, qkv1, keys, vals, positions, att)
            o_read = att
            if o.q is not None:  # the o-projection reads the q8_1 copy (the split merge writes it itself)
                o_read = self.check_q8_copy(li, "attn_q8", q8_names or att_names, att, o.q)

            _, names = self.call(lambda: k.residual(L.wo, o, L.post_attn_norm, ws.x, N, bias=L.wo_b))
            x1 = self.sublayer_out(li, "attn", names, R.wo, o_read, R.post_attn_norm, x0, getattr(ws, "proj", None),
                                   R.wo_b)
            if L.moe is not None:
                x = trace_moe(self, li, L, R, x1)
                continue

            a, names = self.call(lambda: k.norm(ws.x, L.ffn_norm, N, getattr(ws, "h", None), getattr(ws, "xq", None)))
            h = self.check_norm(li, "ffn_norm", names, x1, R.ffn_norm, a)

            _, names = self.call(lambda: k.ffn(L, a, ws.x, N))
            # the launches up to the gated activation (or the fused gate+up kernel) make ws.gate
            cut = 1 + max((i for i, n in enumerate(names)
                           if entry_of(n).endswith("_gate_f32") or file_of(n).startswith("gate_up")), default=-1)
            gate = self.dl(ws.gate)
            self.check_gate_up(li, names[:cut], h, R, gate)
            rest = names[cut:]
            f_read = gate
            ffq = getattr(ws, "ffq", None)
            if fp.choice.q8_activations and ffq is not None:
                f_read = self.check_q8_copy(li, "ffn_q8", [n for n in rest if entry_of(n) == "quantize_q8_1"], gate, ffq)
            x = self.sublayer_out(li, "ffn", [n for n in rest if entry_of(n) != "quantize_q8_1"], R.w_down, f_read,
                                  R.post_ffn_norm, x1, getattr(ws, "proj", None))

        self.trace_head(d, x)

    def check_rope(self, li: int, names, qkv0: np.ndarray, qkv1: np.ndarray, R, positions) -> None:
        cfg, N = self.cfg, self.N
        hd, qd, kd = cfg.head_dim, cfg.q_dim, cfg.kv_dim
        q = qkv0[:, :qd].reshape(N, cfg.n_head, hd).astype(F64)
        kk = qkv0[:, qd : qd + kd].reshape(N, cfg.n_head_kv, hd).astype(F64)
        if R.q_norm is not None:
            q, kk = rmsnorm_reference(q, R.q_norm, cfg.rms_eps), rmsnorm_reference(kk, R.k_norm, cfg.rms_eps)
        rope = self.ref.rope[li]  # the reference's table: the truth, from the file
        temp = (cfg.attn_temp_scale, cfg.n_ctx_orig)  # the queries' temperature (mistral3), not the keys'
        want = np.concatenate([rope_reference(q, positions, rope.freqs, cfg.rope_style, rope.mscale, *temp).reshape(N, qd),
                               rope_reference(kk, positions, rope.freqs, cfg.rope_style, rope.mscale).reshape(N, kd),
                               qkv0[:, qd + kd :].astype(F64)], axis=1)  # V untouched
        self.check(li, "rope", names, "rope", qkv1, want, row_unit(want), (qkv0, R.q_norm, R.k_norm),
                   columns=self.qkv_column)

    def check_kv(self, li: int, names, qkv1: np.ndarray, kst: np.ndarray, vst: np.ndarray):
        """The cache rows of this step's tokens equal the kernel's own K and V in the cache's dtype;
        returns them decoded (what attention reads)."""
        cfg, N, dt = self.cfg, self.N, self.pool.kv_dtype
        qd, kd, shape = cfg.q_dim, cfg.kv_dim, (N, cfg.n_head_kv, cfg.head_dim)
        keys, vals = decode_kv(dt, kst), decode_kv(dt, vst)
        k_own, v_own = qkv1[:, qd : qd + kd].reshape(shape), qkv1[:, qd + kd :].reshape(shape)
        want = np.concatenate([decode_kv(dt, encode_kv(dt, k_own)).reshape(N, kd),
                               decode_kv(dt, encode_kv(dt, v_own)).reshape(N, kd)], axis=1)
        got = np.concatenate([keys.reshape(N, kd), vals.reshape(N, kd)], axis=1)
        self.check(li, "kv_append", names, "kv_append", got, want, row_unit(want), (qkv1,), columns=self.kv_column)
        return keys, vals

    def check_attention(self, li: int, names, qkv1, keys, vals, positions, att) -> None:
        cfg, N = self.cfg, self.N
        q = qkv1[:, : cfg.q_dim].reshape(N, cfg.n_head, cfg.head_dim)
        mask = attention_mask(positions, N, cfg.window(li))
        flash = self.fp.choice.of("attention").rounding == "f16_operands"  # its declared rounding
        # flash multiplies f16 operands: Q, K and V rounded as the kernel rounds them (P's rounding is
        # what its bound allows for); without this the error would grow with the scores' size
        q_, k_, v_ = (a.astype(np.float16) for a in (q, keys, vals)) if flash else (q, keys, vals)
        want = attention64(q_, k_, v_, mask, float(np.float32(cfg.kq_scale)), self.ref.layers[li].sinks)
        vmax = float(np.abs(vals).max()) if np.isfinite(vals).all() else np.inf
        self.check(li, "attention", names, "attention_f16_operands" if flash else "attention", att, want, max(vmax, TINY),
                   (q, keys, vals), columns=self.head_column)

    def check_gate_up(self, li: int, names, h, R, gate) -> None:
        cfg = self.cfg
        g = linear64(h, R.w_gate_up[: cfg.n_ff])
        u = linear64(h, R.w_gate_up[cfg.n_ff :])
        want = act_reference(cfg.ffn_act, g) * u
        self.check(li, "gate_up", names, "gate_up", gate, want, row_unit(want), (h, R.w_gate_up))

    def trace_head(self, d, x: np.ndarray) -> None:
        fp, ref, cfg, ws = self.fp, self.ref, self.cfg, self.fp.ws
        tokens = np.asarray(self.batch.logits_rows, np.int64)
        R = len(tokens)
        _, names = self.call(lambda: fp.launches.head(R, False, d))
        norm_names = [n for n in names if file_of(n) in ("gather.cu", "rmsnorm.cu", "rmsnorm_q8_1.cu")]
        rows = x[tokens]
        want = rmsnorm_reference(rows.astype(F64), ref.output_norm, cfg.rms_eps)
        selq = getattr(ws, "selq", None)
        if fp.choice.q8_activations and selq is not None:
            got, note = q8_values(self.be, selq, R)
            step = q8_steps(want)
            self.check(None, "output_norm", norm_names, "norm_q8", got, want, step, (rows, ref.output_norm),
                       slack=0.5 * step, detail=note, tokens=tokens)
            if note:
                self.records[-1].err = np.inf
        else:
            got = self.dl(ws.sel, R)
            self.check(None, "output_norm", norm_names, "norm", got, want, row_unit(want), (rows, ref.output_norm),
                       tokens=tokens)
        logits = self.dl(ws.logits, R)
        lm = linear64(got, ref.output)
        unit = abs_dot(got, ref.output)
        if cfg.final_softcap:  # cap * tanh(y / cap): its slope is at most 1, so the matmul's unit still holds
            lm = cfg.final_softcap * np.tanh(lm / cfg.final_softcap)
        self.check(None, "lm_head", [n for n in names if n not in norm_names], "matmul", logits, lm,
                   np.maximum(unit, TINY), (got, ref.output), tokens=tokens)


def trace_step(fp: ForwardPass, tokens, kv_dtype: str = "f16", block_size: int = 16, seed: int = 0,
               reference: Reference | None = None) -> TraceReport:
    """Run `tokens` as one prefill step of fp's kernel path, op by op, checking each op against the
    reference fed the op's own input. fp's own buffers and plans are not touched (the trace runs in
    buffers of its own over the same uploaded weights); the KV pool is fresh, NaN-poisoned, its
    blocks handed out in a seeded random order (block tables are not contiguous, as under load); the
    head runs on HEAD_ROWS logits rows spread over the prompt, the last included."""
    tokens = [int(t) for t in tokens]
    cfg = fp.cfg
    if not tokens:
        raise SharpinfError("trace: no tokens to run")
    if min(tokens) < 0 or max(tokens) >= cfg.n_vocab:
        raise SharpinfError(f"trace: token ids must be in [0, {cfg.n_vocab})")
    if len(tokens) > cfg.context_length:
        raise SharpinfError(f"trace: {len(tokens)} tokens exceed the context of {cfg.context_length}")
    kv_dtype = kv_dtype_name(kv_dtype)
    N = len(tokens)
    # the head on a spread of rows, the last included: a 262k-token vocabulary's logits for every
    # token of a long prompt would be gigabytes, and a few rows check gather, norm and LM head
    rows = np.unique(np.linspace(0, N - 1, min(N, HEAD_ROWS)).round().astype(np.int32))
    tfp = fp.with_own_buffers(StepCapacity(N, 1, len(rows), 1))
    need = -(-N // block_size)
    pool = KVPool(fp.backend, cfg, num_blocks=need + 2, block_size=block_size, kv_dtype=kv_dtype)
    pool.poison()  # a read of a slot nobody wrote shows as NaN
    table = np.random.default_rng(seed).permutation(pool.num_blocks)[:need].tolist()
    batch = replace(Batch.build([SeqChunk(tokens, 0, table)], block_size), logits_rows=rows)
    batch.validate(pool.num_blocks, cfg.n_vocab, cfg.kv_window)
    d = tfp._bind(pool, batch.block_tables.shape[1])
    d.upload(d.pack(batch, N, len(rows), None))  # exact shape, no padding: the step as the kernels see it
    if reference is None:  # the reference of verify's oracles: weights dequantized once
        reference = reference_for(fp.model, kv_dtype)
    tracer = _Tracer(tfp, reference, pool, batch)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):  # non-finite values are findings here
        tracer.run(d)
    tfp.release_plans()
    return TraceReport(model=fp.model.path.name, kernels=fp.choice.name, kv_dtype=kv_dtype, n_tokens=N,
                       block_size=block_size, records=tracer.records)


__all__ = ["OpRecord", "TraceReport", "trace_step"]
