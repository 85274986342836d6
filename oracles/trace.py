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
    rope           Q and K rotated in place (after QK-norm: qwen3, gemma3), V untouched
    kv_append      the K/V rows read back from the paged cache through the block table vs the
                   kernel's own rotated K and V in the cache's dtype (bit for bit)
    attention      ws.att vs softmax(q K^T * scale + mask) V over the K/V read back from the cache
    attn_q8        (q8_1 matmuls) the attention output's q8_1 copy vs ws.att rounded
    o_proj         ws.proj vs att @ Wo^T, or, fused into the residual (dp4a), x vs x + att @ Wo^T
    attn_residual  x vs x + proj (gemma3: x + rmsnorm(proj) * post_attention_norm)
    ffn_norm, gate_up (act(h Wg^T) * h Wu^T), ffn_q8, down, ffn_residual: the FFN alike
  an MoE layer's FFN (qwen3moe, Mixtral-style llama), after its ffn_norm:
    moe_route      the router's choice: the reference's probabilities (softmax of h Winp^T, float64)
                   at the kernel's k experts vs its own top k in order -- 0 when the kernel picked the
                   reference's top k, a rounding-sized gap where a near tie flipped, large for a wrong
                   expert
    moe_weights    the kernel's renormalised weights vs the reference's for the kernel's experts
    moe_gate_up    each (token, expert) pair's act(h Wg_e^T) * h Wu_e^T, for the kernel's experts
    moe_q8         (q8_1 experts) the pairs' q8_1 copy, as attn_q8
    moe_down       each pair's expert output, its own input @ Wd_e^T
    moe_combine    x vs x + the k pair outputs, weighted by the kernel's own weights, in rank order
    output_norm    the gathered rows of x, normed (head), and lm_head: the logits (softcapped)

A q8_1 activation (the fast set) is measured in steps of its 32-value block (amax/127): the
kernel's dequantized values sit within half a step of the float reference (plus slack), wherever
a rounding edge falls. Non-finite values fail every check; the first op whose output holds one is
its origin (`first_nonfinite`), and the report says whether that op's own input was finite.

trace_step(fp, tokens) -> TraceReport (records, first_divergence, first_nonfinite, describe(),
to_json()); `sharpinf verify MODEL --trace` runs it for each kernel set after the oracles.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable

import numpy as np

from oracles.reference import Reference, attention_mask
from oracles.tolerances import TraceBound, trace_bound
from sharpinf.step.batch import Batch, SeqChunk
from sharpinf.errors import SharpinfError
from sharpinf.step.forward import ForwardPass
from sharpinf.step.kv_pool import KVPool, kv_dtype_name
from sharpinf.ops.kv_cache import decode_kv, encode_kv
from sharpinf.ops.basic import act_reference, rmsnorm_reference
from sharpinf.ops.moe import WEIGHT_SUM_FLOOR
from sharpinf.ops.quant_act import QBLOCK, dequantize_q8_1
from sharpinf.ops.rope import rope_reference
from sharpinf.step.buffers import StepCapacity
from sharpinf.step.kernels import Act

F64 = np.float64
_TINY = 1e-30  # a unit of zero (an all-zero row or block) must not divide by zero
_CHUNK = 4096  # weight rows per float64 product: an LM head of 262k rows stays a few MB at a time
HEAD_ROWS = 16  # logits rows the head is checked on


@dataclass
class OpRecord:
    """One op of the traced step: its error against the reference fed its own input."""

    layer: int | None  # None: the embedding and the head
    op: str
    kernels: list[str]  # "file:entry" of each launch that wrote this op's output
    err: float  # the worst element's error in the metric's unit (inf: non-finite)
    bound: float
    metric: str  # what err measures
    max_abs_err: float  # largest |kernel - reference| over the finite elements
    where: tuple[int, int] | None  # (token, column) of the worst element (the first non-finite one)
    column: str  # what that column is ("K head 1, dim 3")
    got: float | None  # the kernel's value there
    want: float | None  # the reference's value there
    finite: bool  # every element of the kernel's output is finite
    inputs_finite: bool  # the kernel path's input to this op was finite
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.finite and self.err <= self.bound

    @property
    def name(self) -> str:
        return self.op if self.layer is None else f"layer {self.layer} {self.op}"

    def at(self) -> str:
        if self.where is None:
            return "-"
        return f"token {self.where[0]}, {self.column}"

    def to_json(self) -> dict:
        d = asdict(self)
        d["where"] = list(self.where) if self.where is not None else None
        for k in ("err", "max_abs_err"):  # JSON has no inf
            if not np.isfinite(d[k]):
                d[k] = None
        d["passed"] = self.passed
        return d


