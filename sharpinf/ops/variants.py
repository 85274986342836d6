"""Kernel variants: for each op, the readable baseline and the faster kernels beside it, declared
once in the registry, variants.toml -- files, launchers, scratch, rounding, requirements, token
ranges, and the named sets (`sharpinf kernels list` prints them; the docs' tables are generated).

A Variant is one [[variant]] entry, and everything reads it: dispatch (StepKernels calls the chosen
Variant's launchers, never a name test), the Workspace (its scratch), the oracles (its rounding and
activations), kernels_used, `--kernels all`, the CLI, the kernels bench, the kernel tests and the
ptxas report. A bad entry fails at import in one line (ops/registry_file.py); a choice naming an
unregistered variant, or breaking a requirement, fails when it is made; a ForwardPass whose step
launches none of a chosen variant's own kernels fails at construction (`check_dispatched`), so a
variant never runs another's kernels under its name. `sharpinf kernels new OP NAME` adds one
(docs/adding-a-variant.md).

A choice is a named set ("simple": the baselines; "fast", "tensor", "tuned": variants.toml says why),
a dict {op: variant}, the same as text ("matmul=dp4a,attention=split"), or "auto" (the default): fast
on a GPU, simple on the CPU emulator (which runs the readable kernels faster). Every variant passes
every oracle the baseline passes, and every choice is batch-invariant: a variant that picks a kernel
by the step's size picks among bit-identical ones (its `bits`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from sharpinf.errors import SharpinfError
from sharpinf.ops.variant import (  # noqa: F401 (the registry's model, re-exported: one place to import from)
    ACTIVATIONS, AUTO, MODEL_OPS, OP_NAMES, REGISTRY, REGISTRY_FILE,
    ROUNDINGS, Requirement, SETS, STRATEGY_OPS, Variant, _FIELDS,
    baseline, bits_of, broken, ops_of, register, registry_file,
    unregister, variant, variant_names, variants_of, with_requirements)
from sharpinf.ops.registry_file import load_registry


@dataclass(frozen=True)
class KernelChoice:
    """The variant each op runs (None: the op's baseline); breaking a variant's requirement is one line."""

    matmul: str | None = None
    ffn: str | None = None
    link: str | None = None
    attention: str | None = None
    rope_kv: str | None = None
    moe: str | None = None
    sample: str | None = None

    def __post_init__(self):
        for op in OP_NAMES:
            if getattr(self, op) is None:
                object.__setattr__(self, op, baseline(op).name)
            variant(op, getattr(self, op))  # one clear line for a name nobody registered
        why = broken(asdict(self))
        if why:
            raise SharpinfError(f"kernels {self.name}: {why[0]}")

    def of(self, op: str) -> Variant:
        """The registered variant this choice runs for `op` (what StepKernels dispatches to)."""
        return variant(op, getattr(self, op))

    @property
    def q8_activations(self) -> bool:
        """The linear layers read q8_1 activations (the matmul variant declares it; the reference then
        rounds them the same way). The one test of it: StepKernels, the workspace and trace ask here."""
        return self.of("matmul").activations == "q8_1"

    def same_bits(self, other: "KernelChoice") -> bool:
        """Whether the two give the same results bit for bit (every op's variants declare the same bits)."""
        return all(bits_of(self.of(op)) == bits_of(other.of(op)) for op in OP_NAMES)

    @property
    def name(self) -> str:
        """The set it is, else its non-baseline ops as `op=variant,...` (which parses back to it)."""
        ops = asdict(self)
        for set_name, set_ops in SETS.items():
            if ops == set_ops:
                return set_name
        return ",".join(f"{k}={v}" for k, v in ops.items() if v != baseline(k).name) or ",".join(
            f"{k}={v}" for k, v in ops.items())

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
            raise SharpinfError(f"kernels must be a set name, 'op=variant,...' or a dict, got {type(spec).__name__}")
        text = spec.strip().lower()
        if text == AUTO:
            raise SharpinfError("kernels 'auto' depends on the backend: resolve it with resolve_kernels")
        if text in SETS:
            return cls(**SETS[text])
        pairs = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            op, sep, name = part.partition("=")
            if not sep:
                raise SharpinfError(f"kernels: {part!r} is not op=variant (or a set: {', '.join(SETS)})")
            pairs[op.strip()] = name.strip()
        return cls.parse(pairs)


def unsupported(choice: KernelChoice, cfg, model=None) -> dict[str, str]:
    """{op: why} for the variants of `choice` the model's shapes (and weight types) do not fit."""
    return {op: why for op in OP_NAMES if (why := choice.of(op).why_not(cfg, model))}


def _is_auto(spec) -> bool:
    return spec is None or (isinstance(spec, str) and spec.strip().lower() == AUTO)


def check_kernels(spec) -> None:
    """One clear line, before anything loads, for a choice naming no op or variant or breaking a requirement."""
    if not _is_auto(spec) and not (isinstance(spec, str) and spec.strip().lower() == "all"):
        KernelChoice.parse(spec)


def resolve_kernels(spec, cfg, backend=None, model=None) -> KernelChoice:
    """The variants that run for a model on a backend. "auto" (or None) is "fast" where the backend
    shapes launches for a GPU, else "simple"; a named set takes the baseline of an op whose variant does
    not fit the model (and of one whose requirement that leaves unmet), with a note; a variant asked
    for by name must fit."""
    if _is_auto(spec):
        spec = "fast" if getattr(backend, "gpu_shapes", False) else "simple"
    set_name = spec.strip().lower() if isinstance(spec, str) and spec.strip().lower() in SETS else None
    if set_name is None:
        choice = KernelChoice.parse(spec)
        why = unsupported(choice, cfg, model)
        if why:
            raise SharpinfError(f"kernels {choice.name}: " + "; ".join(why.values()))
        return choice
    from sharpinf.progress import note

    ops = dict(SETS[set_name])
    for _ in range(len(OP_NAMES)):  # a fallback can leave another op's requirement unmet: until none does
        why = {op: v.why_not(cfg, model) or next((f"it requires {r}" for r in v.requires
                                                  if not r.met(variant(r.op, ops[r.op]))), None)
               for op in OP_NAMES if (v := variant(op, ops[op])) is not baseline(op)}
        why = {op: w for op, w in why.items() if w}
        if not why:
            break
        for op, reason in why.items():
            note(f"{reason}: using the baseline {op}={baseline(op).name}")
            ops[op] = baseline(op).name
    return KernelChoice(**ops)


def check_dispatched(choice: KernelChoice, launched_files, ops: tuple[str, ...] = OP_NAMES) -> None:
    """Every chosen variant other than a baseline launched one of its own kernels in a step's
    launches (the files the dry run collected), else one line: it would run another variant's
    kernels under its name. ops: those the model runs (ops_of(cfg): a dense model runs no moe)."""
    from sharpinf.runtime.paths import kernels_dir

    launched = set(launched_files)
    for op in ops:
        v = choice.of(op)
        missing = [f for f in v.files if not (kernels_dir() / f).is_file()]
        if missing:
            raise SharpinfError(f"kernels {choice.name}: {v.label}: its kernel file {missing[0]} is not in "
                                f"{kernels_dir()} (sharpinf kernels new makes it)")
        if v is baseline(op) or v.separate or launched & set(v.files):
            continue
        raise SharpinfError(f"kernels {choice.name}: {v.label} launched none of its own kernels "
                            f"({', '.join(v.files)}); its launcher dispatches other kernels "
                            f"({', '.join(sorted(launched)) or 'none'})")


def choices_for(spec: str, cfg=None, model=None) -> list:
    """`--kernels all`: the sets, and a choice for each variant no set holds (over the baselines, with what
    it requires): every variant of every op -- given a model, of the ops it runs, those that fit it (a note
    says which did not). Any other spec stands for itself (resolved per backend by resolve_kernels)."""
    if not (isinstance(spec, str) and spec.strip().lower() == "all"):
        check_kernels(spec)
        return [spec]
    from sharpinf.progress import note

    out: list = list(SETS)
    covered = {(op, name) for ops in SETS.values() for op, name in ops.items()}
    for op in OP_NAMES if cfg is None else ops_of(cfg):
        for name in REGISTRY[op]:
            if (op, name) in covered:
                continue
            ops = with_requirements(op, name)
            why = unsupported(KernelChoice(**ops), cfg, model) if cfg is not None else {}
            if why:
                note(f"--kernels all: {op}={name} left out: {'; '.join(why.values())}")
                continue
            out.append(",".join(f"{o}={n}" for o, n in ops.items()))
    return out


load_registry()
FAST, TENSOR = SETS["fast"], SETS["tensor"]
