"""The op-by-op trace of an MoE layer's FFN (qwen3moe, Mixtral-style llama, gpt-oss): part by part, each
on the kernel path's own input -- the router's choice and weights, each (token, expert) pair's gate+up,
its q8_1 copy, its down projection, and the rank-order combine into x (oracles/trace.py's table).
gpt-oss: the router's and the experts' biases in each part's reference, its top-k softmax gating (the
choice ranked by logit), its clamped SwiGLU (ops/basic.py's glu_reference)."""

from __future__ import annotations

import numpy as np

from oracles.trace_ops import F64, TINY, OpChecks, abs_dot, entry_of, file_of, linear64, row_unit
from sharpinf.ops.basic import glu_reference
from sharpinf.ops.moe import WEIGHT_SUM_FLOOR
from sharpinf.step.kernels import Act


def trace_moe(tr: OpChecks, li: int, L, R, x1: np.ndarray) -> np.ndarray:
    """An MoE layer's FFN (StepKernels.moe_ffn's two units: the moe variant's norm, then its
    launcher), each part checked on the kernel path's own input; returns x after."""
    fp, be, cfg, N = tr.fp, tr.be, tr.cfg, tr.N
    ws, mv, kx = fp.ws, fp.step_kernels.moe, cfg.n_expert_used
    q8 = mv.activations == "q8_1"
    out = ws.xq if q8 else ws.h
    _, names = tr.call(lambda: mv.norm(be, ws.x, L.ffn_norm, out, N, cfg.n_embd, cfg.rms_eps))
    h = tr.check_norm(li, "ffn_norm", names, x1, R.ffn_norm, Act(q=out) if q8 else Act(f=out))
    _, names = tr.call(lambda: mv.launch(be, L.moe, ws.x, ws.moe, N, x_f=None if q8 else out,
                                         x_q=out if q8 else None, act=cfg.ffn_act, layer=li))
    P, s = N * kx, ws.moe
    ids = be.download(s.ids[li])[:P].reshape(N, kx).astype(np.int64)
    wts = be.download(s.wts[li])[:P].reshape(N, kx)
    g, y, x2 = be.download(s.g[:P]), be.download(s.y[:P]), tr.dl(ws.x)
    route = [n for n in names if file_of(n) in ("moe_route.cu", "moe_route_split.cu")]
    combine = [n for n in names if entry_of(n) == "moe_combine"]
    q8_names = [n for n in names if entry_of(n) == "quantize_q8_1"]
    downs = [n for n in names if "down" in entry_of(n)]
    gate_ups = [n for n in names if n not in route + combine + q8_names + downs]  # the sort goes with them

    valid = ((ids >= 0) & (ids < cfg.n_expert)).all(axis=1)  # a wrong id never indexes the weights
    e = np.where(valid[:, None], ids, 0)

    def pair(t: int, j: int, width: int = 1) -> str:  # column j of token t's k pairs, `width` values each
        r = j // width
        return f"rank {r}, expert {int(ids[t, r])}" + (f", column {j % width}" if width > 1 else "")

    # the route: the reference's probabilities from the router's own input (float64); top-k softmax
    # gating (gpt-oss) ranks the logits themselves
    logits = linear64(h, R.router) + (0.0 if R.router_b is None else R.router_b.astype(F64))
    topk = cfg.moe_gating == "topk_softmax"
    if topk:
        prob = logits
    else:
        prob = np.exp(logits - logits.max(axis=-1, keepdims=True))
        prob /= prob.sum(axis=-1, keepdims=True)
    # an id out of range reads as probability -1 (a logit -inf): a divergence of at least 1, never an index
    at_ids = np.where(valid[:, None], np.take_along_axis(prob, e, axis=-1), -np.inf if topk else -1.0)
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
    # a logit errs by up to the matmul bound of sum|h w_e| (its bias one rounding more); a probability
    # or weight moves by at most 2 w times that (softmax and renormalisation): the unit, so real models'
    # wide logits fit too; ranked by logit, the logit's own bound
    size = abs_dot(h, R.router) + (0.0 if R.router_b is None else np.abs(R.router_b))
    lunit = 2.0 * size.max(axis=-1, keepdims=True)
    tr.check(li, "moe_route", route, "moe_route", at_ids, top, np.maximum(lunit if topk else top * lunit, TINY),
             (h, R.router), row_columns=pair,
             detail="; ".join(notes) or f"the reference's {'logit' if topk else 'probability'} at the kernel's "
                                        "expert of each rank vs its own top k")
    if notes:
        tr.records[-1].err = np.inf
    if topk:  # a softmax over the kernel's k
        ek = np.exp(at_ids - at_ids.max(axis=-1, keepdims=True))
        w_ref = ek / ek.sum(axis=-1, keepdims=True)
    else:
        w_ref = at_ids / np.maximum(at_ids.sum(axis=-1, keepdims=True), float(WEIGHT_SUM_FLOOR))
    tr.check(li, "moe_weights", route, "moe_route", wts, w_ref, np.maximum(np.abs(w_ref) * lunit, TINY),
             (h, R.router), row_columns=pair)

    # each pair's expert, for the kernel's own choice of expert (with its biases: gpt-oss)
    tok = np.repeat(np.arange(N), kx)
    ep = e.reshape(-1)
    n_ff = cfg.n_ff_exp
    gu = np.empty((P, n_ff), F64)
    for ex in np.unique(ep):
        rows = np.flatnonzero(ep == ex)
        pre = linear64(h[tok[rows]], R.exps_gate_up[ex])  # [pairs, 2 n_ff]: gate, then up
        if R.exps_gate_up_b is not None:
            pre += R.exps_gate_up_b[ex]
        gu[rows] = glu_reference(cfg.ffn_act, pre[:, :n_ff], pre[:, n_ff:])
    tr.check(li, "moe_gate_up", gate_ups, "gate_up", g.reshape(N, -1), gu.reshape(N, -1),
             np.repeat(row_unit(gu).reshape(N, kx), n_ff, axis=1), (h, R.exps_gate_up),
             row_columns=lambda t, j: pair(t, j, n_ff))
    g_read = tr.check_q8_copy(li, "moe_q8", q8_names, g, s.gq) if s.gq is not None and q8_names else g
    yd = np.empty((P, cfg.n_embd), F64)
    unit = np.empty((P, cfg.n_embd), F64)
    for ex in np.unique(ep):
        rows = np.flatnonzero(ep == ex)
        yd[rows] = linear64(g_read[rows], R.exps_down[ex])
        unit[rows] = abs_dot(g_read[rows], R.exps_down[ex])
    tr.check(li, "moe_down", downs, "matmul", y.reshape(N, -1), yd.reshape(N, -1),
             np.maximum(unit, TINY).reshape(N, -1), (g_read, R.exps_down),
             row_columns=lambda t, j: pair(t, j, cfg.n_embd))

    # the combine: x + the pair outputs (+ their down biases: gpt-oss's join here) weighted by the kernel's
    # own weights, in rank order
    yb = y.reshape(N, kx, -1).astype(F64)
    if R.exps_down_b is not None:
        yb = yb + R.exps_down_b[e]
    terms = wts.astype(F64)[..., None] * yb
    want = x1.astype(F64) + terms.sum(axis=1)
    unit = np.maximum(np.abs(x1.astype(F64)) + np.abs(terms).sum(axis=1), TINY).max(axis=-1, keepdims=True)
    tr.check(li, "moe_combine", combine, "moe_combine", x2, want, unit, (x1, y, wts))
    return x2
