"""Kernel variants: for each op family, the readable baseline and the faster kernels beside it,
declared once in a registry that dispatch, `kernels_used`, the CLI and the tests all read.

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

A Variant names its op, its kernel files and its launcher (the op's step-level call, one signature
per op: see StepKernels in step_kernels.py), and says what it serves (`fits`). An entry without a
launcher fails when it is registered; a choice naming a variant that is not registered fails when
it is parsed; and a ForwardPass whose step launches none of a chosen variant's own kernels fails
at construction (`check_dispatched`), so a variant can never run the baseline under its own name.

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
from typing import Any, Callable

from sharpinf.errors import SharpinfError
from sharpinf.ops import attention as attn_ops
from sharpinf.ops import matmul_mma as mma_ops
from sharpinf.ops import rope as rope_ops
from sharpinf.ops.matmul import matmul
from sharpinf.ops.matmul_dp4a import gate_up_dp4a, matmul_dp4a


@dataclass(frozen=True)
class Variant:
    """One kernel variant of an op, as every part of sharpinf sees it.

    files: the kernels_cu/ sources that are this variant's own (a step with it chosen launches at
    least one of them); launch: the op's launcher (matmul: Y = X W^T; attention: the varlen paged
    attention call; rope_kv: QK-norm + RoPE + the KV append); fits(cfg, model) -> why it cannot
    serve a model, or None (model may be None: shapes only)."""

    op: str
    name: str
    files: tuple[str, ...]
    launch: Callable[..., Any]
    summary: str
    fits: Callable[[Any, Any], str | None] | None = None
    q8_activations: bool = False  # matmul: the linear layers read q8_1 activations
    gate_up: Callable[..., Any] | None = None  # matmul: gate, up and the activation in one launcher
    writes_q8: bool = False  # attention: writes the q8_1 copy of its output for the o-projection
    needs_scratch: bool = False  # attention: the split frame's partial states and merge tickets

    def __post_init__(self):
        if self.op not in OP_NAMES:
            raise SharpinfError(f"variant {self.name!r}: unknown op {self.op!r}; the ops are {', '.join(OP_NAMES)}")
        if not callable(self.launch):
            raise SharpinfError(f"variant {self.op}={self.name}: no launcher (launch must be the op's launch function)")
        if not self.files or not all(isinstance(f, str) and f for f in self.files):
            raise SharpinfError(f"variant {self.op}={self.name}: files must name its kernels_cu/ sources")

    def why_not(self, cfg, model=None) -> str | None:
        return self.fits(cfg, model) if self.fits else None

    @property
    def label(self) -> str:
        return f"{self.op}={self.name}"


OP_NAMES = ("matmul", "attention", "rope_kv")
REGISTRY: dict[str, dict[str, Variant]] = {op: {} for op in OP_NAMES}  # the first of each op is its baseline


def register(v: Variant) -> Variant:
    """Add a variant (sharpinf's own below; a researcher's the same way). Names are unique per op."""
    if v.name in REGISTRY[v.op]:
        raise SharpinfError(f"variant {v.label} is already registered")
    REGISTRY[v.op][v.name] = v
    return v


def unregister(op: str, name: str) -> None:
    """Remove a registered variant (tests register throwaway ones)."""
    if name == baseline(op).name:
        raise SharpinfError(f"the baseline {op}={name} cannot be removed")
    REGISTRY[op].pop(name, None)


def baseline(op: str) -> Variant:
    return next(iter(REGISTRY[op].values()))


def variant(op: str, name: str) -> Variant:
    try:
        return REGISTRY[op][name]
    except KeyError:
        raise SharpinfError(f"unknown {op} variant {name!r}: choose {', '.join(REGISTRY[op])}") from None


# -- what each variant serves -------------------------------------------------------------------
def _split_fits(cfg, model=None) -> str | None:
    if cfg.head_dim not in attn_ops.SPLIT_HEAD_DIMS:
        return f"split attention is compiled for head_dim {attn_ops.SPLIT_HEAD_DIMS}, the model has {cfg.head_dim}"
    return None


def _flash_fits(cfg, model=None) -> str | None:
    return attn_ops.flash_fits(getattr(cfg, "n_head", 1), getattr(cfg, "n_head_kv", 1), cfg.head_dim)


def _mma_fits(cfg, model=None) -> str | None:
    if model is None:
        return None
    types = {t.qtype for t in model.tensors.values() if len(t.shape) == 2}
    if not any(mma_ops.supports(q) for q in types):
        return "mma matmuls serve the quantized weight types, the model's matrices are all float"
    return None


# -- sharpinf's variants --------------------------------------------------------------------------
register(Variant("matmul", "simple", ("matmul.cu",), matmul,
                 "float activations, a weight chunk decoded to floats, 32 lanes a row"))
register(Variant("matmul", "dp4a", ("rmsnorm_q8_1.cu", "matmul_dp4a.cu", "gate_up_dp4a.cu"), matmul_dp4a,
                 "q8_1 activations (fused into the norm), __dp4a integer dot products, fused bias/residual/SwiGLU",
                 q8_activations=True, gate_up=gate_up_dp4a))
register(Variant("matmul", "mma", ("matmul_mma.cu", "gate_up_mma.cu"), mma_ops.matmul_mma_steps,
                 "as dp4a, steps of >= 16 tokens on int8 tensor cores (mma.m16n8k32), bit-identical to dp4a",
                 fits=_mma_fits, q8_activations=True, gate_up=mma_ops.gate_up_mma_steps))
register(Variant("attention", "simple", ("attention.cu",), attn_ops.attention, "a warp per (token, head)"))
register(Variant("attention", "split", ("attention_split.cu",), attn_ops.attention_split,
                 "split-KV (flash-decoding): 64-key partitions at fixed positions, 16 splits, fixed-order merge",
                 fits=_split_fits, writes_q8=True, needs_scratch=True))
register(Variant("attention", "flash", ("attention_flash.cu",), attn_ops.attention_flash,
                 "the split frame on f16 tensor cores (mma.m16n8k16): 64 (token, head) rows share each K/V tile",
                 fits=_flash_fits, writes_q8=True, needs_scratch=True))
register(Variant("rope_kv", "simple", ("qk_norm.cu", "rope.cu", "kv_cache.cu"), rope_ops.rope_kv_separate,
                 "QK-norm, RoPE and the KV append as three kernels"))
register(Variant("rope_kv", "fused", ("rope_kv.cu",), rope_ops.rope_kv, "QK-norm, RoPE and the KV append in one launch"))

# The named sets. fast: the fastest measured (mma joins once a GPU session has timed it).
SETS: dict[str, dict[str, str]] = {
    "simple": {"matmul": "simple", "attention": "simple", "rope_kv": "simple"},  # the baselines
    "fast": {"matmul": "dp4a", "attention": "split", "rope_kv": "fused"},
    "tensor": {"matmul": "mma", "attention": "flash", "rope_kv": "fused"},  # the tensor-core set
}
FAST, TENSOR = SETS["fast"], SETS["tensor"]
AUTO = "auto"


def variants_of(op: str) -> tuple[str, ...]:
    return tuple(REGISTRY[op])


def variant_names() -> dict[str, tuple[str, ...]]:
    """{op: registered variant names, baseline first}, as the registry holds them now."""
    return {op: variants_of(op) for op in OP_NAMES}


@dataclass(frozen=True)
class KernelChoice:
    matmul: str = "simple"
    attention: str = "simple"
    rope_kv: str = "simple"

    def __post_init__(self):
        for op in OP_NAMES:
            variant(op, getattr(self, op))  # one clear line for a name nobody registered

    def of(self, op: str) -> Variant:
        """The registered variant this choice runs for `op` (what StepKernels dispatches to)."""
        return variant(op, getattr(self, op))

    @property
    def q8_activations(self) -> bool:
        """The linear layers read q8_1 activations (and the reference rounds them the same way)."""
        return self.of("matmul").q8_activations

    @property
    def name(self) -> str:
        for set_name, ops in SETS.items():
            if asdict(self) == ops:
                return set_name
        return ",".join(f"{k}={v}" for k, v in asdict(self).items())

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def parse(cls, spec: "str | dict | KernelChoice") -> "KernelChoice":
        """A choice by name or per op ("auto" needs a backend: resolve_kernels)."""
        if isinstance(spec, KernelChoice):
            return spec
        if isinstance(spec, dict):
            unknown = set(spec) - set(OP_NAMES)
            if unknown:
                raise SharpinfError(f"unknown op(s) {', '.join(sorted(unknown))}: the ops are {', '.join(OP_NAMES)}")
            return cls(**spec)
        if not isinstance(spec, str):
            raise SharpinfError(f"kernels must be 'simple', 'fast', 'op=variant,...' or a dict, got {type(spec).__name__}")
        text = spec.strip().lower()
        if text == AUTO:
            raise SharpinfError("kernels 'auto' depends on the backend: resolve it with resolve_kernels")
        if text in SETS:
            return cls(**SETS[text])
        pairs = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            op, sep, name = part.partition("=")
            if not sep:
                raise SharpinfError(f"kernels: {part!r} is not op=variant (or use {' / '.join(repr(s) for s in SETS)})")
            pairs[op.strip()] = name.strip()
        return cls.parse(pairs)


def unsupported(choice: KernelChoice, cfg, model=None) -> dict[str, str]:
    """{op: why} for the variants of `choice` the model's shapes (and weight types) do not fit."""
    why = {}
    for op in OP_NAMES:
        reason = choice.of(op).why_not(cfg, model)
        if reason:
            why[op] = reason
    return why


