"""One kernel variant as the registry declares it (Variant), the table of them all (REGISTRY, SETS),
and the rules between them (requirements, bit-identity). variants.toml is read into this table by
ops/registry_file.py; ops/variants.py builds choices over it. A leaf: it imports no launcher."""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable

from sharpinf.errors import SharpinfError

OP_NAMES = ("matmul", "ffn", "link", "attention", "rope_kv", "moe", "sample")
STRATEGY_OPS = ("ffn", "link")  # launch strategies: a variant without files or launcher runs the separate launches
ACTIVATIONS = ("f32", "q8_1")  # what a matmul (or moe) variant's linear layers read (the Reference's act_quant words)
ROUNDINGS = ("f32", "f16_operands")  # how a variant multiplies beyond its activations (oracles/tolerances.py's bounds)
MODEL_OPS = {"moe": lambda cfg: getattr(cfg, "is_moe", False),  # ops only some models run (the others: all)
             "ffn": lambda cfg: not getattr(cfg, "is_moe", False)}
REGISTRY_FILE = Path(__file__).with_name("variants.toml")
AUTO = "auto"


def ops_of(cfg) -> tuple[str, ...]:
    """The ops a model's step runs: a dense model has no moe, an MoE model no dense ffn."""
    return tuple(op for op in OP_NAMES if op not in MODEL_OPS or MODEL_OPS[op](cfg))


def registry_file() -> Path:
    """The registry: sharpinf/ops/variants.toml, or $SHARPINF_VARIANTS (a copy to experiment in)."""
    env = os.environ.get("SHARPINF_VARIANTS")
    return Path(env).expanduser() if env else REGISTRY_FILE


@dataclass(frozen=True)
class Requirement:
    """What a variant needs of the rest of a choice: "OP=NAME" (that op runs that variant) or
    "OP.KEY=VALUE" (that op's variant declares KEY = VALUE, e.g. matmul.activations=q8_1)."""

    op: str
    key: str  # "name", or a Variant field
    value: str

    @classmethod
    def parse(cls, text: str) -> "Requirement":
        lhs, sep, value = str(text).partition("=")
        op, dot, key = lhs.strip().partition(".")
        if not sep or not value.strip() or op not in OP_NAMES or (dot and key not in _FIELDS):
            raise SharpinfError(f"requirement {text!r}: write OP=NAME or OP.KEY=VALUE (ops {', '.join(OP_NAMES)})")
        return cls(op, key if dot else "name", value.strip())

    def met(self, v: "Variant") -> bool:
        value = getattr(v, self.key)
        return (str(value).lower() if isinstance(value, bool) else str(value)) == self.value

    def __str__(self) -> str:
        return f"{self.op}={self.value}" if self.key == "name" else f"{self.op}.{self.key}={self.value}"


@dataclass(frozen=True)
class Variant:
    """One kernel variant of an op, as every part of sharpinf sees it (one [[variant]] of the registry;
    variants.toml's header says what each key means)."""

    op: str
    name: str
    files: tuple[str, ...]
    launcher: Callable[..., Any] | None
    summary: str
    fits: Callable[[Any, Any], str | None] | None = None
    activations: str | None = None  # matmul, moe: what its linear layers read, "f32" or "q8_1"
    norm: Callable[..., Any] | None = None  # matmul, moe: the rmsnorm launcher that writes those activations
    gate_up: Callable[..., Any] | None = None  # matmul: gate, up and the activation in one launcher
    min_tokens: int = 1  # serves steps of at least this many tokens (the launcher falls back below)
    max_tokens: int | None = None  # serves steps of at most this many (the launcher falls back above)
    qtypes: Callable[[int], bool] | None = None  # matmul: the weight types it serves (None: all)
    shape: Callable[..., str] | None = None  # attention: the launch shape ("split", "walk") it takes for a step
    writes_q8: bool = False  # attention: writes the q8_1 copy of its output for the o-projection
    scratch: tuple[Callable[..., dict], ...] = ()  # (be, cfg, cap) -> {name: buffer}: the Workspace's ws.<name>
    rounding: str = "f32"  # one of ROUNDINGS: the oracles' tolerance for it
    requires: tuple[Requirement, ...] = ()
    bits: str | None = None  # the variant of the op whose results this one's equal bit for bit (None: its own)
    like: str | None = None  # the variant whose keys it shares (a copy made by `kernels new`)

    def __post_init__(self):
        where = f"variant {self.op}={self.name}"
        if self.op not in OP_NAMES:
            raise SharpinfError(f"variant {self.name!r}: unknown op {self.op!r}; the ops are {', '.join(OP_NAMES)}")
        if not all(isinstance(f, str) and f for f in self.files):
            raise SharpinfError(f"{where}: files must name its kernels_cu/ sources")
        if self.separate:  # a strategy's "run the separate launches": nothing of its own
            if self.files or self.op not in STRATEGY_OPS:
                raise SharpinfError(f"{where}: no launcher (launch must be the op's launch function)")
        elif not self.files:
            raise SharpinfError(f"{where}: files must name its kernels_cu/ sources")
        elif not callable(self.launcher):
            raise SharpinfError(f"{where}: no launcher (launch must be the op's launch function)")
        elif "file" not in inspect.signature(self.launcher).parameters:
            raise SharpinfError(f"{where}: its launcher {self.launcher.__name__} takes no file= argument, so it "
                                "cannot run this variant's own file")
        if self.rounding not in ROUNDINGS:
            raise SharpinfError(f"{where}: rounding {self.rounding!r}; choose {', '.join(ROUNDINGS)}")
        if self.op not in ("matmul", "moe"):
            if self.activations or self.norm or self.gate_up:
                raise SharpinfError(f"{where}: activations, norm and gate_up are a matmul (or moe) variant's")
        elif self.activations not in ACTIVATIONS or not callable(self.norm):
            raise SharpinfError(f"{where}: a {self.op} variant declares its activations "
                                f"({' or '.join(ACTIVATIONS)}) and the norm that writes them")
        elif self.op == "moe" and self.gate_up:
            raise SharpinfError(f"{where}: gate_up is a matmul variant's")

    @property
    def separate(self) -> bool:
        """A strategy op's variant of no launcher: the other ops' separate launches run."""
        return self.launcher is None

    def launch(self, *args, **kw):
        """Run the launcher on this variant's own file (a strategy's `separate`: declines, False)."""
        return False if self.separate else self.launcher(*args, file=self.files[0], **kw)

    def why_not(self, cfg, model=None) -> str | None:
        return self.fits(cfg, model) if self.fits else None

    def serves(self, qtype: int | None = None, n_tokens: int | None = None) -> bool:
        """Whether it runs (rather than falls back) for weights of qtype in a step of n_tokens."""
        in_range = n_tokens is None or (n_tokens >= self.min_tokens
                                        and (self.max_tokens is None or n_tokens <= self.max_tokens))
        return in_range and (qtype is None or self.qtypes is None or self.qtypes(qtype))

    @property
    def label(self) -> str:
        return f"{self.op}={self.name}"