@dataclass
class TraceReport:
    model: str
    kernels: str
    kv_dtype: str
    n_tokens: int
    block_size: int
    records: list[OpRecord] = field(default_factory=list)

    @property
    def first_divergence(self) -> OpRecord | None:
        """The first op (in step order) out of its bound or with a non-finite output."""
        return next((r for r in self.records if not r.passed), None)

    @property
    def first_nonfinite(self) -> OpRecord | None:
        """The first op whose output holds a non-finite value: where it appeared."""
        return next((r for r in self.records if not r.finite), None)

    @property
    def passed(self) -> bool:
        return self.first_divergence is None

    def by_op(self) -> list[OpRecord]:
        """One record per op name (step order): its first layer out of bound, else the layer where
        its error sits closest to its bound."""
        pick: dict[str, OpRecord] = {}
        for r in self.records:
            cur = pick.get(r.op)
            if cur is None or (cur.passed and (not r.passed or _ratio(r) > _ratio(cur))):
                pick[r.op] = r
        return list(pick.values())

    def describe(self) -> str:
        """The one-paragraph answer: where the kernel path first leaves the reference."""
        intro = (f"Traced one {self.n_tokens}-token prefill step of {self.model} ({self.kernels} kernels, "
                 f"KV {self.kv_dtype}) op by op, each op fed the kernel path's own input: ")
        fd, fn = self.first_divergence, self.first_nonfinite
        if fd is None:
            worst = max(self.records, key=_ratio)
            return (intro + f"all {len(self.records)} ops within their bounds; the closest is {worst.name} "
                    f"({_kernels(worst)}), error {_num(worst.err)} {worst.metric} against a bound of "
                    f"{_num(worst.bound)}.")
        parts = []
        if fd.finite:
            parts.append(f"the first op out of its bound is {fd.name} ({_kernels(fd)}): error {_num(fd.err)} "
                         f"{fd.metric} against a bound of {_num(fd.bound)}, worst at {fd.at()} (kernel "
                         f"{_num(fd.got)}, reference {_num(fd.want)})" + (f"; {fd.detail}" if fd.detail else ""))
        if fn is not None:
            origin = ("from a finite input: this op made it" if fn.inputs_finite
                      else "but its input was already non-finite (a weight?)")
            parts.append(f"the first non-finite value appears in {fn.name} ({_kernels(fn)}) at {fn.at()}, {origin}")
        text = intro + "; ".join(parts) + "."
        later = [r for r in self.records if not r.passed and r is not fd and r is not fn]
        own = [r for r in later if r.inputs_finite]
        if own:
            ops = list(dict.fromkeys(r.op for r in own))
            layers = sorted({r.layer for r in own if r.layer is not None})
            kernels = list(dict.fromkeys(k for r in own for k in r.kernels))
            where = (f" in layers {layers[0]}-{layers[-1]}" if len(layers) > 1
                     else f" in layer {layers[0]}" if layers else "")
            text += (f" Also out of bound on their own input: {len(own)} later op(s), {_first(ops, 6)}{where} "
                     f"({_first(kernels, 3)}).")
        carried = len(later) - len(own)
        if carried:
            text += f" {carried} later op(s) were fed non-finite values."
        return text

    def to_json(self) -> dict:
        fd, fn = self.first_divergence, self.first_nonfinite
        return {"model": self.model, "kernels": self.kernels, "kv_dtype": self.kv_dtype, "n_tokens": self.n_tokens,
                "block_size": self.block_size, "passed": self.passed,
                "first_divergence": None if fd is None else fd.to_json(),
                "first_nonfinite": None if fn is None else fn.to_json(),
                "description": self.describe(), "records": [r.to_json() for r in self.records]}


def _first(names: list[str], n: int) -> str:
    return ", ".join(names[:n]) + (", ..." if len(names) > n else "")


def _kernels(r: OpRecord) -> str:
    return ", ".join(r.kernels) or "no launch"


def _ratio(r: OpRecord) -> float:
    if not r.finite or not np.isfinite(r.err):
        return np.inf
    return r.err / r.bound if r.bound > 0 else (np.inf if r.err > 0 else 0.0)


def _num(v: float | None) -> str:
    if v is None:
        return "-"
    if not np.isfinite(v) or v == 0:
        return str(v) if v else "0"
    return f"{v:.3g}" if 1e-3 <= abs(v) < 1e4 else f"{v:.2e}"


