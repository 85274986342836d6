"""Kernel variants: for each op family, the readable baseline and the faster kernels beside it.

    op         variants           kernels
    matmul     simple             matmul.cu (+ elementwise.cu for the residual and SwiGLU)
               dp4a               rmsnorm_q8_1.cu -> matmul_dp4a.cu / gate_up_dp4a.cu: q8_1
                                  activations, integer dot products, fused bias/residual/SwiGLU
               mma                as dp4a, but steps of >= 16 tokens on int8 tensor cores
                                  (matmul_mma.cu / gate_up_mma.cu), bit-identical to dp4a; opt-in
                                  until a GPU session has measured it (fast is dp4a)
    attention  simple             attention.cu: a warp per (token, head)
               split              attention_split.cu: split-KV (flash-decoding), GQA-shared loads
               flash              attention_flash.cu: the split frame on f16 tensor cores, 64 (token,
                                  head) rows of one sequence sharing each K/V tile; every step
    rope_kv    simple             qk_norm.cu, rope.cu, kv_cache.cu
               fused              rope_kv.cu: all three in one launch per step

A choice is "simple", "fast" (every op's fastest measured variant), "tensor" (fast with the
tensor-core variants: mma matmuls and flash attention; opt-in until a GPU session has measured
them), a dict {op: variant}, the same as text: "matmul=dp4a,attention=split", or "auto" (the
default): "fast" on a GPU, "simple" on the CPU emulator -- the fast kernels are written for a
GPU's memory system, and the emulator, which runs each thread's C++ on one core, runs the
readable ones faster. Every variant passes every oracle the baseline passes.

Every choice is batch-invariant, prefill and decode included: each op runs one kernel for every
step (mma takes >= 16-token steps but is bit-identical to dp4a), so a token's logits do not depend
on the step it is in -- there is no separate "invariant" mode to pay for.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from sharpinf.errors import SharpinfError

VARIANTS: dict[str, tuple[str, ...]] = {
    "matmul": ("simple", "dp4a", "mma"),
    "attention": ("simple", "split", "flash"),
    "rope_kv": ("simple", "fused"),
}
# the fastest measured: mma (prefill on tensor cores) joins once a GPU session has timed it
FAST = {"matmul": "dp4a", "attention": "split", "rope_kv": "fused"}
TENSOR = {"matmul": "mma", "attention": "flash", "rope_kv": "fused"}  # the tensor-core set
AUTO = "auto"


@dataclass(frozen=True)
class KernelChoice:
    matmul: str = "simple"
    attention: str = "simple"
    rope_kv: str = "simple"

    def __post_init__(self):
        for op, names in VARIANTS.items():
            if getattr(self, op) not in names:
                raise SharpinfError(f"unknown {op} variant {getattr(self, op)!r}: choose {', '.join(names)}")

    @property
    def q8_activations(self) -> bool:
        """The linear layers read q8_1 activations (and the reference rounds them the same way)."""
        return self.matmul in ("dp4a", "mma")

    @property
    def name(self) -> str:
        if self == KernelChoice():
            return "simple"
        if self == KernelChoice(**FAST):
            return "fast"
        if self == KernelChoice(**TENSOR):
            return "tensor"
        return ",".join(f"{k}={v}" for k, v in asdict(self).items())

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def parse(cls, spec: "str | dict | KernelChoice") -> "KernelChoice":
        """A choice by name or per op ("auto" needs a backend: resolve_kernels)."""
        if isinstance(spec, KernelChoice):
            return spec
        if isinstance(spec, dict):
            unknown = set(spec) - set(VARIANTS)
            if unknown:
                raise SharpinfError(f"unknown op(s) {', '.join(sorted(unknown))}: the ops are {', '.join(VARIANTS)}")
            return cls(**spec)
        if not isinstance(spec, str):
            raise SharpinfError(f"kernels must be 'simple', 'fast', 'op=variant,...' or a dict, got {type(spec).__name__}")
        text = spec.strip().lower()
        if text == AUTO:
            raise SharpinfError("kernels 'auto' depends on the backend: resolve it with resolve_kernels")
        if text == "simple":
            return cls()
        if text == "fast":
            return cls(**FAST)
        if text == "tensor":
            return cls(**TENSOR)
        pairs = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            op, sep, name = part.partition("=")
            if not sep:
                raise SharpinfError(f"kernels: {part!r} is not op=variant (or use 'simple' / 'fast' / 'tensor')")
            pairs[op.strip()] = name.strip()
        return cls.parse(pairs)


def unsupported(choice: KernelChoice, cfg) -> dict[str, str]:
    """{op: why} for the variants of `choice` the model's shapes do not fit."""
    from sharpinf.ops.attention import SPLIT_HEAD_DIMS, flash_fits

    why = {}
    if choice.attention == "split" and cfg.head_dim not in SPLIT_HEAD_DIMS:
        why["attention"] = f"split attention is compiled for head_dim {SPLIT_HEAD_DIMS}, the model has {cfg.head_dim}"
    if choice.attention == "flash":
        reason = flash_fits(getattr(cfg, "n_head", 1), getattr(cfg, "n_head_kv", 1), cfg.head_dim)
        if reason:
            why["attention"] = reason
    return why


def _is_auto(spec) -> bool:
    return spec is None or (isinstance(spec, str) and spec.strip().lower() == AUTO)


def check_kernels(spec) -> None:
    """Raise one clear line for a choice that names no op or variant (before anything loads)."""
    if not _is_auto(spec):
        KernelChoice.parse(spec)


def resolve_kernels(spec, cfg, backend=None) -> KernelChoice:
    """The variants that run for a model on a backend. "auto" (or None) is "fast" where the backend
    shapes launches for a GPU, else "simple"; "fast" takes the baseline of an op whose fast variant
    does not fit the model's shapes, with a note; a variant asked for by name must fit."""
    if _is_auto(spec):
        spec = "fast" if getattr(backend, "gpu_shapes", False) else "simple"
    choice = KernelChoice.parse(spec)
    why = unsupported(choice, cfg)
    if not why:
        return choice
    if not (isinstance(spec, str) and spec.strip().lower() in ("fast", "tensor")):
        raise SharpinfError(f"kernels {choice.name}: " + "; ".join(why.values()))
    from sharpinf.progress import note

    for reason in why.values():
        note(f"{reason}: using the simple kernel")
    return KernelChoice(**{**asdict(choice), **{op: VARIANTS[op][0] for op in why}})


def choices_for(spec: str) -> list:
    """`--kernels all`: the baseline, the fast set and the tensor-core set: between them every
    variant of every op; any other spec stands for itself (resolved per backend by resolve_kernels)."""
    if isinstance(spec, str) and spec.strip().lower() == "all":
        return ["simple", "fast", "tensor"]
    check_kernels(spec)
    return [spec]


def describe_variants() -> list[dict]:
    """One row per (op, variant): what `sharpinf bench --suite kernels` and the docs list."""
    return [{"op": op, "variant": v, "baseline": i == 0} for op, names in VARIANTS.items() for i, v in enumerate(names)]


OPS = tuple(f.name for f in fields(KernelChoice))