_FIELDS = {f.name for f in fields(Variant)}
REGISTRY: dict[str, dict[str, Variant]] = {op: {} for op in OP_NAMES}  # the first of each op is its baseline
SETS: dict[str, dict[str, str]] = {}  # {set: {op: variant}}, every op (the registry's [set.NAME], baselines filled)


def register(v: Variant) -> Variant:
    """Add a variant (the registry file's, at import; a test's throwaway one). Names are unique per op."""
    if v.name in REGISTRY[v.op]:
        raise SharpinfError(f"variant {v.label} is already registered")
    if v.name in SETS:
        raise SharpinfError(f"variant {v.label}: {v.name!r} names a kernel set; choose another name")
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
    if op not in REGISTRY:
        raise SharpinfError(f"unknown op {op!r}: the ops are {', '.join(OP_NAMES)}")
    try:
        return REGISTRY[op][name]
    except KeyError:
        raise SharpinfError(f"unknown {op} variant {name!r}: choose {', '.join(REGISTRY[op])}") from None


def variants_of(op: str) -> tuple[str, ...]:
    """The op's registered variant names, baseline first, as the registry holds them now."""
    return tuple(REGISTRY[op])


def variant_names() -> dict[str, tuple[str, ...]]:
    return {op: variants_of(op) for op in OP_NAMES}


def bits_of(v: Variant) -> str:
    """The variant whose bits v's are (following `bits` to one that names none)."""
    seen = set()
    while v.bits and v.name not in seen:
        seen.add(v.name)
        v = variant(v.op, v.bits)
    return v.name


def broken(ops: dict[str, str]) -> list[str]:
    """The requirements a choice {op: variant} (every op) breaks, one line each."""
    out = []
    for op in OP_NAMES:
        v = variant(op, ops[op])
        out += [f"{v.label} requires {r} (the choice has {r.op}={ops[r.op]})" for r in v.requires
                if not r.met(variant(r.op, ops[r.op]))]
    return out


def with_requirements(op: str, name: str) -> dict[str, str]:
    """{op: name} and what its requirements need of the other ops (each the first registered variant
    that meets them), over the baselines: `--kernels all`'s choice for one variant."""
    ops = {o: baseline(o).name for o in OP_NAMES} | {op: name}
    fixed = {op}
    for _ in range(len(OP_NAMES)):  # each pass fixes at least one op, or none is left to fix
        unmet = [r for o in OP_NAMES for r in variant(o, ops[o]).requires if not r.met(variant(r.op, ops[r.op]))]
        if not unmet:
            return {o: n for o, n in ops.items() if o == op or n != baseline(o).name}
        r = unmet[0]
        pick = next((v for v in REGISTRY[r.op].values() if r.met(v)), None)
        if pick is None or r.op in fixed:
            break
        ops[r.op] = pick.name
        fixed.add(r.op)
    raise SharpinfError(f"{op}={name}: no choice meets its requirements ({'; '.join(broken(ops))})")
