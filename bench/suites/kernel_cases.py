"""The cases of the kernels bench (bench/suites/kernel_variants.py): each selected variant of an op on
layer 0's shapes, over fresh buffers of random data of the right form -- what each case launches and
the compulsory bytes it moves. Which variants there are, what each reads and what it requires come
from the registry (sharpinf/ops/variants.toml), never from a name here."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from bench.suites.common import BenchContext
from sharpinf.errors import SharpinfError
from sharpinf.model import quants
from sharpinf.ops import basic
from sharpinf.ops.moe import MoeScratch
from sharpinf.ops.quant_act import Q8Act, quantize_q8_1
from sharpinf.ops.variants import OP_NAMES, REGISTRY, KernelChoice, Variant, baseline, with_requirements

# the bench ops: every registry op, and the matmul variants' norm and gate + up + activation (what each
# matmul variant declares it brings) as cases of their own
SUB_CASES = {"matmul": ("norm", "matmul", "ffn_in")}
BENCH_OPS = {case: op for op in OP_NAMES for case in SUB_CASES.get(op, (op,))}
DENSE_FFN_OPS = {"ffn_in", "ffn", "link"}  # what only a dense FFN has (an MoE layer's FFN is the moe op)


@dataclass(frozen=True)
class Selection:
    """Which cases to time: bench ops (BENCH_OPS: norm, matmul, ffn_in, ffn, link, attention, rope_kv, moe, sample;
    a registry op stands for its bench ops) and variant names (each op's baseline is always timed: the
    speedups are over it)."""

    ops: frozenset[str] = frozenset(BENCH_OPS)
    variants: frozenset[str] | None = None  # None: every registered variant

    @classmethod
    def parse(cls, ops: str | None, variants: str | None) -> "Selection":
        chosen = set(BENCH_OPS)
        if ops:
            chosen = set()
            for o in (x.strip() for x in ops.split(",") if x.strip()):
                if o in BENCH_OPS:
                    chosen |= {b for b, reg in BENCH_OPS.items() if reg == o} if o in OP_NAMES else {o}
                else:
                    raise SharpinfError(f"--op {o!r}: choose from {', '.join(BENCH_OPS)}")
        names = None
        if variants:
            names = frozenset(x.strip() for x in variants.split(",") if x.strip())
            known = {n for op in {BENCH_OPS[b] for b in chosen} for n in REGISTRY[op]}
            bad = sorted(names - known)
            if bad:
                raise SharpinfError(f"--variant {', '.join(bad)}: no such variant of "
                                    f"{', '.join(sorted({BENCH_OPS[b] for b in chosen}))} (`sharpinf kernels list`)")
        return cls(frozenset(chosen), names)

    def variants_of(self, op: str) -> list[Variant]:
        """The registered variants of a registry op to time, baseline first."""
        return [v for i, v in enumerate(REGISTRY[op].values()) if i == 0 or self.variants is None or v.name in self.variants]


@dataclass
class Case:
    op: str
    shape: str
    variant: str
    tokens: int
    nbytes: int  # compulsory bytes moved by one call
    calls: list[Callable[[], None]]  # the same work over copies of its inputs (timed together, per call)
    flops: int = 0  # multiply-adds x 2 of one call (matmuls), for TFLOP/s at prefill sizes
    # moe: the routing decides which experts a call reads, so they are counted after the runs
    expert_load: Callable[[], list[int]] | None = None  # pairs each expert got in the last run
    expert_bytes: int = 0  # one expert's gate + up + down, added to nbytes once per expert used
    launch_shape: str | None = None  # attention: "split" or "walk", the shape it ran in ($SHARPINF_ATTENTION_MODE's)
    rule_shape: str | None = None  # attention: the shape the rule (auto) takes for the case
    rule: dict | None = None  # attention: what the rule read (ops/attention.py ShapeInputs)


ROTATE_BYTES = 256 << 20  # copies of a case's inputs add up to this, past any L2 cache (50-60 MB on Hopper)
MAX_COPIES = 64


def copies(be, arr, nbytes: int) -> list:
    """arr and enough device copies of it that together they exceed the L2 cache (GPU only)."""
    if not be.gpu_shapes:
        return [arr]
    k = max(1, min(MAX_COPIES, -(-ROTATE_BYTES // max(1, nbytes))))
    host = be.download(arr)
    return [arr] + [be.upload(host) for _ in range(k - 1)]


def rand(be, rng, *shape, scale=1.0):
    return be.upload((rng.standard_normal(shape) * scale).astype(np.float32))



def norm_cases(ctx: BenchContext, N: int, rng, sel: Selection, x_e) -> list[Case]:
    """The norm each matmul variant declares: float rows, or q8_1 fused into it (one case per norm,
    named by the first variant that brings it)."""
    if "norm" not in sel.ops:
        return []
    be, fp = ctx.backend, ctx.forward_pass()
    cfg, L = fp.cfg, fp.layers[0]
    h, hq = be.empty((N, cfg.n_embd), np.float32), Q8Act.empty(be, N, cfg.n_embd)
    nb_in = 4 * N * cfg.n_embd + 4 * cfg.n_embd
    kinds = {}
    for v in sel.variants_of("matmul"):
        kinds.setdefault(v.norm, v)
    cases = []
    for norm, v in kinds.items():
        out, nb_out = (hq, N * cfg.n_embd * 9 // 8) if v.activations == "q8_1" else (h, 4 * N * cfg.n_embd)
        cases.append(Case("norm", f"{N}x{cfg.n_embd}", v.name, N, nb_in + nb_out,
                          [lambda norm=norm, out=out: norm(be, x_e, L.attn_norm, out, N, cfg.n_embd, cfg.rms_eps)]))
    return cases


# the sampling bench's rows: temperature 1, top-k 50, top-p 0.9 (both cuts searched), no history
SAMPLE_PARAMS = dict(temperature=1.0, top_k=50, top_p=0.9)


def sample_cases(ctx: BenchContext, N: int, rng, sel: Selection) -> list[Case]:
    """One token for each of N logits rows over the model's vocabulary, each sample variant (its
    compulsory bytes: the logits, read once)."""
    if "sample" not in sel.ops:
        return []
    from sharpinf.ops import sampling as S
    from sharpinf.params import SamplingParams

    be, V = ctx.backend, ctx.model.config.n_vocab
    sp = SamplingParams(**SAMPLE_PARAMS)
    p, k = S.pack_params([sp] * N)
    dev = [be.upload(a) for a in (p, k, np.arange(N, dtype=np.uint64), np.zeros(N, np.int32))]
    no_slot = be.upload(np.full(N, -1, np.int32))
    history = (be.empty((1, S.history_words(V)), np.uint32), no_slot, be.upload(np.zeros(N, np.int32)),
               be.upload(np.zeros(N + 1, np.int32)), be.upload(np.full(1, -1, np.int32)),
               be.empty((1, S.count_words(V)), np.uint32), be.upload(np.zeros(N, np.int32)),
               be.upload(np.zeros((1, S.BIAS_STRIDE), np.int32)), no_slot,
               be.upload(np.zeros((1, S.history_words(V)), np.uint32)))
    out, scratch, acc = be.empty((N,), np.int32), be.empty((N, 2 * V), np.float32), S.sample_acc(be, N, V)
    logits = copies(be, rand(be, rng, N, V, scale=3.0), 4 * N * V)
    return [Case("sample", f"{N} rows x {V}", v.name, N, 4 * N * V,
                  [lambda v=v, x=x: v.launch(be, x, N, V, *dev, *history, out, scratch, acc=acc) for x in logits])
            for v in sel.variants_of("sample")]


def linear_cases(ctx: BenchContext, N: int, rng, lm_head: bool, sel: Selection) -> list[Case]:
    """The layer's projections (and the LM head), then gate + up + activation, at N tokens: each matmul
    variant that serves the weight type at N tokens, as the forward pass launches it (its own file).
    An MoE layer has no dense down, gate or up (its FFN is the moe op's)."""
    if not {"matmul", "ffn_in", "ffn"} & sel.ops:
        return []
    be, fp = ctx.backend, ctx.forward_pass()
    cfg, L = fp.cfg, fp.layers[0]
    variants = sel.variants_of("matmul")

    def q8(x, n):
        out = Q8Act.empty(be, N, n)
        quantize_q8_1(be, x, out, N, n)
        return out

    x_e, x_att = (rand(be, rng, N, n) for n in (cfg.n_embd, cfg.q_dim))
    xq_e, xq_att = q8(x_e, cfg.n_embd), q8(x_att, cfg.q_dim)
    cases: list[Case] = []
    mats = [(f"qkv {W.n_out}x{W.n_in}" if len(L.wqkv) == 1 else f"{n} {W.n_out}x{W.n_in}", W, x_e, xq_e)
            for n, W in zip("qkv" if len(L.wqkv) > 1 else ["qkv"], L.wqkv)]
    mats.append((f"o {L.wo.n_out}x{L.wo.n_in}", L.wo, x_att, xq_att))
    if L.w_down is not None:
        x_ff = rand(be, rng, N, cfg.n_ff)
        mats.append((f"down {L.w_down.n_out}x{L.w_down.n_in}", L.w_down, x_ff, q8(x_ff, cfg.n_ff)))
    if lm_head:  # (a prefill step runs the head on one row a sequence: not a prefill GEMM)
        mats.append((f"lm_head {fp.output.n_out}x{fp.output.n_in}", fp.output, x_e, xq_e))
    for label, W, xf, xq in mats if "matmul" in sel.ops else []:
        y = be.empty((N, W.n_out), np.float32)
        wb = W.n_out * quants.row_bytes(W.qtype, W.n_in)
        shape = f"{label} {quants.qtype_name(W.qtype)}"
        ws = copies(be, W.raw, wb)
        for v in variants:
            if not v.serves(W.qtype, N) or repeats_an_earlier(v, variants, lambda v: (v.launcher, v.files[0])):
                continue
            x, act_bytes = (xq, N * W.n_in * 9 // 8) if v.activations == "q8_1" else (xf, 4 * N * W.n_in)
            cases.append(Case("matmul", shape, v.name, N, wb + act_bytes + 4 * N * W.n_out,
                               [lambda v=v, W=W, w=w, x=x, y=y: v.launch(be, w, W.qtype, x, y, N, W.n_out, W.n_in)
                                for w in ws], flops=2 * N * W.n_out * W.n_in))
    if "ffn_in" not in sel.ops or L.w_gate is None:
        return cases + ffn_cases(ctx, N, rng, sel, xq_e)

    # the FFN's first half: gate and up and the activation
    g, u = L.w_gate, L.w_up
    gate, up = be.empty((N, cfg.n_ff), np.float32), be.empty((N, cfg.n_ff), np.float32)
    wb = (g.n_out * quants.row_bytes(g.qtype, g.n_in) + u.n_out * quants.row_bytes(u.qtype, u.n_in))
    shape = f"gate+up 2x{cfg.n_ff}x{cfg.n_embd} {quants.qtype_name(g.qtype)}"
    gus = list(zip(copies(be, g.raw, wb), copies(be, u.raw, wb)))
    for v in variants:
        if v.gate_up is None or v.like:  # a copy's gate+up is its source's kernel, timed under the source
            if v is baseline("matmul"):  # the baseline's: two matmuls and the activation kernel
                def unfused(gw, uw, v=v):
                    v.launch(be, gw, g.qtype, x_e, gate, N, g.n_out, g.n_in)
                    v.launch(be, uw, u.qtype, x_e, up, N, u.n_out, u.n_in)
                    basic.act_gate(be, gate, up, gate, N * cfg.n_ff, cfg.ffn_act)

                cases.append(Case("ffn_in", shape, v.name, N, wb + 4 * N * (cfg.n_embd + cfg.n_ff),
                                   [lambda gw=gw, uw=uw: unfused(gw, uw) for gw, uw in gus]))
            continue
        if g.qtype != u.qtype or not v.serves(g.qtype, N) or repeats_an_earlier(v, variants, lambda v: v.gate_up):
            continue
        cases.append(Case("ffn_in", shape, v.name, N, wb + N * cfg.n_embd * 9 // 8 + 4 * N * cfg.n_ff,
                           [lambda v=v, gw=gw, uw=uw: v.gate_up(be, gw, uw, g.qtype, xq_e, gate, N, cfg.n_ff, cfg.n_embd,
                                                               act=cfg.ffn_act) for gw, uw in gus],
                           flops=4 * N * cfg.n_ff * cfg.n_embd))
    return cases + ffn_cases(ctx, N, rng, sel, xq_e)


def repeats_an_earlier(v: Variant, variants: list[Variant], kernels: Callable[[Variant], Any]) -> bool:
    """Whether an earlier variant in the list runs the same kernels for this case (a `like` copy's
    gate+up is its source's): its row would time the same launches again."""
    return any(kernels(o) == kernels(v) for o in variants[: variants.index(v)])


def ffn_cases(ctx: BenchContext, N: int, rng, sel: Selection, xq) -> list[Case]:
    """The whole dense FFN (gate+up, q8_1, down into the residual) in each selected ffn variant that
    fuses it and serves this step, beside the baseline's separate launches -- by the matmul variant the
    fused one requires (variants.toml): the speedup is over those."""
    fused = [v for v in sel.variants_of("ffn") if not v.separate]
    be, fp = ctx.backend, ctx.forward_pass()
    cfg, L = fp.cfg, fp.layers[0]
    if "ffn" not in sel.ops or not fused or L.w_gate is None or L.post_ffn_norm is not None:
        return []
    g, u, dn = L.w_gate, L.w_up, L.w_down
    qtypes = (g.qtype, u.qtype, dn.qtype)
    h, hq, x, bar = (be.empty((N, cfg.n_ff), np.float32), Q8Act.empty(be, N, cfg.n_ff), rand(be, rng, N, cfg.n_embd),
                     be.zeros((2,), np.uint32))
    mm = KernelChoice(**with_requirements("ffn", fused[0].name)).of("matmul")
    nbytes = sum(W.n_out * quants.row_bytes(W.qtype, W.n_in) for W in (g, u, dn)) + N * cfg.n_embd * (9 // 8 + 8)

    def separate():
        mm.gate_up(be, g.raw, u.raw, g.qtype, xq, h, N, cfg.n_ff, cfg.n_embd, act=cfg.ffn_act)
        quantize_q8_1(be, h, hq, N, cfg.n_ff)
        mm.launch(be, dn.raw, dn.qtype, hq, x, N, dn.n_out, dn.n_in, accumulate=True)

    shape = f"gate+up+down {cfg.n_ff}x{cfg.n_embd} {quants.qtype_name(g.qtype)}"
    cases = []
    for v in fused:
        run = lambda v=v: v.launch(be, g.raw, u.raw, dn.raw, qtypes, xq, h, hq, x, N, cfg.n_ff, cfg.n_embd,  # noqa: E731
                                   cfg.ffn_act, bar)
        if len(set(qtypes)) == 1 and v.serves(n_tokens=N):  # what it serves (else it launches nothing)
            cases.append(Case("ffn", shape, v.name, N, nbytes, [run], flops=6 * N * cfg.n_ff * cfg.n_embd))
    if cases and mm.gate_up is not None:
        cases.insert(0, Case("ffn", shape, baseline("ffn").name, N, nbytes, [separate],
                             flops=6 * N * cfg.n_ff * cfg.n_embd))
    return cases


def moe_cases(ctx: BenchContext, N: int, rng, sel: Selection) -> list[Case]:
    """Layer 0's routed FFN at N tokens in each moe variant, as StepKernels.moe_ffn launches it (the
    norm before it is the norm op's): normed rows in (float, or their q8_1: as the variant declares), x += out."""
    be, fp = ctx.backend, ctx.forward_pass()
    E = fp.layers[0].moe
    if "moe" not in sel.ops or E is None:
        return []
    d, k = E.n_embd, E.n_used
    h, x = rand(be, rng, N, d), rand(be, rng, N, d)  # unit-RMS rows, as the norm writes them
    hq = Q8Act.empty(be, N, d)
    quantize_q8_1(be, h, hq, N, d)
    expert_bytes = (2 * E.n_ff * quants.row_bytes(E.gate_up_qtype, d)
                    + d * quants.row_bytes(E.down_qtype, E.n_ff))
    # copies of the stacks past the L2 cache by the fewest bytes a call touches (k experts): at small N
    # the same few experts would otherwise stay in the cache from one call to the next
    stacks = zip(*(copies(be, w, k * expert_bytes) for w in (E.gate, E.up, E.down)))
    experts = [replace(E, gate=g, up=u, down=dn) for g, u, dn in stacks]
    shape = (f"experts {k} of {E.n_expert}, gate+up 2x{E.n_ff}x{d} {quants.qtype_name(E.gate_up_qtype)}, "
             f"down {d}x{E.n_ff} {quants.qtype_name(E.down_qtype)}")
    router_bytes, xio_bytes = 4 * E.n_expert * d, 8 * N * d
    flops = 2 * N * E.n_expert * d + 2 * N * k * 3 * E.n_ff * d
    cases = []
    for v in sel.variants_of("moe"):
        if v.why_not(fp.cfg) or not v.serves(n_tokens=N):  # past its tokens it runs another variant's kernels
            continue
        q8 = v.activations == "q8_1"
        s = MoeScratch.alloc(be, N, k, E.n_ff, d, E.n_expert, grouped=q8)
        kw = dict(x_q=hq) if q8 else dict(x_f=h)
        cases.append(Case("moe", shape, v.name, N, router_bytes + xio_bytes + (N * d * 9 // 8 if q8 else 4 * N * d),
                           [lambda v=v, e=e, s=s, kw=kw: v.launch(be, e, x, s, N, act=fp.cfg.ffn_act, **kw)
                            for e in experts], flops=flops, expert_bytes=expert_bytes,
                           expert_load=lambda s=s: np.bincount(be.download(s.ids)[0], minlength=E.n_expert).tolist()))
    return cases


def link_cases(ctx: BenchContext, N: int, kv_dtype: str, rng, sel: Selection, qkv, positions, slots, k_cache,
               v_cache) -> list[Case]:
    """Everything between two attentions (layer 0's o-projection and FFN, then its own norm, QKV and
    rope_kv standing in for the next layer's) in each selected link variant that serves this step,
    beside the baseline's eight separate launches -- by the matmul and rope_kv variants the link requires."""
    linked = [v for v in sel.variants_of("link") if not v.separate and v.serves(n_tokens=N)]
    be, fp = ctx.backend, ctx.forward_pass()
    cfg, L = fp.cfg, fp.layers[0]
    mats = (L.wo, L.w_gate, L.w_up, L.w_down, *L.wqkv) if L.w_gate is not None else ()
    if ("link" not in sel.ops or not linked or not mats or L.post_ffn_norm is not None or L.post_attn_norm is not None
            or len(L.wqkv) != 1 or len({W.qtype for W in mats}) != 1):
        return []
    from sharpinf.ops.layer_dp4a import LinkPost, LinkPre, LinkStep

    x, h = rand(be, rng, N, cfg.n_embd), be.empty((N, cfg.n_ff), np.float32)
    xq, hq, att = Q8Act.empty(be, N, cfg.n_embd), Q8Act.empty(be, N, cfg.n_ff), Q8Act.empty(be, N, cfg.q_dim)
    quantize_q8_1(be, rand(be, rng, N, cfg.q_dim), att, N, cfg.q_dim)
    Wqkv = L.wqkv[0]
    post = LinkPost(tuple(W.qtype for W in mats[:4]), L.wo.raw, att, L.ffn_norm, L.w_gate.raw, L.w_up.raw,
                    L.w_down.raw)
    pre = LinkPre(Wqkv.qtype, L.attn_norm, Wqkv.raw, L.bqkv, L.q_norm, L.k_norm, k_cache, v_cache, L.rope_freqs, L.rope_mscale)
    step = LinkStep(x, xq, Q8Act.empty(be, N, cfg.n_embd), h, hq, qkv, positions, slots, be.zeros((2,), np.uint32),
                    kv_dtype, N, cfg.n_embd,
                    cfg.n_ff, cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.rms_eps, cfg.rope_style, cfg.ffn_act,
                    cfg.attn_temp_scale, cfg.n_ctx_orig)
    choice = KernelChoice(**with_requirements("link", linked[0].name))
    mm, rope = choice.of("matmul"), choice.of("rope_kv")
    qkv_w = cfg.q_dim + 2 * cfg.kv_dim

    def eight():
        mm.launch(be, L.wo.raw, L.wo.qtype, att, x, N, cfg.n_embd, cfg.q_dim, accumulate=True)
        mm.norm(be, x, L.ffn_norm, xq, N, cfg.n_embd, cfg.rms_eps)
        mm.gate_up(be, L.w_gate.raw, L.w_up.raw, L.w_gate.qtype, xq, h, N, cfg.n_ff, cfg.n_embd, act=cfg.ffn_act)
        quantize_q8_1(be, h, hq, N, cfg.n_ff)
        mm.launch(be, L.w_down.raw, L.w_down.qtype, hq, x, N, cfg.n_embd, cfg.n_ff, accumulate=True)
        mm.norm(be, x, L.attn_norm, xq, N, cfg.n_embd, cfg.rms_eps)
        mm.launch(be, Wqkv.raw, Wqkv.qtype, xq, qkv, N, qkv_w, cfg.n_embd, bias_dev=L.bqkv)
        rope.launch(be, kv_dtype, qkv, qkv_w, positions, slots, L.q_norm, L.k_norm, k_cache, v_cache, N, cfg.n_head,
                    cfg.n_head_kv, cfg.head_dim, L.rope_freqs, cfg.rms_eps, cfg.rope_style, mscale=L.rope_mscale,
                    temp_scale=cfg.attn_temp_scale, temp_floor=cfg.n_ctx_orig)

    nbytes = (sum(W.n_out * quants.row_bytes(W.qtype, W.n_in) for W in mats)
              + 4 * N * (3 * cfg.n_embd + cfg.n_ff + qkv_w))
    flops = 2 * N * sum(W.n_out * W.n_in for W in mats)
    shape = f"o, FFN {cfg.n_ff}, qkv {qkv_w} x {cfg.n_embd} {quants.qtype_name(L.wo.qtype)}"
    cases = [Case("link", shape, baseline("link").name, N, nbytes, [eight], flops=flops)]
    return cases + [Case("link", shape, v.name, N, nbytes, [lambda v=v: v.launch(be, post, pre, step)], flops=flops)
                    for v in linked]