def _is_auto(spec) -> bool:
    return spec is None or (isinstance(spec, str) and spec.strip().lower() == AUTO)


def check_kernels(spec) -> None:
    """Raise one clear line for a choice that names no op or variant (before anything loads)."""
    if not _is_auto(spec) and not (isinstance(spec, str) and spec.strip().lower() == "all"):
        KernelChoice.parse(spec)


def resolve_kernels(spec, cfg, backend=None, model=None) -> KernelChoice:
    """The variants that run for a model on a backend. "auto" (or None) is "fast" where the backend
    shapes launches for a GPU, else "simple"; a named set ("fast", "tensor") takes the baseline of an
    op whose variant does not fit the model, with a note; a variant asked for by name must fit."""
    if _is_auto(spec):
        spec = "fast" if getattr(backend, "gpu_shapes", False) else "simple"
    choice = KernelChoice.parse(spec)
    why = unsupported(choice, cfg, model)
    if not why:
        return choice
    if not (isinstance(spec, str) and spec.strip().lower() in SETS):
        raise SharpinfError(f"kernels {choice.name}: " + "; ".join(why.values()))
    from sharpinf.progress import note

    for reason in why.values():
        note(f"{reason}: using the simple kernel")
    return KernelChoice(**{**asdict(choice), **{op: baseline(op).name for op in why}})


