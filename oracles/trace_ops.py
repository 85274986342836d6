"""The op-by-op trace's measuring tools (oracles/trace.py): the reference's products in float64, the
q8_1 views, and OpChecks -- the records of a traced step and the checks several ops share.

Each check compares the kernel's output with the reference fed the kernel path's own input, in the
unit its bound is stated in (oracles/tolerances.py, TRACE_BOUNDS), and records an OpRecord."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from oracles.reference import Reference
from oracles.tolerances import TraceBound, trace_bound
from oracles.trace_report import OpRecord
from sharpinf.ops.basic import rmsnorm_reference
from sharpinf.ops.quant_act import QBLOCK, dequantize_q8_1
from sharpinf.step.batch import Batch
from sharpinf.step.forward import ForwardPass
from sharpinf.step.kv_pool import KVPool

F64 = np.float64
TINY = 1e-30  # a unit of zero (an all-zero row or block) must not divide by zero
_CHUNK = 4096  # weight rows per float64 product: an LM head of 262k rows stays a few MB at a time


# -- float64 products and attention (rmsnorm, RoPE, the activations: the ops' twins fed float64) --
def linear64(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x [T, in] @ w[out, in]^T in float64, a chunk of weight rows at a time."""
    x = x.astype(F64)
    return np.concatenate([x @ w[i : i + _CHUNK].astype(F64).T for i in range(0, w.shape[0], _CHUNK)], axis=1)


def abs_dot(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """sum_i |x_i w_ji| per output: the size float rounding in a dot product is proportional to."""
    return linear64(np.abs(x.astype(F64)), np.abs(w))


def attention64(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: float,
                sinks: np.ndarray | None = None) -> np.ndarray:
    """q [N, H, d], k and v [S, H_kv, d], mask [N, S] (0 or -inf) -> [N, H * d] (query head h reads
    KV head h // group); sinks [H] (gpt-oss): head h's logit in its max and sum, no value."""
    group = q.shape[1] // k.shape[1]
    kh, vh = np.repeat(k.astype(F64), group, axis=1), np.repeat(v.astype(F64), group, axis=1)
    s = np.einsum("nhd,shd->hns", q.astype(F64), kh) * scale + mask.astype(F64)[None]
    z = np.full((q.shape[1], 1, 1), -np.inf) if sinks is None else sinks.astype(F64).reshape(-1, 1, 1)
    m = np.maximum(s.max(axis=-1, keepdims=True), z)
    p = np.exp(s - m)
    p /= p.sum(axis=-1, keepdims=True) + np.exp(z - m)
    return np.einsum("hns,shd->nhd", p, vh).reshape(q.shape[0], -1)


def q8_values(be, q8, n: int) -> tuple[np.ndarray, str]:
    """(values, a note on inconsistent block sums) of a Q8Act's first n rows."""
    q, d, s = be.download(q8.q[:n]), be.download(q8.d[:n]), be.download(q8.s[:n])
    sums = q.astype(np.int64).reshape(n, -1, QBLOCK).sum(axis=-1)
    bad = np.argwhere(sums != s)
    note = ""
    if len(bad):  # the dp4a matmuls read s for the weights' mins: a wrong one is a wrong input
        t, b = (int(i) for i in bad[0])
        note = f"its block sums s disagree with its q in {len(bad)} block(s), first token {t}, block {b}"
    return dequantize_q8_1(q, d), note


def q8_steps(x: np.ndarray) -> np.ndarray:
    """The q8_1 step (amax/127) of each 32-value block of float rows [T, n], per column."""
    d = np.abs(x.astype(F64)).reshape(x.shape[0], -1, QBLOCK).max(axis=-1) / 127.0
    return np.maximum(np.repeat(d, QBLOCK, axis=-1), TINY)


def row_unit(want: np.ndarray) -> np.ndarray:
    """Each row's largest |reference value|: errors relative to the row's scale."""
    w = np.abs(np.asarray(want, F64))
    w = w.reshape(w.shape[0], -1)
    with np.errstate(invalid="ignore"):
        m = np.where(np.isfinite(w), w, 0.0).max(axis=-1, keepdims=True)
    return np.maximum(m, TINY)


# a launch is named "file:entry" (OpChecks.call)
def file_of(name: str) -> str:
    return name.partition(":")[0]


def entry_of(name: str) -> str:
    return name.partition(":")[2]


class OpChecks:
    """A traced step's records, and the checks that fill them."""

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
            got, note = q8_values(self.be, act.q, self.N)
            step = q8_steps(want)
            self.check(layer, op, kernels, "norm_q8", got, want, step, (x_in, w), slack=0.5 * step, detail=note)
            if note:
                self.records[-1].err = np.inf
            return got
        got = self.dl(act.f)
        self.check(layer, op, kernels, "norm", got, want, row_unit(want), (x_in, w))
        return got

    def check_linear(self, layer, op: str, kernels, x: np.ndarray, w: np.ndarray, bias, got: np.ndarray,
                     base: np.ndarray | None = None, columns=None) -> None:
        """got = x w^T (+ bias), or with `base` (the residual fused into the matmul) got = base + x w^T."""
        want = linear64(x, w)
        unit = abs_dot(x, w)
        if bias is not None:
            want = want + bias.astype(F64)
            unit = unit + np.abs(bias.astype(F64))
        slack = 0.0
        if base is not None:  # the add rounds once more: one float32 ulp of the sum is allowed beside the bound
            want = want + base.astype(F64)
            slack = np.spacing(np.abs(got).astype(np.float32)).astype(F64)
        self.check(layer, op, kernels, "matmul", got, want, np.maximum(unit, TINY), (x, w, bias, base), slack,
                   columns)

    def check_q8_copy(self, layer, op: str, kernels, f: np.ndarray, q8) -> np.ndarray:
        """A q8_1 copy of float rows the kernel path itself wrote: within half a step of them. f may hold
        several rows a token (an MoE layer's k pairs): they are checked side by side, by token."""
        got, note = q8_values(self.be, q8, f.shape[0])
        step = q8_steps(f)
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
        unit = np.maximum(np.abs(x0.astype(F64)) + np.abs(add), TINY).max(axis=-1, keepdims=True)
        self.check(layer, op, kernels, "residual", x1, want, unit, (x0, y, post_norm))