# -- float64 products and attention (rmsnorm, RoPE, the activations: the ops' twins fed float64) --
def _linear64(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x [T, in] @ w[out, in]^T in float64, a chunk of weight rows at a time."""
    x = x.astype(F64)
    return np.concatenate([x @ w[i : i + _CHUNK].astype(F64).T for i in range(0, w.shape[0], _CHUNK)], axis=1)


def _abs_dot(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """sum_i |x_i w_ji| per output: the size float rounding in a dot product is proportional to."""
    return _linear64(np.abs(x.astype(F64)), np.abs(w))


def _attention64(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: float) -> np.ndarray:
    """q [N, H, d], k and v [S, H_kv, d], mask [N, S] (0 or -inf) -> [N, H * d] (query head h reads
    KV head h // group)."""
    group = q.shape[1] // k.shape[1]
    kh, vh = np.repeat(k.astype(F64), group, axis=1), np.repeat(v.astype(F64), group, axis=1)
    s = np.einsum("nhd,shd->hns", q.astype(F64), kh) * scale + mask.astype(F64)[None]
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("hns,shd->nhd", p, vh).reshape(q.shape[0], -1)


def _q8_values(be, q8, n: int) -> tuple[np.ndarray, str]:
    """(values, a note on inconsistent block sums) of a Q8Act's first n rows."""
    q, d, s = be.download(q8.q[:n]), be.download(q8.d[:n]), be.download(q8.s[:n])
    sums = q.astype(np.int64).reshape(n, -1, QBLOCK).sum(axis=-1)
    bad = np.argwhere(sums != s)
    note = ""
    if len(bad):  # the dp4a matmuls read s for the weights' mins: a wrong one is a wrong input
        t, b = (int(i) for i in bad[0])
        note = f"its block sums s disagree with its q in {len(bad)} block(s), first token {t}, block {b}"
    return dequantize_q8_1(q, d), note


def _q8_steps(x: np.ndarray) -> np.ndarray:
    """The q8_1 step (amax/127) of each 32-value block of float rows [T, n], per column."""
    d = np.abs(x.astype(F64)).reshape(x.shape[0], -1, QBLOCK).max(axis=-1) / 127.0
    return np.maximum(np.repeat(d, QBLOCK, axis=-1), _TINY)


# -- the tracer ----------------------------------------------------------------------------------------
class _Tracer:
    def __init__(self, fp: ForwardPass, ref: Reference, pool: KVPool, batch: Batch):
        self.fp, self.ref, self.pool, self.batch = fp, ref, pool, batch
        self.be, self.cfg, self.N = fp.backend, fp.cfg, batch.n_tokens
        self.records: list[OpRecord] = []
        self._finite_weights: dict[int, bool] = {}

    def dl(self, a, rows: int | None = None) -> np.ndarray:
        return self.be.download(a[: self.N if rows is None else rows])

    def call(self, fn: Callable[[], Any]) -> tuple[Any, list[str]]:
        """Run one StepKernels unit eagerly; returns its result and the (file:entry) it launched."""
        with self.be.collecting() as names:  # the launchers name their kernels, nothing runs
            fn()
        return fn(), [f"{f}:{e}" for f, e in names]

    def finite(self, *arrays) -> bool:
        ok = True
        for a in arrays:
            if a is None:
                continue
            if a.size > 1 << 16:  # a weight matrix: checked once
                key = id(a)
                if key not in self._finite_weights:
                    self._finite_weights[key] = bool(np.isfinite(a).all())
                ok &= self._finite_weights[key]
            else:
                ok &= bool(np.isfinite(a).all())
        return ok

    def check(self, layer, op: str, kernels: list[str], bound_key: str, got: np.ndarray, want: np.ndarray,
              unit, inputs: tuple, slack=0.0, columns: Callable[[int], str] | None = None, detail: str = "",
              tokens: np.ndarray | None = None, row_columns: Callable[[int, int], str] | None = None) -> None:
        """Record |got - want| per element, less `slack`, in units of `unit` (broadcast); got's rows are
        the step's tokens, or the tokens `tokens` names (the head's logits rows). columns(j) names a
        column; row_columns(row, j) instead where the name depends on the row (an MoE pair's expert)."""
        tb: TraceBound = trace_bound(bound_key)
        rows = np.asarray(got).shape[0]
        got64 = np.asarray(got, F64).reshape(rows, -1)
        want64 = np.asarray(want, F64).reshape(rows, -1)
        diff = np.abs(got64 - want64)
        with np.errstate(invalid="ignore", divide="ignore"):
            e = np.maximum(diff - slack, 0.0) / np.broadcast_to(unit, diff.shape)
        e[~np.isfinite(e)] = np.inf  # a non-finite kernel value (or reference from a non-finite input) never passes
        finite_out = bool(np.isfinite(got64).all())
        flat = int(np.argmax(e))  # the first of equal worst: the first non-finite element
        t, c = divmod(flat, e.shape[1])
        fin = np.isfinite(diff)
        err = float(e.reshape(-1)[flat])
        at = err > 0  # an error of 0 (everything within the slack) has no place to point at
        self.records.append(OpRecord(
            layer=layer, op=op, kernels=list(dict.fromkeys(kernels)), err=err, bound=tb.bound, metric=tb.metric,
            max_abs_err=float(diff[fin].max()) if fin.any() else float("inf"),
            where=(int(tokens[t]) if tokens is not None else t, c) if at else None,
            column=(row_columns(t, c) if row_columns else (columns or (lambda j: f"column {j}"))(c)) if at else "",
            got=float(got64[t, c]) if at else None, want=float(want64[t, c]) if at else None,
            finite=finite_out, inputs_finite=self.finite(*inputs), detail=detail))

    # -- column names ---------------------------------------------------------------------------------
    def qkv_column(self, j: int) -> str:
        cfg, hd = self.cfg, self.cfg.head_dim
        if j < cfg.q_dim:
            return f"column {j} (Q head {j // hd}, dim {j % hd})"
        j2 = j - cfg.q_dim
        part = "K" if j2 < cfg.kv_dim else "V"
        j2 %= cfg.kv_dim
        return f"column {j} ({part} head {j2 // hd}, dim {j2 % hd})"

    def kv_column(self, j: int) -> str:
        hd, kv = self.cfg.head_dim, self.cfg.kv_dim
        part, j2 = ("K", j) if j < kv else ("V", j - kv)
        return f"{part} head {j2 // hd}, dim {j2 % hd}"

    def head_column(self, j: int) -> str:
        return f"column {j} (head {j // self.cfg.head_dim}, dim {j % self.cfg.head_dim})"

    # -- checks shared by several ops -----------------------------------------------------------------
    def check_norm(self, layer, op: str, kernels, x_in: np.ndarray, w: np.ndarray, act) -> np.ndarray:
        """The norm of x_in as the next matmul reads it; returns what it reads (float or dequantized q8_1)."""
        want = rmsnorm_reference(x_in.astype(F64), w, self.cfg.rms_eps)
        if act.q is not None:
            got, note = _q8_values(self.be, act.q, self.N)
            step = _q8_steps(want)
            self.check(layer, op, kernels, "norm_q8", got, want, step, (x_in, w), slack=0.5 * step, detail=note)
            if note:
                self.records[-1].err = np.inf
            return got
        got = self.dl(act.f)
        self.check(layer, op, kernels, "norm", got, want, _row_unit(want), (x_in, w))
        return got

    def check_linear(self, layer, op: str, kernels, x: np.ndarray, w: np.ndarray, bias, got: np.ndarray,
                     base: np.ndarray | None = None, columns=None) -> None:
        """got = x w^T (+ bias), or with `base` (the residual fused into the matmul) got = base + x w^T."""
        want = _linear64(x, w)
        unit = _abs_dot(x, w)
        if bias is not None:
            want = want + bias.astype(F64)
            unit = unit + np.abs(bias.astype(F64))
        slack = 0.0
        if base is not None:  # the add rounds once more: one float32 ulp of the sum is allowed beside the bound
            want = want + base.astype(F64)
            slack = np.spacing(np.abs(got).astype(np.float32)).astype(F64)
        self.check(layer, op, kernels, "matmul", got, want, np.maximum(unit, _TINY), (x, w, bias, base), slack,
                   columns)

    def check_q8_copy(self, layer, op: str, kernels, f: np.ndarray, q8) -> np.ndarray:
        """A q8_1 copy of float rows the kernel path itself wrote: within half a step of them. f may hold
        several rows a token (an MoE layer's k pairs): they are checked side by side, by token."""
        got, note = _q8_values(self.be, q8, f.shape[0])
        step = _q8_steps(f)
        by_token = (self.N, -1)
        self.check(layer, op, kernels, "q8_copy", got.reshape(by_token), f.reshape(by_token), step.reshape(by_token),
                   (f,), slack=0.5 * step.reshape(by_token), detail=note)
        if note:
            self.records[-1].err = np.inf
        return got

    def check_residual(self, layer, op: str, kernels, x0: np.ndarray, y: np.ndarray, post_norm, x1: np.ndarray) -> None:
        """x1 = x0 + y, or with a post-norm (gemma3) x0 + rmsnorm(y) * post_norm."""
        add = y.astype(F64) if post_norm is None else rmsnorm_reference(y.astype(F64), post_norm, self.cfg.rms_eps)
        want = x0.astype(F64) + add
        unit = np.maximum(np.abs(x0.astype(F64)) + np.abs(add), _TINY).max(axis=-1, keepdims=True)
        self.check(layer, op, kernels, "residual", x1, want, unit, (x0, y, post_norm))

    def sublayer_out(self, layer, prefix: str, names, W, a_read, post_norm, x0, proj_dev) -> np.ndarray:
        """The o-projection or the FFN's down projection and its residual add; returns x after."""
        be = self.be
        adds = [n for n in names if _entry(n) in ("add_f32", "rmsnorm_add_f32")]
        mm = [n for n in names if n not in adds]
        x1 = self.dl(self.fp.ws.x)
        proj_op, res_op = ("o_proj", "attn_residual") if prefix == "attn" else ("down", "ffn_residual")
        if post_norm is not None or not self.fp.choice.q8_activations:  # into ws.proj, then its own add
            proj = be.download(proj_dev[: self.N])
            self.check_linear(layer, proj_op, mm, a_read, W, None, proj)
            self.check_residual(layer, res_op, adds, x0, proj, post_norm, x1)
        else:  # a q8_1 matmul adds into x itself: x1 = x0 + a W^T
            self.check_linear(layer, proj_op, mm, a_read, W, None, x1, base=x0)
        return x1

    # -- the step -----------------------------------------------------------------------------------
    def run(self, d) -> None:
        fp, be, cfg, ref, N = self.fp, self.be, self.cfg, self.ref, self.N
        ws, k, dv = fp.ws, fp.kernels, d.d
        ids = np.asarray(self.batch.token_ids, np.int64)
        positions = np.asarray(self.batch.positions, np.int64)
        slots = np.asarray(self.batch.slot_mapping, np.int64)

        k.shapes = fp.step_shapes(self.batch, N, self.pool.kv_dtype, d)  # as submit() keys the step
        _, names = self.call(lambda: fp._emit_embed(N, d))
        x = self.dl(ws.x)
        want = ref.token_embd[ids].astype(F64) * float(np.float32(cfg.embd_scale))
        self.check(None, "embedding", names, "embedding", x, want, _row_unit(want), (ref.token_embd[ids],))

        for li, (L, R) in enumerate(zip(fp.layers, ref.layers)):
            x0 = x
            a, names = self.call(lambda: k.norm(ws.x, L.attn_norm, N, getattr(ws, "h", None), getattr(ws, "xq", None)))
            h = self.check_norm(li, "attn_norm", names, x0, R.attn_norm, a)

            _, names = self.call(lambda: k.qkv(L, a, N))
            qkv0 = self.dl(ws.qkv)
            self.check_linear(li, "qkv", names, h, R.wqkv, R.bqkv, qkv0, columns=self.qkv_column)

            _, names = self.call(lambda: k.rope_kv(L, self.pool, li, dv["positions"], dv["slot_mapping"], N))
            qkv1 = self.dl(ws.qkv)
            self.check_rope(li, [n for n in names if _file(n) in ("qk_norm.cu", "rope.cu", "rope_kv.cu")], qkv0,
                            qkv1, R, positions)
            kst = be.download(self.pool.k[li])[slots]
            vst = be.download(self.pool.v[li])[slots]
            keys, vals = self.check_kv(li, [n for n in names if _file(n) in ("kv_cache.cu", "rope_kv.cu")], qkv1,
                                       kst, vst)

            o, names = self.call(lambda: k.attention(self.pool, li, d, N))
            att = self.dl(ws.att)
            q8_names = [n for n in names if _entry(n) == "quantize_q8_1"]
            att_names = [n for n in names if _file(n).startswith("attention")]
            self.check_attention(li, att_names, qkv1, keys, vals, positions, att)
            o_read = att
            if o.q is not None:  # the o-projection reads the q8_1 copy (the split merge writes it itself)
                o_read = self.check_q8_copy(li, "attn_q8", q8_names or att_names, att, o.q)

            _, names = self.call(lambda: k.residual(L.wo, o, L.post_attn_norm, ws.x, N))
            x1 = self.sublayer_out(li, "attn", names, R.wo, o_read, R.post_attn_norm, x0, getattr(ws, "proj", None))
            if L.moe is not None:
                x = self.trace_moe(li, L, R, x1)
                continue

            a, names = self.call(lambda: k.norm(ws.x, L.ffn_norm, N, getattr(ws, "h", None), getattr(ws, "xq", None)))
            h = self.check_norm(li, "ffn_norm", names, x1, R.ffn_norm, a)

            _, names = self.call(lambda: k.ffn(L, a, ws.x, N))
            # the launches up to the gated activation (or the fused gate+up kernel) make ws.gate
            cut = 1 + max((i for i, n in enumerate(names)
                           if _entry(n).endswith("_gate_f32") or _file(n).startswith("gate_up")), default=-1)
            gate = self.dl(ws.gate)
            self.check_gate_up(li, names[:cut], h, R, gate)
            rest = names[cut:]
            f_read = gate
            ffq = getattr(ws, "ffq", None)
            if fp.choice.q8_activations and ffq is not None:
                f_read = self.check_q8_copy(li, "ffn_q8", [n for n in rest if _entry(n) == "quantize_q8_1"], gate, ffq)
            x = self.sublayer_out(li, "ffn", [n for n in rest if _entry(n) != "quantize_q8_1"], R.w_down, f_read,
                                  R.post_ffn_norm, x1, getattr(ws, "proj", None))

        self.trace_head(d, x)

    def trace_moe(self, li: int, L, R, x1: np.ndarray) -> np.ndarray:
        """An MoE layer's FFN (StepKernels.moe_ffn's two units: the moe variant's norm, then its
        launcher), each part checked on the kernel path's own input; returns x after."""
        fp, be, cfg, N = self.fp, self.be, self.cfg, self.N
        ws, mv, kx = fp.ws, fp.kernels.moe, cfg.n_expert_used
        q8 = mv.activations == "q8_1"
        out = ws.xq if q8 else ws.h
        _, names = self.call(lambda: mv.norm(be, ws.x, L.ffn_norm, out, N, cfg.n_embd, cfg.rms_eps))
        h = self.check_norm(li, "ffn_norm", names, x1, R.ffn_norm, Act(q=out) if q8 else Act(f=out))
        _, names = self.call(lambda: mv.launch(be, L.moe, ws.x, ws.moe, N, x_f=None if q8 else out,
                                               x_q=out if q8 else None, act=cfg.ffn_act, layer=li))
        P, s = N * kx, ws.moe
        ids = be.download(s.ids[li])[:P].reshape(N, kx).astype(np.int64)
        wts = be.download(s.wts[li])[:P].reshape(N, kx)
        g, y, x2 = be.download(s.g[:P]), be.download(s.y[:P]), self.dl(ws.x)
        route = [n for n in names if _file(n) in ("moe_route.cu", "moe_route_split.cu")]
        combine = [n for n in names if _entry(n) == "moe_combine"]
        q8_names = [n for n in names if _entry(n) == "quantize_q8_1"]
        downs = [n for n in names if "down" in _entry(n)]
        gate_ups = [n for n in names if n not in route + combine + q8_names + downs]  # the sort goes with them

        valid = ((ids >= 0) & (ids < cfg.n_expert)).all(axis=1)  # a wrong id never indexes the weights
        e = np.where(valid[:, None], ids, 0)

        def pair(t: int, j: int, width: int = 1) -> str:  # column j of token t's k pairs, `width` values each
            r = j // width
            return f"rank {r}, expert {int(ids[t, r])}" + (f", column {j % width}" if width > 1 else "")

        # the route: the reference's probabilities from the router's own input (float64)
        logits = _linear64(h, R.router)
        prob = np.exp(logits - logits.max(axis=-1, keepdims=True))
        prob /= prob.sum(axis=-1, keepdims=True)
        # an id out of range reads as probability -1: a divergence of at least 1, never an index
        at_ids = np.where(valid[:, None], np.take_along_axis(prob, e, axis=-1), -1.0)
        ref_ids = np.argsort(-prob, axis=-1, kind="stable")[:, :kx]  # equal probabilities: the lower id first
        top = np.take_along_axis(prob, ref_ids, axis=-1)
        # equal router rows give bit-equal logits in both paths, so an exact tie settled against the
        # lower-id rule is a rule broken, not rounding: the probabilities alone would hide it
        tie_broken = (ids != ref_ids) & (at_ids == top)
        notes = [] if valid.all() else [f"{np.count_nonzero(~valid)} token(s) with an expert id outside "
                                        f"0..{cfg.n_expert - 1}"]
        if tie_broken.any():
            t, r = (int(i) for i in np.argwhere(tie_broken)[0])
            notes.append(f"{np.count_nonzero(tie_broken)} exact tie(s) settled against the lower-id rule, first token "
                         f"{t} rank {r}: expert {int(ids[t, r])} where the reference takes {int(ref_ids[t, r])}")
        # a logit errs by up to the matmul bound of sum|h w_e|; a probability or weight moves by at most
        # 2 w times that (softmax and renormalisation): the unit, so real models' wide logits fit too
        lunit = 2.0 * _abs_dot(h, R.router).max(axis=-1, keepdims=True)
        self.check(li, "moe_route", route, "moe_route", at_ids, top, np.maximum(top * lunit, _TINY), (h, R.router),
                   row_columns=pair,
                   detail="; ".join(notes) or "the reference's probability at the kernel's expert of each rank "
                                              "vs its own top k")
        if notes:
            self.records[-1].err = np.inf
        w_ref = at_ids / np.maximum(at_ids.sum(axis=-1, keepdims=True), float(WEIGHT_SUM_FLOOR))
        self.check(li, "moe_weights", route, "moe_route", wts, w_ref, np.maximum(np.abs(w_ref) * lunit, _TINY),
                   (h, R.router), row_columns=pair)

        # each pair's expert, for the kernel's own choice of expert
        tok = np.repeat(np.arange(N), kx)
        ep = e.reshape(-1)
        n_ff = cfg.n_ff_exp
        gu = np.empty((P, n_ff), F64)
        for ex in np.unique(ep):
            rows = np.flatnonzero(ep == ex)
            hx = h[tok[rows]]
            gu[rows] = act_reference(cfg.ffn_act, _linear64(hx, R.exps_gate_up[ex][:n_ff])) * _linear64(
                hx, R.exps_gate_up[ex][n_ff:])
        self.check(li, "moe_gate_up", gate_ups, "gate_up", g.reshape(N, -1), gu.reshape(N, -1),
                   np.repeat(_row_unit(gu).reshape(N, kx), n_ff, axis=1), (h, R.exps_gate_up),
                   row_columns=lambda t, j: pair(t, j, n_ff))
        g_read = self.check_q8_copy(li, "moe_q8", q8_names, g, s.gq) if s.gq is not None and q8_names else g
        yd = np.empty((P, cfg.n_embd), F64)
        unit = np.empty((P, cfg.n_embd), F64)
        for ex in np.unique(ep):
            rows = np.flatnonzero(ep == ex)
            yd[rows] = _linear64(g_read[rows], R.exps_down[ex])
            unit[rows] = _abs_dot(g_read[rows], R.exps_down[ex])
        self.check(li, "moe_down", downs, "matmul", y.reshape(N, -1), yd.reshape(N, -1),
                   np.maximum(unit, _TINY).reshape(N, -1), (g_read, R.exps_down),
                   row_columns=lambda t, j: pair(t, j, cfg.n_embd))

        # the combine: x + the pair outputs weighted by the kernel's own weights, in rank order
        terms = wts.astype(F64)[..., None] * y.reshape(N, kx, -1).astype(F64)
        want = x1.astype(F64) + terms.sum(axis=1)
        unit = np.maximum(np.abs(x1.astype(F64)) + np.abs(terms).sum(axis=1), _TINY).max(axis=-1, keepdims=True)
        self.check(li, "moe_combine", combine, "moe_combine", x2, want, unit, (x1, y, wts))
        return x2

    def check_rope(self, li: int, names, qkv0: np.ndarray, qkv1: np.ndarray, R, positions) -> None:
        cfg, N = self.cfg, self.N
        hd, qd, kd = cfg.head_dim, cfg.q_dim, cfg.kv_dim
        q = qkv0[:, :qd].reshape(N, cfg.n_head, hd).astype(F64)
        kk = qkv0[:, qd : qd + kd].reshape(N, cfg.n_head_kv, hd).astype(F64)
        if R.q_norm is not None:
            q, kk = rmsnorm_reference(q, R.q_norm, cfg.rms_eps), rmsnorm_reference(kk, R.k_norm, cfg.rms_eps)
        theta, scale = cfg.rope_for(li)
        want = np.concatenate([rope_reference(q, positions, theta, cfg.rope_style, scale).reshape(N, qd),
                               rope_reference(kk, positions, theta, cfg.rope_style, scale).reshape(N, kd),
                               qkv0[:, qd + kd :].astype(F64)], axis=1)  # V untouched
        self.check(li, "rope", names, "rope", qkv1, want, _row_unit(want), (qkv0, R.q_norm, R.k_norm),
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
        self.check(li, "kv_append", names, "kv_append", got, want, _row_unit(want), (qkv1,), columns=self.kv_column)
        return keys, vals

    def check_attention(self, li: int, names, qkv1, keys, vals, positions, att) -> None:
        cfg, N = self.cfg, self.N
        q = qkv1[:, : cfg.q_dim].reshape(N, cfg.n_head, cfg.head_dim)
        mask = attention_mask(positions, N, cfg.window(li))
        flash = self.fp.choice.of("attention").rounding == "f16_operands"  # its declared rounding
        # flash multiplies f16 operands: Q, K and V rounded as the kernel rounds them (P's rounding is
        # what its bound allows for); without this the error would grow with the scores' size
        q_, k_, v_ = (a.astype(np.float16) for a in (q, keys, vals)) if flash else (q, keys, vals)
        want = _attention64(q_, k_, v_, mask, float(np.float32(cfg.kq_scale)))
        vmax = float(np.abs(vals).max()) if np.isfinite(vals).all() else np.inf
        self.check(li, "attention", names, "attention_f16_operands" if flash else "attention", att, want, max(vmax, _TINY),
                   (q, keys, vals), columns=self.head_column)

    def check_gate_up(self, li: int, names, h, R, gate) -> None:
        cfg = self.cfg
        g = _linear64(h, R.w_gate_up[: cfg.n_ff])
        u = _linear64(h, R.w_gate_up[cfg.n_ff :])
        want = act_reference(cfg.ffn_act, g) * u
        self.check(li, "gate_up", names, "gate_up", gate, want, _row_unit(want), (h, R.w_gate_up))

    def trace_head(self, d, x: np.ndarray) -> None:
        fp, ref, cfg, ws = self.fp, self.ref, self.cfg, self.fp.ws
        tokens = np.asarray(self.batch.logits_rows, np.int64)
        R = len(tokens)
        _, names = self.call(lambda: fp._emit_head(R, False, d))
        norm_names = [n for n in names if _file(n) in ("gather.cu", "rmsnorm.cu", "rmsnorm_q8_1.cu")]
        rows = x[tokens]
        want = rmsnorm_reference(rows.astype(F64), ref.output_norm, cfg.rms_eps)
        selq = getattr(ws, "selq", None)
        if fp.choice.q8_activations and selq is not None:
            got, note = _q8_values(self.be, selq, R)
            step = _q8_steps(want)
            self.check(None, "output_norm", norm_names, "norm_q8", got, want, step, (rows, ref.output_norm),
                       slack=0.5 * step, detail=note, tokens=tokens)
            if note:
                self.records[-1].err = np.inf
        else:
            got = self.dl(ws.sel, R)
            self.check(None, "output_norm", norm_names, "norm", got, want, _row_unit(want), (rows, ref.output_norm),
                       tokens=tokens)
        logits = self.dl(ws.logits, R)
        lm = _linear64(got, ref.output)
        unit = _abs_dot(got, ref.output)
        if cfg.final_softcap:  # cap * tanh(y / cap): its slope is at most 1, so the matmul's unit still holds
            lm = cfg.final_softcap * np.tanh(lm / cfg.final_softcap)
        self.check(None, "lm_head", [n for n in names if n not in norm_names], "matmul", logits, lm,
                   np.maximum(unit, _TINY), (got, ref.output), tokens=tokens)


def _row_unit(want: np.ndarray) -> np.ndarray:
    """Each row's largest |reference value|: errors relative to the row's scale."""
    w = np.abs(np.asarray(want, F64))
    w = w.reshape(w.shape[0], -1)
    with np.errstate(invalid="ignore"):
        m = np.where(np.isfinite(w), w, 0.0).max(axis=-1, keepdims=True)
    return np.maximum(m, _TINY)


def _file(name: str) -> str:
    return name.partition(":")[0]


def _entry(name: str) -> str:
    return name.partition(":")[2]


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
    if reference is None:
        from oracles.paths import reference_for  # the reference of verify's oracles: weights dequantized once

        reference = reference_for(fp.model, kv_dtype)
    tracer = _Tracer(tfp, reference, pool, batch)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):  # non-finite values are findings here
        tracer.run(d)
    tfp.release_plans()
    return TraceReport(model=fp.model.path.name, kernels=fp.choice.name, kv_dtype=kv_dtype, n_tokens=N,
                       block_size=block_size, records=tracer.records)


__all__ = ["OpRecord", "TraceReport", "trace_step"]
