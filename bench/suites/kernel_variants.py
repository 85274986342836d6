"""Each variant of each op on the model's real shapes: time, achieved GB/s, share of the
device's measured bandwidth, and the speedup over the readable baseline.

    op          cases (layer 0's shapes and types)            variants
    norm        rmsnorm of N rows of n_embd                    simple -> float, dp4a -> q8_1 (fused)
    matmul      qkv, o, down, lm_head                          simple (float X), dp4a (q8_1 X), mma, mmq (N >= 16),
                                                               gemv (N <= 8), best (what fast runs: dp4a or mmq)
    ffn_in      gate + up + SwiGLU                             simple (2 matmuls + silu_gate), dp4a (gate_up_dp4a)
    rope_kv     qk-norm, RoPE, KV append                       simple (3-5 kernels), fused (rope_kv)
    ffn         the dense FFN of a decode step                 dp4a (3 launches), ffn (one cooperative launch)
    link        all between two attentions at decode: o-proj,  dp4a (8 launches), layer (one cooperative
                FFN norm + FFN, the next norm, QKV, rope_kv    launch: layer_dp4a.cu)
    attention   N sequences decoding at `context`              simple, split, flash
    moe         router, the experts the tokens pick, combine   simple (a warp per pair and row), fast (pairs
                (MoE models: no ffn_in or down matmul then)    sorted by expert, dp4a over each one's tiles),
                                                               mmq (tiles of 64 pairs on tensor cores, N >= 16)

for N = 1, 8, 64 tokens (decode). Prefill (rows marked "prefill"): the matmuls, gate+up and moe at
N = 128, 512, 2048 tokens (simple, dp4a, mma, mmq; TFLOP/s beside the device's dense tensor-core peak
where known), and attention over one prompt of 512, 2048, 8192 tokens from position 0 (simple,
split, flash; TFLOP/s of the causal half: 2 x 2 x L(L+1)/2 x heads x head_dim). GB/s counts the compulsory bytes (weights, activations in and out;
attention: the K/V of the context; moe: the router and each expert the routing picked, its gate, up
and down once) over the median device time of a launch: on a GPU each case
runs back to back in a CUDA graph (bench.common.launch_timed), over enough copies of its weights
(or KV cache) to exceed the L2 cache, so small shapes are timed from device memory too.
A moe row also holds its launch's expert load (`expert_load`: the (token, expert) pairs each expert
got, read back from the routing ids; random rows spread over the experts as a trained router's need
not). Decode is bound by memory, so GB/s beside the measured device bandwidth (a device-to-device
copy) says how close a kernel is to the roofline. ptxas facts (registers, spills, shared
memory) of the fast kernels the model uses come along where NVRTC is installed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable

import numpy as np
from rich.console import Group
from rich.table import Table

from sharpinf.errors import SharpinfError
from bench.suites.common import BenchContext, check_context, envelope, launch_timed, pyplot, save_fig, title_of
from sharpinf.model import quants
from sharpinf.ops import attention as attn_ops
from sharpinf.ops import basic
from sharpinf.ops import kv_cache as kv_ops
from sharpinf.ops.moe import MoeScratch
from sharpinf.ops.matmul_dp4a import TILE_TOKENS
from sharpinf.ops.quant_act import Q8Act, quantize_q8_1
from sharpinf.ops.variants import OP_NAMES, REGISTRY, Variant, baseline, variant

SUITE = "kernels"
# the registry op each bench op times (norm and ffn_in are the matmul family's: its activations' norm,
# and gate + up + activation)
BENCH_OPS = {"norm": "matmul", "matmul": "matmul", "ffn_in": "matmul", "ffn": "matmul", "link": "matmul",
             "rope_kv": "rope_kv", "attention": "attention", "moe": "moe", "sample": "sample"}
DENSE_FFN_OPS = {"ffn_in", "ffn", "link"}  # what only a dense FFN has (an MoE layer's FFN is the moe op)
# ffn: the whole dense FFN of a decode step in a variant that fuses it (matmul=ffn), beside the dp4a
# path's three launches it replaces; link: all a decode step does between two attentions in a variant
# that links them (matmul=layer), beside the dp4a path's eight -- the speedup is over those
BASE_OF = {"ffn": "dp4a", "link": "dp4a"}
EMU_NOTE = ("emulator times: each thread's C++ on one core, so they rank nothing a GPU would do; "
            "they show the harness runs and what each variant launches")


def fast_files() -> tuple[str, ...]:
    """The kernel files of every variant but the baselines (the ptxas report's scope)."""
    return tuple(dict.fromkeys(f for op in OP_NAMES for v in list(REGISTRY[op].values())[1:] for f in v.files))


@dataclass(frozen=True)
class Selection:
    """Which cases to time: bench ops (norm, matmul, ffn_in, rope_kv, attention, moe, sample; a registry op stands
    for its bench ops) and variant names (the baseline is always timed: the speedups are over it)."""

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


PREFILL_REPEATS = 3  # prefill cases run long: fewer repeats


EMU_REPEATS = 5  # the emulator's times vary run to run (1 ms to 4 ms for one kernel): min / median / max of 5


def defaults(on_gpu: bool, quick: bool) -> dict:
    if on_gpu:
        return dict(tokens=[1, 8, 64], context=4096 if not quick else 1024, repeats=50 if not quick else 10,
                    kv_dtype="f16", prefill=[128, 512, 2048] if not quick else [128],
                    prefill_context=[512, 2048, 8192] if not quick else [512])
    if quick:
        return dict(tokens=[1], context=48, repeats=EMU_REPEATS, kv_dtype="f16", prefill=[16], prefill_context=[24])
    return dict(tokens=[1, 8, 64], context=128, repeats=EMU_REPEATS, kv_dtype="f16", prefill=[32], prefill_context=[64])


@dataclass
class _Case:
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


def _copies(be, arr, nbytes: int) -> list:
    """arr and enough device copies of it that together they exceed the L2 cache (GPU only)."""
    if not be.gpu_shapes:
        return [arr]
    k = max(1, min(MAX_COPIES, -(-ROTATE_BYTES // max(1, nbytes))))
    host = be.download(arr)
    return [arr] + [be.upload(host) for _ in range(k - 1)]


def _rand(be, rng, *shape, scale=1.0):
    return be.upload((rng.standard_normal(shape) * scale).astype(np.float32))


def _cases(ctx: BenchContext, N: int, context: int, kv_dtype: str, rng, sel: Selection) -> list[_Case]:
    """Every selected (op, shape, variant) of a decode step at N tokens over fresh buffers (random data of
    the right form)."""
    be, fp = ctx.backend, ctx.forward_pass()
    cfg, L = fp.cfg, fp.layers[0]
    x_e = _rand(be, rng, N, cfg.n_embd)
    cases: list[_Case] = []
    if "norm" in sel.ops:  # the norm each matmul variant declares: float rows, or q8_1 fused into it
        h, hq = be.empty((N, cfg.n_embd), np.float32), Q8Act.empty(be, N, cfg.n_embd)
        nb_in = 4 * N * cfg.n_embd + 4 * cfg.n_embd
        kinds = {}  # one case per norm, named by the first variant that brings it
        for v in sel.variants_of("matmul"):
            kinds.setdefault(v.norm, v)
        for norm, v in kinds.items():
            out, nb_out = (hq, N * cfg.n_embd * 9 // 8) if v.activations == "q8_1" else (h, 4 * N * cfg.n_embd)
            cases.append(_Case("norm", f"{N}x{cfg.n_embd}", v.name, N, nb_in + nb_out,
                               [lambda norm=norm, out=out: norm(be, x_e, L.attn_norm, out, N, cfg.n_embd, cfg.rms_eps)]))
    cases += _linear_cases(ctx, N, rng, lm_head=True, sel=sel)
    return (cases + _rope_attention_cases(ctx, N, context, kv_dtype, rng, sel) + _moe_cases(ctx, N, rng, sel)
            + _sample_cases(ctx, N, rng, sel))


# the sampling bench's rows: temperature 1, top-k 50, top-p 0.9 (both cuts searched), no history
SAMPLE_PARAMS = dict(temperature=1.0, top_k=50, top_p=0.9)


def _sample_cases(ctx: BenchContext, N: int, rng, sel: Selection) -> list[_Case]:
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
    logits = _copies(be, _rand(be, rng, N, V, scale=3.0), 4 * N * V)
    return [_Case("sample", f"{N} rows x {V}", v.name, N, 4 * N * V,
                  [lambda v=v, x=x: v.launch(be, x, N, V, *dev, *history, out, scratch, acc=acc) for x in logits])
            for v in sel.variants_of("sample")]


def _linear_cases(ctx: BenchContext, N: int, rng, lm_head: bool, sel: Selection) -> list[_Case]:
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

    x_e, x_att = (_rand(be, rng, N, n) for n in (cfg.n_embd, cfg.q_dim))
    xq_e, xq_att = q8(x_e, cfg.n_embd), q8(x_att, cfg.q_dim)
    cases: list[_Case] = []
    mats = [(f"qkv {W.n_out}x{W.n_in}" if len(L.wqkv) == 1 else f"{n} {W.n_out}x{W.n_in}", W, x_e, xq_e)
            for n, W in zip("qkv" if len(L.wqkv) > 1 else ["qkv"], L.wqkv)]
    mats.append((f"o {L.wo.n_out}x{L.wo.n_in}", L.wo, x_att, xq_att))
    if L.w_down is not None:
        x_ff = _rand(be, rng, N, cfg.n_ff)
        mats.append((f"down {L.w_down.n_out}x{L.w_down.n_in}", L.w_down, x_ff, q8(x_ff, cfg.n_ff)))
    if lm_head:  # (a prefill step runs the head on one row a sequence: not a prefill GEMM)
        mats.append((f"lm_head {fp.output.n_out}x{fp.output.n_in}", fp.output, x_e, xq_e))
    for label, W, xf, xq in mats if "matmul" in sel.ops else []:
        y = be.empty((N, W.n_out), np.float32)
        wb = W.n_out * quants.row_bytes(W.qtype, W.n_in)
        shape = f"{label} {quants.qtype_name(W.qtype)}"
        ws = _copies(be, W.raw, wb)
        for v in variants:
            if not v.serves(W.qtype, N) or _repeats_an_earlier(v, variants, lambda v: (v.launcher, v.files[0])):
                continue
            x, act_bytes = (xq, N * W.n_in * 9 // 8) if v.activations == "q8_1" else (xf, 4 * N * W.n_in)
            cases.append(_Case("matmul", shape, v.name, N, wb + act_bytes + 4 * N * W.n_out,
                               [lambda v=v, W=W, w=w, x=x, y=y: v.launch(be, w, W.qtype, x, y, N, W.n_out, W.n_in)
                                for w in ws], flops=2 * N * W.n_out * W.n_in))
    if "ffn_in" not in sel.ops or L.w_gate is None:
        return cases + _ffn_cases(ctx, N, rng, sel, xq_e)

    # the FFN's first half: gate and up and the activation
    g, u = L.w_gate, L.w_up
    gate, up = be.empty((N, cfg.n_ff), np.float32), be.empty((N, cfg.n_ff), np.float32)
    wb = (g.n_out * quants.row_bytes(g.qtype, g.n_in) + u.n_out * quants.row_bytes(u.qtype, u.n_in))
    shape = f"gate+up 2x{cfg.n_ff}x{cfg.n_embd} {quants.qtype_name(g.qtype)}"
    gus = list(zip(_copies(be, g.raw, wb), _copies(be, u.raw, wb)))
    for v in variants:
        if v.gate_up is None or v.like:  # a copy's gate+up is its source's kernel, timed under the source
            if v is baseline("matmul"):  # the baseline's: two matmuls and the activation kernel
                def unfused(gw, uw, v=v):
                    v.launch(be, gw, g.qtype, x_e, gate, N, g.n_out, g.n_in)
                    v.launch(be, uw, u.qtype, x_e, up, N, u.n_out, u.n_in)
                    basic.act_gate(be, gate, up, gate, N * cfg.n_ff, cfg.ffn_act)

                cases.append(_Case("ffn_in", shape, v.name, N, wb + 4 * N * (cfg.n_embd + cfg.n_ff),
                                   [lambda gw=gw, uw=uw: unfused(gw, uw) for gw, uw in gus]))
            continue
        if g.qtype != u.qtype or not v.serves(g.qtype, N) or _repeats_an_earlier(v, variants, lambda v: v.gate_up):
            continue
        cases.append(_Case("ffn_in", shape, v.name, N, wb + N * cfg.n_embd * 9 // 8 + 4 * N * cfg.n_ff,
                           [lambda v=v, gw=gw, uw=uw: v.gate_up(be, gw, uw, g.qtype, xq_e, gate, N, cfg.n_ff, cfg.n_embd,
                                                               act=cfg.ffn_act) for gw, uw in gus],
                           flops=4 * N * cfg.n_ff * cfg.n_embd))
    return cases + _ffn_cases(ctx, N, rng, sel, xq_e)


def _repeats_an_earlier(v: Variant, variants: list[Variant], kernels: Callable[[Variant], Any]) -> bool:
    """Whether an earlier variant in the list runs the same kernels for this case (matmul=ffn's linear
    layers and gate+up are dp4a's): its row would time the same launches again."""
    return any(kernels(o) == kernels(v) for o in variants[: variants.index(v)])


def _ffn_cases(ctx: BenchContext, N: int, rng, sel: Selection, xq) -> list[_Case]:
    """The whole dense FFN (gate+up, q8_1, down into the residual) where a selected variant fuses it
    (its `ffn` serves this step), beside dp4a's three launches."""
    fused = [v for v in sel.variants_of("matmul") if v.ffn is not None]
    fused = [v for v in fused if not _repeats_an_earlier(v, fused, lambda o: o.ffn)]  # matmul=layer's is ffn's
    be, fp = ctx.backend, ctx.forward_pass()
    cfg, L = fp.cfg, fp.layers[0]
    if "ffn" not in sel.ops or not fused or L.w_gate is None or L.post_ffn_norm is not None:
        return []
    g, u, dn = L.w_gate, L.w_up, L.w_down
    qtypes = (g.qtype, u.qtype, dn.qtype)
    h, hq, x, bar = (be.empty((N, cfg.n_ff), np.float32), Q8Act.empty(be, N, cfg.n_ff), _rand(be, rng, N, cfg.n_embd),
                     be.zeros((2,), np.uint32))
    dp4a = variant("matmul", "dp4a")
    nbytes = sum(W.n_out * quants.row_bytes(W.qtype, W.n_in) for W in (g, u, dn)) + N * cfg.n_embd * (9 // 8 + 8)

    def three():
        dp4a.gate_up(be, g.raw, u.raw, g.qtype, xq, h, N, cfg.n_ff, cfg.n_embd, act=cfg.ffn_act)
        quantize_q8_1(be, h, hq, N, cfg.n_ff)
        dp4a.launch(be, dn.raw, dn.qtype, hq, x, N, dn.n_out, dn.n_in, accumulate=True)

    shape = f"gate+up+down {cfg.n_ff}x{cfg.n_embd} {quants.qtype_name(g.qtype)}"
    cases = []
    for v in fused:
        run = lambda v=v: v.ffn(be, g.raw, u.raw, dn.raw, qtypes, xq, h, hq, x, N, cfg.n_ff, cfg.n_embd,  # noqa: E731
                                cfg.ffn_act, bar)
        if g.qtype == u.qtype == dn.qtype and N <= TILE_TOKENS:  # what it serves (else it launches nothing)
            cases.append(_Case("ffn", shape, v.name, N, nbytes, [run], flops=6 * N * cfg.n_ff * cfg.n_embd))
    if cases:
        cases.insert(0, _Case("ffn", shape, "dp4a", N, nbytes, [three], flops=6 * N * cfg.n_ff * cfg.n_embd))
    return cases


def _moe_cases(ctx: BenchContext, N: int, rng, sel: Selection) -> list[_Case]:
    """Layer 0's routed FFN at N tokens in each moe variant, as StepKernels.moe_ffn launches it (the
    norm before it is the norm op's): normed rows in (float for simple, their q8_1 for fast), x += out."""
    be, fp = ctx.backend, ctx.forward_pass()
    E = fp.layers[0].moe
    if "moe" not in sel.ops or E is None:
        return []
    d, k = E.n_embd, E.n_used
    h, x = _rand(be, rng, N, d), _rand(be, rng, N, d)  # unit-RMS rows, as the norm writes them
    hq = Q8Act.empty(be, N, d)
    quantize_q8_1(be, h, hq, N, d)
    expert_bytes = (2 * E.n_ff * quants.row_bytes(E.gate_up_qtype, d)
                    + d * quants.row_bytes(E.down_qtype, E.n_ff))
    # copies of the stacks past the L2 cache by the fewest bytes a call touches (k experts): at small N
    # the same few experts would otherwise stay in the cache from one call to the next
    stacks = zip(*(_copies(be, w, k * expert_bytes) for w in (E.gate, E.up, E.down)))
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
        cases.append(_Case("moe", shape, v.name, N, router_bytes + xio_bytes + (N * d * 9 // 8 if q8 else 4 * N * d),
                           [lambda v=v, e=e, s=s, kw=kw: v.launch(be, e, x, s, N, act=fp.cfg.ffn_act, **kw)
                            for e in experts], flops=flops, expert_bytes=expert_bytes,
                           expert_load=lambda s=s: np.bincount(be.download(s.ids)[0], minlength=E.n_expert).tolist()))
    return cases


def _attention_variants(ctx: BenchContext, op: str, shape: str, N: int, nbytes: int, args: list, sel: Selection,
                        keys: int, flops: int = 0, window: int | None = None) -> list[_Case]:
    """The selected attention variants that fit the model, over the same argument tuples (one per K/V
    copy), as layer 0 runs them (its sliding window, if any: gemma3), each in the launch shape its
    rule takes for a step whose longest context is `keys` keys (or $SHARPINF_ATTENTION_MODE's)."""
    be, cfg = ctx.backend, ctx.forward_pass().cfg
    sw = cfg.window(0)
    if sw:
        shape += f", window {sw}"
    cases = []
    for v in sel.variants_of("attention"):
        if v.why_not(cfg):
            continue
        scratch = attn_ops.SplitScratch.alloc(be, window or N, cfg.n_head, cfg.n_head_kv, cfg.head_dim) \
            if v.needs_scratch else None
        a0 = args[0]  # (be, kv_dtype, ..., n_tokens, n_seqs, n_heads, n_kv_heads, head_dim, ...)
        shape_of = lambda how, v=v, a0=a0, **kw: v.shape(be, a0[1], a0[11], a0[12], cfg.n_head,  # noqa: E731
                                                         cfg.n_head_kv, cfg.head_dim, keys, sw, how,
                                                         file=v.files[0], **kw)
        mode, (rule, inputs) = (shape_of(None), shape_of("auto", explain=True)) if v.shape else (None, (None, None))
        kw = dict(sliding_window=sw) | (dict(mode=mode) if mode else {})
        cases.append(_Case(op, shape, v.name, N, nbytes,
                           [lambda v=v, a=a, scratch=scratch, kw=kw: v.launch(*a, scratch, **kw) for a in args],
                           flops, launch_shape=mode, rule_shape=rule,
                           rule=asdict(inputs) if inputs else None))
    return cases


def _prefill_attention_cases(ctx: BenchContext, P: int, kv_dtype: str, rng, sel: Selection) -> list[_Case]:
    """One prompt of P tokens attending causally from position 0 (its K/V already in the cache)."""
    if "attention" not in sel.ops:
        return []
    be, cfg = ctx.backend, ctx.forward_pass().cfg
    bs = 16
    nblk = -(-P // bs)
    shape_kv, dt = kv_ops.kv_cache_shape(kv_dtype, nblk, bs, cfg.n_head_kv, cfg.head_dim)
    k_cache, v_cache = (be.upload(kv_ops.encode_kv(kv_dtype, rng.standard_normal(
        (shape_kv[0], cfg.n_head_kv, cfg.head_dim)).astype(np.float32))) for _ in range(2))
    qkv_w = cfg.q_dim + 2 * cfg.kv_dim
    qkv = _rand(be, rng, P, qkv_w, scale=0.5)
    positions, cu = be.upload(np.arange(P, dtype=np.int32)), be.upload(np.array([0, P], np.int32))
    tables = be.upload(np.arange(nblk, dtype=np.int32)[None, :])
    kv_bytes = int(np.prod(shape_kv)) * np.dtype(dt).itemsize
    nbytes = 2 * kv_bytes + 8 * P * cfg.q_dim
    out = be.empty((P, cfg.q_dim), np.float32)
    kvs = list(zip(_copies(be, k_cache, nbytes // 2), _copies(be, v_cache, nbytes // 2)))
    args = [(be, kv_dtype, qkv, qkv_w, kc, vc, tables, nblk, cu, positions, out, P, 1, cfg.n_head, cfg.n_head_kv,
             cfg.head_dim, bs, cfg.kq_scale) for kc, vc in kvs]
    flops = 4 * (P * (P + 1) // 2) * cfg.n_head * cfg.head_dim
    return _attention_variants(ctx, "attention", f"prefill 1 x {P} tokens, KV {kv_dtype}", P, nbytes, args, sel,
                               P, flops, window=attn_ops.SPLIT_WINDOW)


def _rope_attention_cases(ctx: BenchContext, N: int, context: int, kv_dtype: str, rng, sel: Selection) -> list[_Case]:
    """rope + KV append (+ qk-norm), and attention: N sequences, each decoding at `context`."""
    if not {"rope_kv", "attention", "link"} & sel.ops:
        return []
    be, fp = ctx.backend, ctx.forward_pass()
    cfg, L = fp.cfg, fp.layers[0]
    cases: list[_Case] = []
    bs = 16
    per_seq = -(-(context + 1) // bs)
    shape_kv, dt = kv_ops.kv_cache_shape(kv_dtype, N * per_seq + 1, bs, cfg.n_head_kv, cfg.head_dim)
    slots_total = shape_kv[0]
    k_cache, v_cache = (be.upload(kv_ops.encode_kv(kv_dtype, rng.standard_normal(
        (slots_total, cfg.n_head_kv, cfg.head_dim)).astype(np.float32))) for _ in range(2))
    qkv_w = cfg.q_dim + 2 * cfg.kv_dim
    qkv = _rand(be, rng, N, qkv_w, scale=0.5)
    positions = be.upload(np.full(N, context, np.int32))
    slots = be.upload((np.arange(N) * per_seq * bs + context).astype(np.int32))
    tables = be.upload(np.arange(N * per_seq, dtype=np.int32).reshape(N, per_seq))
    cu = be.upload(np.arange(N + 1, dtype=np.int32))
    kv_elt = int(np.prod(shape_kv[1:])) * np.dtype(dt).itemsize  # bytes of one slot's K (or V)
    rope_bytes = 4 * N * qkv_w + 4 * N * (cfg.q_dim + cfg.kv_dim) + 2 * N * kv_elt

    theta, freq_scale = cfg.rope_for(0)
    rope_args = (be, kv_dtype, qkv, qkv_w, positions, slots, L.q_norm, L.k_norm, k_cache, v_cache, N, cfg.n_head,
                 cfg.n_head_kv, cfg.head_dim, theta, cfg.rms_eps, cfg.rope_style)
    if "rope_kv" in sel.ops:
        cases += [_Case("rope_kv", f"{N} tokens", v.name, N, rope_bytes,
                        [lambda v=v: v.launch(*rope_args, freq_scale=freq_scale)]) for v in sel.variants_of("rope_kv")]
    cases += _link_cases(ctx, N, kv_dtype, rng, sel, qkv, positions, slots, k_cache, v_cache)
    if "attention" not in sel.ops:
        return cases
    out = be.empty((N, cfg.q_dim), np.float32)
    att_bytes = 2 * N * (context + 1) * kv_elt + 8 * N * cfg.q_dim
    kvs = list(zip(_copies(be, k_cache, att_bytes // 2), _copies(be, v_cache, att_bytes // 2)))
    args = [(be, kv_dtype, qkv, qkv_w, kc, vc, tables, per_seq, cu, positions, out, N, N, cfg.n_head,
             cfg.n_head_kv, cfg.head_dim, bs, cfg.kq_scale) for kc, vc in kvs]
    shape = f"{N} seqs x {context + 1} keys, KV {kv_dtype}"
    return cases + _attention_variants(ctx, "attention", shape, N, att_bytes, args, sel, context + 1)


def _link_cases(ctx: BenchContext, N: int, kv_dtype: str, rng, sel: Selection, qkv, positions, slots, k_cache,
                v_cache) -> list[_Case]:
    """Everything between two attentions (layer 0's o-projection and FFN, then its own norm, QKV and
    rope_kv standing in for the next layer's) where a selected variant links it (its `link` serves
    this step), beside the dp4a path's eight launches."""
    linked = [v for v in sel.variants_of("matmul") if v.link is not None]
    linked = [v for v in linked if not _repeats_an_earlier(v, linked, lambda o: o.link)]
    be, fp = ctx.backend, ctx.forward_pass()
    cfg, L = fp.cfg, fp.layers[0]
    mats = (L.wo, L.w_gate, L.w_up, L.w_down, *L.wqkv) if L.w_gate is not None else ()
    if ("link" not in sel.ops or not linked or not mats or L.post_ffn_norm is not None or L.post_attn_norm is not None
            or len(L.wqkv) != 1 or len({W.qtype for W in mats}) != 1 or N > TILE_TOKENS):
        return []
    from sharpinf.ops.layer_dp4a import LinkPost, LinkPre, LinkStep

    x, h = _rand(be, rng, N, cfg.n_embd), be.empty((N, cfg.n_ff), np.float32)
    xq, hq, att = Q8Act.empty(be, N, cfg.n_embd), Q8Act.empty(be, N, cfg.n_ff), Q8Act.empty(be, N, cfg.q_dim)
    quantize_q8_1(be, _rand(be, rng, N, cfg.q_dim), att, N, cfg.q_dim)
    theta, freq_scale = cfg.rope_for(0)
    Wqkv = L.wqkv[0]
    post = LinkPost(tuple(W.qtype for W in mats[:4]), L.wo.raw, att, L.ffn_norm, L.w_gate.raw, L.w_up.raw,
                    L.w_down.raw)
    pre = LinkPre(Wqkv.qtype, L.attn_norm, Wqkv.raw, L.bqkv, L.q_norm, L.k_norm, k_cache, v_cache, theta, freq_scale)
    step = LinkStep(x, xq, Q8Act.empty(be, N, cfg.n_embd), h, hq, qkv, positions, slots, be.zeros((2,), np.uint32),
                    kv_dtype, N, cfg.n_embd,
                    cfg.n_ff, cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.rms_eps, cfg.rope_style, cfg.ffn_act)
    dp4a, fused = variant("matmul", "dp4a"), variant("rope_kv", "fused")
    qkv_w = cfg.q_dim + 2 * cfg.kv_dim

    def eight():
        dp4a.launch(be, L.wo.raw, L.wo.qtype, att, x, N, cfg.n_embd, cfg.q_dim, accumulate=True)
        dp4a.norm(be, x, L.ffn_norm, xq, N, cfg.n_embd, cfg.rms_eps)
        dp4a.gate_up(be, L.w_gate.raw, L.w_up.raw, L.w_gate.qtype, xq, h, N, cfg.n_ff, cfg.n_embd, act=cfg.ffn_act)
        quantize_q8_1(be, h, hq, N, cfg.n_ff)
        dp4a.launch(be, L.w_down.raw, L.w_down.qtype, hq, x, N, cfg.n_embd, cfg.n_ff, accumulate=True)
        dp4a.norm(be, x, L.attn_norm, xq, N, cfg.n_embd, cfg.rms_eps)
        dp4a.launch(be, Wqkv.raw, Wqkv.qtype, xq, qkv, N, qkv_w, cfg.n_embd, bias_dev=L.bqkv)
        fused.launch(be, kv_dtype, qkv, qkv_w, positions, slots, L.q_norm, L.k_norm, k_cache, v_cache, N, cfg.n_head,
                     cfg.n_head_kv, cfg.head_dim, theta, cfg.rms_eps, cfg.rope_style, freq_scale=freq_scale)

    nbytes = (sum(W.n_out * quants.row_bytes(W.qtype, W.n_in) for W in mats)
              + 4 * N * (3 * cfg.n_embd + cfg.n_ff + qkv_w))
    flops = 2 * N * sum(W.n_out * W.n_in for W in mats)
    shape = f"o, FFN {cfg.n_ff}, qkv {qkv_w} x {cfg.n_embd} {quants.qtype_name(L.wo.qtype)}"
    cases = [_Case("link", shape, "dp4a", N, nbytes, [eight], flops=flops)]
    return cases + [_Case("link", shape, v.name, N, nbytes, [lambda v=v: v.link(be, post, pre, step)], flops=flops)
                    for v in linked]


def _ptxas(ctx: BenchContext, sel: Selection) -> dict:
    """Registers / spills / shared memory of the selected non-baseline variants' kernels this model runs
    (sm_90): the named sets' and every other registered variant's."""
    from sharpinf.ops.variants import choices_for
    from sharpinf.runtime.ptxas_report import ptxas_available, ptxas_report

    why = ptxas_available()
    if why:
        return {"available": False, "why": why}
    fp = ctx.forward_pass()
    mine = {f for op in {BENCH_OPS[b] for b in sel.ops} for v in sel.variants_of(op)[1:] for f in v.files}
    files = tuple(f for f in fast_files() if f in mine)
    if not files:
        return {"available": False, "why": "no non-baseline variant selected"}
    used = set()
    for name in choices_for("all")[1:]:  # every variant, in the named sets and beside them
        try:
            other = fp if fp.choice.name == name else fp.with_own_buffers(kernels=name)
        except SharpinfError:  # a variant the model's shapes do not fit
            continue
        used |= {(f, e) for f, e in other.kernels_used(other.kv_dtype) if f in files}
    files = tuple(f for f in files if any(f == uf for uf, _ in used))  # (a dense model runs no moe file)
    rows = [p.to_json() for p in ptxas_report(list(files), "sm_90", {e for _, e in used})]
    return {"available": True, "arch": "sm_90", "entries": rows, "spills": sum(bool(r["spill_stores"] or r["spill_loads"])
                                                                                for r in rows)}


def case_groups(ctx: BenchContext, sel: Selection, tokens: list[int], context: int, kv_dtype: str,
                prefill: list[int] = (), prefill_context: list[int] = ()) -> list[tuple[str, int, Callable[[], list[_Case]]]]:
    """(phase, N, make the cases): decode steps at each N, then prefill GEMMs, then prefill attention --
    what run() times, and what bench/ncu_targets.py launches once each under a profiler."""
    rng = np.random.default_rng(ctx.seed)
    return ([("decode", N, lambda N=N: _cases(ctx, N, context, kv_dtype, rng, sel)) for N in tokens]
            + [("prefill", N, lambda N=N: _linear_cases(ctx, N, rng, False, sel) + _moe_cases(ctx, N, rng, sel))
               for N in prefill if {"matmul", "ffn_in", "moe"} & sel.ops]
            + [("prefill", P, lambda P=P: _prefill_attention_cases(ctx, P, kv_dtype, rng, sel))
               for P in prefill_context if "attention" in sel.ops])


def check_ops(ops: str | None, is_moe: bool, arch: str = "") -> None:
    """--op naming a layer the model has not: the dense FFN's ops on an MoE model, moe on a dense one.
    (matmul standing for ffn_in on an MoE model is no error.)"""
    named = {o.strip() for o in (ops or "").split(",")}
    absent = named & (DENSE_FFN_OPS if is_moe else {"moe"})
    if absent:
        raise SharpinfError(f"--op {', '.join(sorted(absent))}: {'an MoE' if is_moe else 'a dense'} model"
                            f"{f' ({arch})' if arch else ''} has no such layer")


def run(ctx: BenchContext, tokens: list[int], context: int, repeats: int, kv_dtype: str,
        prefill: list[int] = (), prefill_context: list[int] = (), ops: str | None = None,
        variants: str | None = None) -> dict:
    be, cfg = ctx.backend, ctx.model.config
    sel = Selection.parse(ops, variants)
    check_ops(ops, cfg.is_moe, cfg.arch)
    check_context(cfg.context_length, context, prefill_context)
    bw = be.device_bandwidth()
    groups = case_groups(ctx, sel, tokens, context, kv_dtype, prefill, prefill_context)
    rows = []
    with ctx.progress() as bar:
        task = bar.add_task(f"{SUITE}: decode N = {', '.join(map(str, tokens))}; prefill "
                            f"{', '.join(map(str, list(prefill) + list(prefill_context))) or 'none'}", total=len(groups))
        for phase, N, make in groups:
            for c in make():
                launches, blocks = _grid_of(be, c.calls[0])
                times = launch_timed(be, c.calls, repeats if phase == "decode" or not be.gpu_shapes
                                     else min(repeats, PREFILL_REPEATS))
                t = float(np.median(times))
                load = c.expert_load() if c.expert_load else None
                nbytes = c.nbytes + c.expert_bytes * sum(n > 0 for n in load or [])
                rows.append({"phase": phase, "op": c.op, "shape": c.shape, "variant": c.variant, "tokens": N,
                             "us": t * 1e6, "us_min": min(times) * 1e6, "us_max": max(times) * 1e6,
                             "repeats": len(times), "launches": launches, "blocks": blocks,
                             "bytes": nbytes, "gb_s": nbytes / t / 1e9,
                             "tflops": c.flops / t / 1e12 if c.flops else None,
                             "pct_of_bandwidth": 100 * nbytes / t / 1e9 / bw if bw else None}
                            | ({"expert_load": load} if load is not None else {})
                            | ({"launch_shape": c.launch_shape, "rule_shape": c.rule_shape, "rule": c.rule}
                               if c.launch_shape else {}))
            bar.advance(task)
    base = {(r["op"], r["shape"], r["tokens"]): r["us"] for r in rows
            if r["variant"] == BASE_OF.get(r["op"], baseline(BENCH_OPS[r["op"]]).name)}
    for r in rows:
        b = base.get((r["op"], r["shape"], r["tokens"]))
        r["speedup"] = b / r["us"] if b else None
    config = dict(tokens=tokens, context=context, repeats=repeats, kv_dtype=kv_dtype, prefill=list(prefill),
                  prefill_context=list(prefill_context), ops=sorted(sel.ops),
                  variants=sorted(sel.variants) if sel.variants else "all",
                  timing="median (and min, max) of repeats of a graph replay (GPU: back-to-back calls over input "
                         "copies past the L2 cache, per call; elsewhere one call), after 1 warm-up",
                  bytes="compulsory: weights + activations in and out; attention: the context's K and V; "
                        "moe: the router and the experts the routing picked, each once")
    if not be.gpu_shapes:
        config["note"] = EMU_NOTE
    results = {"device_bandwidth_gb_s": bw, "rows": rows, "ptxas": _ptxas(ctx, sel)}
    ctx.release()
    return envelope(ctx, SUITE, config, results)


def _grid_of(be, call: Callable[[], None]) -> tuple[int, int]:
    """(launches, blocks of all of them) of one call, recorded without running: how much of the GPU a
    variant's grid can fill (mmq's split-K, mmq_narrow's 16-row tiles)."""
    with be.recording() as plan:
        call()
    return len(plan), sum(math.prod(l.grid) for l in plan)


def _variant_label(row: dict) -> str:
    """The variant, and for the split frame the launch shape it ran in (* where the rule takes the other)."""
    shape = row.get("launch_shape")
    if not shape:
        return row["variant"]
    return f"{row['variant']} {shape}" + ("" if row.get("rule_shape") in (None, shape) else "*")


def table(doc: dict):
    r = doc["results"]
    bw = r["device_bandwidth_gb_s"]
    gpu = doc["backend"] == "cuda"
    t = Table("phase", "op", "shape", "N", "variant", "blocks", "us" if gpu else "us min/med/max", "GB/s", "% of bw",
              "TFLOP/s", "x baseline",
              title=f"kernel variants (device bandwidth {f'{bw:,.0f} GB/s' if bw else 'not measured on this backend'})")
    t.columns[2].overflow = "fold"
    notes = [f"on {doc['backend']}: {EMU_NOTE}"] if not gpu else []
    if any(row.get("launch_shape") for row in r["rows"]):
        notes.append("split / walk: the split frame's launch shape (ops/attention.py); *: its rule takes the other")
    t.caption = "\n".join(notes) or None
    for row in r["rows"]:
        us = f"{row['us']:,.1f}" if gpu else f"{row['us_min']:,.0f} / {row['us']:,.0f} / {row.get('us_max', row['us']):,.0f}"
        t.add_row(row.get("phase", "decode"), row["op"], row["shape"], str(row["tokens"]), _variant_label(row), _blocks(row), us,
                  f"{row['gb_s']:,.2f}", "-" if row["pct_of_bandwidth"] is None else f"{row['pct_of_bandwidth']:.0f}%",
                  "-" if not row.get("tflops") else f"{row['tflops']:.2f}",
                  "-" if row.get("speedup") is None else f"{row['speedup']:.2f}")
    loads = [_load_line(row) for row in r["rows"] if "expert_load" in row]
    p = r["ptxas"]
    if not p.get("available"):
        return Group(t, *loads, f"ptxas report left out: {p.get('why')}")
    pt = Table("kernel", "registers", "spill st/ld (B)", "stack (B)", "smem (B)",
               title=f"ptxas -v, the variants' kernels of this model ({p['arch']}): {p['spills']} with spills")
    for e in p["entries"]:
        pt.add_row(e["entry"], str(e["registers"]), f"{e['spill_stores']}/{e['spill_loads']}", str(e["stack_bytes"]),
                   str(e["smem_bytes"]))
    return Group(t, *loads, pt)


def _blocks(row: dict) -> str:
    """The blocks a call launches: 'B', or 'B in N' where they take N launches."""
    n, b = row.get("launches"), row.get("blocks")
    if not n:
        return "-"
    return f"{b:,}" if n == 1 else f"{b:,} in {n}"


def _load_line(row: dict) -> str:
    """One moe case's expert load in a line: how evenly its (token, expert) pairs spread."""
    load = row["expert_load"]
    mean = sum(load) / len(load)
    return (f"expert load, moe {row['variant']} {row.get('phase', 'decode')} N = {row['tokens']}: max {max(load)}, "
            f"mean {mean:.2f} (max/mean {max(load) / mean:.2f}), "
            f"{sum(n > 0 for n in load)} of {len(load)} experts used")


def plot(doc: dict, path):
    """Decode, the roofline view: per N, a group of bars per case, one bar per variant."""
    plt = pyplot()
    if plt is None:
        return None
    r = doc["results"]
    rows, bw = r["rows"], r["device_bandwidth_gb_s"]
    rows = [row for row in rows if row.get("phase", "decode") == "decode"]
    Ns = sorted({row["tokens"] for row in rows})
    if not Ns:
        return None
    names = list(dict.fromkeys(row["variant"] for row in rows))
    width = 0.8 / max(1, len(names))
    fig, axes = plt.subplots(1, len(Ns), figsize=(5.5 * len(Ns), 4.6), squeeze=False)
    for ax, N in zip(axes[0], Ns):
        sel = [row for row in rows if row["tokens"] == N]
        labels = list(dict.fromkeys(f"{row['op']}\n{row['shape'].split(' ')[0]}" for row in sel))
        for vi, name in enumerate(names):
            mine = [row for row in sel if row["variant"] == name]
            if not mine:
                continue
            xs = [labels.index(f"{row['op']}\n{row['shape'].split(' ')[0]}") + (vi - (len(names) - 1) / 2) * width
                  for row in mine]
            ax.bar(xs, [row["gb_s"] for row in mine], width=width, label=name)
        if bw:
            ax.axhline(bw, color="black", linestyle="--", linewidth=1, label=f"device bandwidth {bw:,.0f} GB/s")
        ax.set_xticks(range(len(labels)), labels, fontsize=7)
        ax.set_ylabel("achieved GB/s (compulsory bytes / time)")
        ax.set_title(f"N = {N} tokens")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7)
    fig.suptitle(title_of(doc) + ("" if doc["backend"] == "cuda" else "  (emulator: not GPU timings)"), fontsize=10)
    return save_fig(plt, fig, path)