def check_dispatched(choice: KernelChoice, launched_files) -> None:
    """Every chosen variant other than a baseline launched one of its own kernels in a step's
    launches (the files the dry run collected), else one line: it would run another variant's
    kernels under its name."""
    launched = set(launched_files)
    for op in OP_NAMES:
        v = choice.of(op)
        if v is baseline(op) or launched & set(v.files):
            continue
        raise SharpinfError(f"kernels {choice.name}: {v.label} launched none of its own kernels "
                            f"({', '.join(v.files)}); its launcher dispatches other kernels "
                            f"({', '.join(sorted(launched)) or 'none'})")


def choices_for(spec: str) -> list:
    """`--kernels all`: the baseline, the named sets, and a choice for each registered variant no set
    holds (over the baselines): between them every variant of every op. Any other spec stands for
    itself (resolved per backend by resolve_kernels)."""
    if isinstance(spec, str) and spec.strip().lower() == "all":
        out: list = list(SETS)
        covered = {(op, name) for ops in SETS.values() for op, name in ops.items()}
        for op in OP_NAMES:
            out += [f"{op}={name}" for name in REGISTRY[op] if (op, name) not in covered]
        return out
    check_kernels(spec)
    return [spec]


def describe_variants() -> list[dict]:
    """One row per registered (op, variant): what `sharpinf kernels list`, the bench and the docs show."""
    rows = []
    for op in OP_NAMES:
        for i, v in enumerate(REGISTRY[op].values()):
            rows.append({"op": op, "variant": v.name, "baseline": i == 0, "files": list(v.files), "summary": v.summary,
                         "sets": [s for s, ops in SETS.items() if ops.get(op) == v.name]})
    return rows


OPS = tuple(f.name for f in fields(KernelChoice))
