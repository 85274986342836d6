"""Every tolerance the oracles use, in one place, with the reason for each."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerance:
    max_abs_dlogit: float  # largest |logit difference| allowed at any position
    min_top5_overlap: int  # of 5
    argmax_equal: bool  # the greedy token must agree
    why: str


# reference (float32) vs the naive float64 loops: only float32 rounding separates them
REFERENCE_VS_NAIVE = Tolerance(2e-3, 5, True, "float32 vs float64 on the same formulas")
# incremental decode vs one full pass on the same reference: same math, other grouping
INCREMENTAL_VS_FULL = Tolerance(1e-3, 5, True, "same float32 math, different matmul shapes")
# two fast paths against each other on a real model (the reference engine's rule)
CROSS_PATH = Tolerance(1.0, 4, True, "argmax equal, top-5 overlap >= 4, |dlogit| <= 1 on real models")


def kernel_vs_reference(kv_dtype: str, logit_scale: float = 1.0) -> Tolerance:
    """Kernels (float32 math, KV stored in kv_dtype) against the float32 NumPy reference.

    The KV dtype dominates: f32 KV differs from the reference only by summation order;
    f16/bf16 round K and V to 11/8 significant bits; q8_0 to 8 bits per 32-value block.
    logit_scale (max |logit| of the reference, at least 1) scales the bound for
    synthetic models whose logits are not O(10) like a real model's."""
    bound = {"f32": 2e-3, "f16": 2e-2, "bf16": 1.5e-1, "q8_0": 1.5e-1}[kv_dtype]
    top5 = {"f32": 5, "f16": 4, "bf16": 3, "q8_0": 3}[kv_dtype]
    return Tolerance(bound * max(1.0, logit_scale), top5, kv_dtype in ("f32", "f16"),
                     f"{kv_dtype} KV: float32 kernels vs float32 reference")
