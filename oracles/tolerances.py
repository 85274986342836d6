"""Every tolerance the oracles use, in one place, with the reason for each."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerance:
    max_abs_dlogit: float  # largest |logit difference| allowed at any position
    min_top5_overlap: int  # of 5, at the worst position (ranks 5/6 may swap at a near-tie)
    argmax_equal: bool  # the greedy token must agree, except at a near-tie the measured
    #                     error explains (reference top-2 gap <= 2 * the row's 90th-percentile |dlogit|)
    why: str


# reference (float32) vs the naive float64 loops: only float32 rounding separates them
REFERENCE_VS_NAIVE = Tolerance(2e-3, 5, True, "float32 vs float64 on the same formulas")
# incremental decode vs one full pass on the same reference: same math, other grouping
INCREMENTAL_VS_FULL = Tolerance(1e-3, 5, True, "same float32 math, different matmul shapes")
# Two paths of the forward pass against each other (packed vs sequential, chunked vs whole,
# batched vs single, other blocks, graph vs eager, engine vs alone) need no tolerance: they are
# bit-identical by design and the oracles assert it (oracles/compare.exact). This one is kept
# for a pair of paths that is not -- none today -- with the reason to be stated where it is used.
CROSS_PATH = Tolerance(1.0, 4, True, "argmax equal, top-5 overlap >= 4, |dlogit| <= 1 on real models")


# Kernels (float32 math) against the float32 NumPy reference whose KV cache rounds K and
# V exactly as the kernels' cache does (Reference(kv_dtype=...)). What is left is the
# summation order (a few ulps per op) and, with a narrow cache, the rare element that a
# few ulps push to the other side of a rounding step: one f16/bf16 ulp, or one q8_0 step
# (amax/127 of its 32-value block), which moves logits by up to ~0.1 on synthetic models.
KERNEL_VS_REFERENCE_BOUND = {"f32": 2e-3, "f16": 3e-2, "bf16": 3e-2, "q8_0": 0.3}


# With q8_1 activations (the dp4a matmuls) the reference rounds each matmul input to q8_1 as
# the kernels do, and the integer dot products are exact. What is left: an input whose float32
# value differs by an ulp or two between kernel and reference (the norm, the attention output,
# silu * up) rounds to the neighbouring q8_1 step (amax/127 of its 32-value block) when it sits
# that close to a rounding edge. Each such flip moves its matmul's output by |w| * amax/127; the
# move reaches the next layers' inputs, where it pushes more values across edges, so the flips
# multiply with depth until the two roundings are as independent as q8_1 and no rounding are.
# Measured (max |dlogit| per logit_scale unit, emulator): 2-layer synthetic llama/qwen2/qwen3 x
# 11 types x KV f16/q8_0, 7..120 tokens: worst 0.23, median 0.08; 200..300 tokens: worst 0.35
# (against the plain float reference the same kernels are 4-5x further off: median 0.42, worst
# 1.1 -- on shallow models the rounding reference is what keeps the check tight). SmolLM2-135M
# (30 layers), 35-token chat, KV f16: 0.53 (0.45 / 0.63 before / after the q8_1 matmuls' combine
# became the member-order sum of dp4a.cuh; KV q8_0: 0.60 / 0.47 -- the flips land elsewhere, no
# trend: the combine's own error is ~1e-8 of sum |w x| either way); there the kernels sit as far from the rounding
# reference as from the float one (median 0.7 logits over 30 positions, argmax equal at 97%),
# and the rounding reference sits 0.64 from the float one: the size of q8_1's own noise on
# that model. Bound: 0.5 + 0.01 per layer (0.52 at 2 layers, 0.8 at 30). Cross-path oracles
# stay exact whatever the depth: the rounding is the same on every path.
# gemma3 (post-norms, GeGLU, windows) sits inside the same bounds: 6-layer synthetic gemma3, Q8_0 / Q4_K /
# F16, 60 tokens past an 8-key window: simple 0.0015-0.054, fast 0.27-0.33, tensor 0.37-0.51 (bounds
# 0.03-0.33 / 0.59-0.86 / 0.89-1.16); the real Gemma 3 270M (18 layers), 20 tokens, KV f16: simple 0.009,
# fast 2.46 against a bound of 0.71 x logit_scale (its logits run to ~40); 0.84 after the member-order combine.
# 2026-11-27: the combine became two-level (members' sums by groups of 8, then the groups) and each
# chunk term two explicit fmas into the sum: SmolLM2-135M, 37-token chat, KV f16, fast, max |dlogit|
# 1.73 before, 1.57 after (absolute): the same size, no trend; bounds unchanged.
# The near-tie argmax rule (compare.py) asks since 2026-11-27 for the row's 90th-percentile |dlogit|, not
# its largest: `sharpinf verify smollm2-135m --kernels fast` on the emulator, 35 tokens, flips 1 (KV
# f16, max 1.93) and 2 (KV q8_0, max 2.18), every one explained by the row-wide error -- as the H100's
# 1 and 1 (2026-11-23) were under the old rule.
def q8_1_activations_bound(n_layer: int) -> float:
    return 0.5 + 0.01 * n_layer


# Flash attention (attention_flash.cu) multiplies on f16 tensor cores: Q and the softmax weights P
# (and K, V of an f32 or q8_0 cache) are rounded to f16 (2^-11 relative) before products that are
# exact and sums in f32. One attention call against the float64 reference over the same stored K/V:
# measured <= 2.3e-4 * max|V| on the emulator (all KV dtypes, head_dim 64/128, GQA 2..9, contexts to
# 1,100 keys), against 2e-7 for the float32 kernels; bound 1e-3 * max|V|.
FLASH_ATTENTION_VS_REFERENCE = 1e-3  # atol, relative to max |V|
# Through a forward pass (per logit_scale unit, emulator, 2-layer synthetic llama/qwen2/qwen3 x Q4_0,
# Q8_0, Q4_K, Q6_K, F16, 40 and 150 tokens): flash with float matmuls, worst 0.039 (KV f16) and 0.086
# (KV q8_0, whose d * q is rounded to f16 once more); with q8_1 activations (the tensor set) the f16
# error flips q8_1 roundings as any ulp-level change does (q8_1_activations_bound's note): worst 0.38
# / 0.45 against fast's 0.19 / 0.14, inside the q8_1 bound. Added per layer: 0.05.
FLASH_LOGIT_BOUND = 0.05


# MoE routing is a discontinuity: a token whose k-th and (k+1)-th router logits sit closer than the
# kernels' error at the router's input takes other experts in the kernels than in the reference, and
# its logits then differ by whole units. kernel-vs-reference's rule (Reference.routes): where every
# expert the kernels chose is within this gap of the reference's own k-th logit (router-logit units;
# the synthetic routers' logits are ~2 wide), the reference follows the kernels' choice and the
# oracle's detail counts it. Measured flips (emulator, 2-layer synthetic qwen3moe Q8_0, 89 tokens):
# gaps 7.7e-4 and 1.2e-2 with flash attention (f16 operands), none with the float32 kernels.
ROUTE_FLIP_GAP = 0.05


# What each attention rounding (the variant's declared `rounding`, ops/variants.py ROUNDINGS) adds to
# the logit bound a layer, and the words for it.
ATTENTION_ROUNDING_BOUND = {"f32": (0.0, ""), "f16_operands": (FLASH_LOGIT_BOUND, ", attention operands in f16")}


def kernel_vs_reference(kv_dtype: str, logit_scale: float = 1.0, act_quant: str = "f32", n_layer: int = 2,
                        attention_rounding: str = "f32") -> Tolerance:
    """logit_scale = max |reference logit| / 10 (at least 1) widens the bound for synthetic
    models, whose logits run larger than a real model's; attention_rounding: the attention variant's
    declared rounding."""
    bound = KERNEL_VS_REFERENCE_BOUND[kv_dtype] + (q8_1_activations_bound(n_layer) if act_quant == "q8_1" else 0.0)
    acts = f", matmul inputs to q8_1 over {n_layer} layers" if act_quant == "q8_1" else ""
    per_layer, words = ATTENTION_ROUNDING_BOUND[attention_rounding]
    bound += per_layer * n_layer
    acts += words
    return Tolerance(bound * max(1.0, logit_scale), 4, True,
                     f"float32 kernels vs float32 reference, both rounding KV to {kv_dtype}{acts}")


# -- the op-by-op trace (oracles/trace.py) -------------------------------------------------------------
# Each op is fed the kernel path's own input and compared with the reference's formula in float64, so
# what is left is one op's float32 rounding, never an error carried over from earlier layers: the bounds
# are a few hundred times tighter than a logit bound and a bug in one op stands out by orders of
# magnitude. Measured (emulator, worst over every layer): 2-layer synthetic llama/qwen2/qwen3 and 6-layer
# gemma3 (8-key window) x all 11 weight types x kernels simple/fast/tensor x KV f16/q8_0, 20 and 70
# tokens (540 traces, none out of bound); KV bf16/f32 and 300 tokens for llama/qwen3/gemma3 in Q8_0/Q4_K.
# The MoE parts (route, weights, experts, combine): 2-layer qwen3moe Q4_K/Q8_0 (spread, skewed)/F16 and a
# Mixtral-style llama Q5_0 (ties, k = 3) x simple/fast/tensor x KV f16/q8_0, 20 tokens (24 traces).
# Not yet measured on real weights (SmolLM2, Gemma 3) nor on a GPU. Bugs planted in tests/test_trace.py
# show errors of 4e-3 to 2 in these units (0.47 q8_1 steps past half a step).
@dataclass(frozen=True)
class TraceBound:
    bound: float
    metric: str  # the unit the error is measured in
    why: str


ROW = "of the row's max |ref|"
STEPS = "q8_1 steps past half a step"
TRACE_BOUNDS: dict[str, TraceBound] = {
    "embedding": TraceBound(1e-6, ROW, "the table's rows dequantized in float32; measured 5.5e-8"),
    "norm": TraceBound(1e-5, ROW, "a sum of squares in another order and a rsqrt: a few ulps; measured 2.1e-7 "
                       "(an off-by-one in the mean of n values is 1/(2n), 1.2e-4 at n = 4096)"),
    "norm_q8": TraceBound(1e-3, STEPS, "each value lies within half a step (its block's amax/127) of the float norm "
                          "wherever a rounding edge falls, plus x * (1/d)'s rounding at up to 127 steps; measured 1.1e-5"),
    "matmul": TraceBound(2e-5, "of sum|x w|", "float32 sums of n products err by ~sqrt(n) ulps of sum_i |x_i w_i| "
                         "(q8_1 inputs: integer dots, exact, then a float sum per 32-value block); measured 2.5e-7 "
                         "at n <= 1024, ~1e-6 expected at n = 12288"),
    "rope": TraceBound(1e-5, ROW, "angles reduced in double, sincosf in float: a few ulps; measured 2.8e-7"),
    "kv_append": TraceBound(0.0, ROW, "the cache holds the kernel's own rotated K and V in its dtype, by the rule "
                            "ops/kv_cache.encode_kv mirrors: bit for bit; measured 0"),
    "attention": TraceBound(3e-5, "of max|V|", "float32 softmax and weighted sums over the keys; measured 1.7e-6 "
                            "(300 keys), growing ~sqrt(keys)"),
    "attention_f16_operands": TraceBound(FLASH_ATTENTION_VS_REFERENCE, "of max|V|",
                                  "Q, K and V rounded to f16 as the kernel does (the reference takes them so); "
                                  "what is left is P's f16 rounding, at most 2^-11 of max|V|; measured 1.8e-4"),
    "q8_copy": TraceBound(1e-3, STEPS, "the kernel path's own float rows rounded to q8_1: within half a step; "
                          "measured 3.9e-6"),
    "gate_up": TraceBound(5e-5, ROW, "two matmuls and act(g) * u in float32; measured 7.0e-7"),
    "residual": TraceBound(1e-6, ROW, "x + y rounds once (half an ulp of the sum), gemma3's post-norm a few ulps "
                           "more; measured 1.4e-7"),
    "moe_route": TraceBound(2e-5, "of 2 w max_e sum|h w_e|", "the router's float32 logits err as a matmul's (of "
                            "sum|h w_e|), and softmax and renormalisation move a probability or weight w by at most "
                            "2 w times a logit's error (moe_weights too); measured: no flipped choice (moe_route 0), "
                            "weights 2.3e-8"),
    "moe_combine": TraceBound(2e-6, ROW, "x + k weighted pair outputs, each product and add rounding once in float32; "
                              "measured 8.2e-8"),
}


def trace_bound(kind: str) -> TraceBound:
    return TRACE_BOUNDS[kind]

# The reference against llama.cpp on synthetic float32 models (tests/test_llamacpp_agreement.py,
# fixture from bench/llamacpp_agreement.py: llama-perplexity's saved log-probabilities, float32
# KV, no flash attention). The file stores each log-probability as a uint16 step over
# [max - 16, max], so one step is <= 16/65535 = 2.4e-4; float32 summation order adds ~1e-5.
# Measured on 2-layer qwen3, qwen3moe and Mixtral-style llama (45 scored rows each): max 1.5e-4,
# 1.2e-4 and 1.7e-4.
LLAMACPP_LOGPROB = 5e-4
# ... and on a gpt-oss whose experts are MXFP4 (the other weights F32): llama.cpp's CPU dots of MXFP4
# weights take the activations rounded to q8_0, the reference's take them in float32, and the clamped
# experts amplify that rounding: measured 0.36 nats at most over the 45 rows (2026-12-03), argmax equal
# wherever llama.cpp's own top-1 lead is at least LLAMACPP_CONFIDENT_MARGIN nats (the 4 flips are at
# leads of 0.006-0.031: ties). Dropping any of gpt-oss's parts (a sink, a bias, the clamp) is >= 2.4 off.
LLAMACPP_MXFP4_LOGPROB = 0.5
LLAMACPP_CONFIDENT_MARGIN = 0.1
