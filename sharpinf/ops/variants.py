"""Kernel variants: for each op family, the readable baseline and the faster kernels beside it,
declared once in the registry, variants.toml (`sharpinf kernels list` prints it):

    op         variants           kernels
    matmul     simple             matmul.cu (+ elementwise.cu for the residual and SwiGLU)
               dp4a               rmsnorm_q8_1.cu -> matmul_dp4a.cu / gate_up_dp4a.cu: q8_1
                                  activations, integer dot products, fused bias/residual/SwiGLU
               mma                as dp4a, but steps of >= 16 tokens on int8 tensor cores
                                  (matmul_mma.cu / gate_up_mma.cu), bit-identical to dp4a
               mmq                as mma, 64 rows x 64 tokens a block (matmul_mmq.cu /
                                  gate_up_mmq.cu): each weight chunk unpacked once per 64 tokens
               mmq_narrow         as mmq, 16 rows x 64 tokens a block (matmul_mmq_narrow.cu /
                                  gate_up_mmq_narrow.cu): 4x the blocks, for grids too small to
                                  fill the GPU (decode of 16-64 sequences)
               best               dp4a or mmq for each launch: mmq from 64 tokens where its grid
                                  holds a block an SM (what an H200 measured faster), the same bits
               gemv               as dp4a, but steps of <= 8 tokens with the token count compiled
                                  in, a lane's weight chunks fetched in batches a batch ahead and a
                                  warp's rows one stream (matmul_gemv.cu / gate_up_gemv.cu): decode
                                  at the bandwidth limit, bit-identical
               ffn                as dp4a, and a dense FFN of <= 8 tokens (gate+up, q8_1, down +
                                  residual) as one cooperative launch with two grid barriers
                                  (ffn_dp4a.cu): the megakernel pattern, bit-identical
               layer              as ffn, and a decode step's work between two attentions (o-proj,
                                  norm, FFN, the next norm, QKV, RoPE/KV append) as one cooperative
                                  launch (layer_dp4a.cu): two launches a layer, bit-identical
    attention  simple             attention.cu: a warp per (token, head)
               split              attention_split.cu: split-KV (flash-decoding), GQA-shared loads;
                                  can walk every split in one block (the same bits)
               flash              attention_flash.cu: the split frame on f16 tensor cores, 64 (token,
                                  head) rows of one sequence sharing each K/V tile; every step
                                  (and can walk, as split)
    rope_kv    simple             rope.cu, qk_norm.cu, kv_cache.cu
               fused              rope_kv.cu: all three in one launch per step
    moe        simple             moe_route.cu, moe_ffn.cu: router, a warp per (token, expert) pair
                                  and row, rank-order combine (MoE models only)
               fast               moe_dp4a.cu: q8_1, pairs sorted by expert, dp4a over each expert's
                                  tiles of 8 pairs; the router spread over blocks (moe_route_split.cu)
               mmq                moe_mmq.cu: as fast, steps of >= 16 tokens in tiles of 64 pairs on
                                  int8 tensor cores (mmq_rows.cuh), bit-identical to fast
    sample     simple             sampling.cu: one block a row (the head's sampling)
               radix              sampling_radix.cu: each row over blocks of 4096 ids, radix-select
                                  cuts, integer masses: the same token, bit for bit

A Variant names its op, its kernel files and its launcher (the op's launch function, which it runs
on its own first file), and says what it serves (`fits`, `min_tokens`, `max_tokens`, `qtypes`). A matmul variant
also declares what it brings with it: the activations its linear layers read (f32 or q8_1), the norm
that writes them, and a fused gate+up launcher if it has one; StepKernels reads them, never guesses.
Everything reads the registry: dispatch (StepKernels calls the chosen Variant's launcher),
kernels_used (a dry run of that dispatch), `--kernels all`, the CLI help, the kernels bench, the
kernel tests' parameters and the ptxas report. An entry whose launcher is missing, names no function or cannot take its file
fails at import in one line; a choice naming an unregistered variant fails when it is parsed; and
a ForwardPass whose step launches none of a chosen variant's own kernels fails at construction
(`check_dispatched`), so a variant can never run another's kernels under its own name.
`sharpinf kernels new OP NAME` adds one: a copy of a registered variant's file and one entry
(`like = ...`) -- docs/adding-a-variant.md walks the loop.

A choice is "simple", "fast" (every op's fastest measured variant: matmul best, split attention),
"tensor" (mmq for every step of >= 16 tokens and flash attention: the tensor cores wherever they
can serve; flash was faster only for long prefills on an H200), "tuned" (fast, with each linear layer
on whichever of dp4a, gemv, mmq and mmq_narrow the GPU times fastest for its shape: the same bits),
a dict {op: variant}, the same as text: "matmul=dp4a,attention=split", or "auto" (the
default): "fast" on a GPU, "simple" on the CPU emulator -- the fast kernels are written for a
GPU's memory system, and the emulator, which runs each thread's C++ on one core, runs the
readable ones faster. Every variant passes every oracle the baseline passes.

Every choice is batch-invariant, prefill and decode included: each op runs one kernel for every
step (mma, mmq and best pick a kernel by the step's size, but every one is bit-identical to dp4a), so a token's logits do not depend
on the step it is in -- there is no separate "invariant" mode to pay for.
"""

from __future__ import annotations

import importlib
import inspect
import os
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from sharpinf.errors import SharpinfError
from sharpinf.ops import attention as attn_ops
from sharpinf.ops import matmul_mma as mma_ops

OP_NAMES = ("matmul", "attention", "rope_kv", "moe", "sample")
ACTIVATIONS = ("f32", "q8_1")  # what a matmul variant's linear layers read (the Reference's act_quant words)
MODEL_OPS = {"moe": lambda cfg: getattr(cfg, "is_moe", False)}  # ops only some models run (the others: all)


def ops_of(cfg) -> tuple[str, ...]:
    """The ops a model's step runs: a dense model has no moe."""
    return tuple(op for op in OP_NAMES if op not in MODEL_OPS or MODEL_OPS[op](cfg))
REGISTRY_FILE = Path(__file__).with_name("variants.toml")


def registry_file() -> Path:
    """The registry: sharpinf/ops/variants.toml, or $SHARPINF_VARIANTS (a copy to experiment in)."""
    env = os.environ.get("SHARPINF_VARIANTS")
    return Path(env).expanduser() if env else REGISTRY_FILE


@dataclass(frozen=True)
class Variant:
    """One kernel variant of an op, as every part of sharpinf sees it (one [[variant]] of the registry).

    files: the kernels_cu/ sources that are this variant's own (a step with it chosen launches at
    least one of them; the launcher is given the first); launcher: the op's launch function;
    fits(cfg, model) -> why it cannot serve a model, or None (model may be None: shapes only).
    A matmul variant brings its activations, its norm and its gate+up with it (and only a matmul one);
    a moe variant its activations and the norm that writes them (an MoE layer's FFN norm feeds only it)."""

    op: str
    name: str
    files: tuple[str, ...]
    launcher: Callable[..., Any]
    summary: str
    fits: Callable[[Any, Any], str | None] | None = None
    activations: str | None = None  # matmul: what its linear layers read, "f32" or "q8_1"
    norm: Callable[..., Any] | None = None  # matmul: the rmsnorm launcher that writes those activations
    gate_up: Callable[..., Any] | None = None  # matmul: gate, up and the activation in one launcher
    ffn: Callable[..., Any] | None = None  # matmul: the whole dense FFN in one launcher (False: not served)
    link: Callable[..., Any] | None = None  # matmul: a step's work between two attentions in one (False: not served)
    min_tokens: int = 1  # serves steps of at least this many tokens (the launcher falls back below)
    max_tokens: int | None = None  # serves steps of at most this many (the launcher falls back above)
    qtypes: Callable[[int], bool] | None = None  # matmul: the weight types it serves (None: all)
    shape: Callable[..., str] | None = None  # attention: the launch shape ("split", "walk") it takes for a step
    writes_q8: bool = False  # attention: writes the q8_1 copy of its output for the o-projection
    needs_scratch: bool = False  # attention: the split frame's partial states; sample: per-row accumulators; matmul, moe: mmq split-K
    like: str | None = None  # the variant whose launcher it shares (a copy made by `kernels new`)

    def __post_init__(self):
        if self.op not in OP_NAMES:
            raise SharpinfError(f"variant {self.name!r}: unknown op {self.op!r}; the ops are {', '.join(OP_NAMES)}")
        if not callable(self.launcher):
            raise SharpinfError(f"variant {self.op}={self.name}: no launcher (launch must be the op's launch function)")
        if not self.files or not all(isinstance(f, str) and f for f in self.files):
            raise SharpinfError(f"variant {self.op}={self.name}: files must name its kernels_cu/ sources")
        if "file" not in inspect.signature(self.launcher).parameters:
            raise SharpinfError(f"variant {self.op}={self.name}: its launcher {self.launcher.__name__} takes no "
                                "file= argument, so it cannot run this variant's own file")
        if self.op not in ("matmul", "moe"):
            if self.activations or self.norm or self.gate_up or self.ffn or self.link:
                raise SharpinfError(f"variant {self.op}={self.name}: activations, norm, gate_up, ffn and link are a "
                                    "matmul variant's")
        elif self.activations not in ACTIVATIONS or not callable(self.norm):
            raise SharpinfError(f"variant {self.op}={self.name}: a {self.op} variant declares its activations "
                                f"({' or '.join(ACTIVATIONS)}) and the norm that writes them")
        elif self.op == "moe" and (self.gate_up or self.ffn or self.link):
            raise SharpinfError(f"variant {self.op}={self.name}: gate_up, ffn and link are a matmul variant's")

    def launch(self, *args, **kw):
        """Run the launcher on this variant's own file."""
        return self.launcher(*args, file=self.files[0], **kw)

    def why_not(self, cfg, model=None) -> str | None:
        return self.fits(cfg, model) if self.fits else None

    def serves(self, qtype: int | None = None, n_tokens: int | None = None) -> bool:
        """Whether it runs (rather than falls back) for weights of qtype in a step of n_tokens."""
        in_range = n_tokens is None or (n_tokens >= self.min_tokens
                                        and (self.max_tokens is None or n_tokens <= self.max_tokens))
        return in_range and (
            qtype is None or self.qtypes is None or self.qtypes(qtype))

    @property
    def label(self) -> str:
        return f"{self.op}={self.name}"

    @property
    def brings(self) -> str:
        """What a matmul (or moe) variant picks with it, in words ('' for another op's): `kernels list`, --kernels' help."""
        if self.op not in ("matmul", "moe"):
            return ""
        gate_up = f", gate+up {self.gate_up.__name__}" if self.gate_up else ""
        ffn = f", FFN {self.ffn.__name__}" if self.ffn else ""
        link = f", between attentions {self.link.__name__}" if self.link else ""
        return f"{self.activations} activations, norm {self.norm.__name__}{gate_up}{ffn}{link}"


REGISTRY: dict[str, dict[str, Variant]] = {op: {} for op in OP_NAMES}  # the first of each op is its baseline


def register(v: Variant) -> Variant:
    """Add a variant (the registry file's, at import; a test's throwaway one). Names are unique per op."""
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
    if op not in REGISTRY:
        raise SharpinfError(f"unknown op {op!r}: the ops are {', '.join(OP_NAMES)}")
    try:
        return REGISTRY[op][name]
    except KeyError:
        raise SharpinfError(f"unknown {op} variant {name!r}: choose {', '.join(REGISTRY[op])}") from None


# -- what each variant serves (named by the registry's fits) ---------------------------------------
def split_fits(cfg, model=None) -> str | None:
    if cfg.head_dim not in attn_ops.HEAD_DIMS:
        return f"split attention is compiled for head_dim {attn_ops.HEAD_DIMS}, the model has {cfg.head_dim}"
    return None


def flash_fits(cfg, model=None) -> str | None:
    return attn_ops.flash_fits(getattr(cfg, "n_head", 1), getattr(cfg, "n_head_kv", 1), cfg.head_dim)


def mma_fits(cfg, model=None) -> str | None:
    if model is None:
        return None
    types = {t.qtype for t in model.tensors.values() if len(t.shape) == 2}
    if not any(mma_ops.supports(q) for q in types):
        return "mma matmuls serve the quantized weight types, the model's matrices are all float"
    return None


# -- the registry file ---------------------------------------------------------------------------------
_FLAGS = ("activations", "min_tokens", "max_tokens", "writes_q8", "needs_scratch")
_REFS = ("fits", "norm", "gate_up", "ffn", "link", "qtypes", "shape")  # "module:function" keys besides launch


def _resolve(where: str, key: str, ref: str) -> Callable:
    mod, sep, fn = str(ref).partition(":")
    try:
        if not sep:
            raise ValueError("not module:function")
        obj = getattr(importlib.import_module(mod), fn)
    except (ImportError, AttributeError, ValueError) as exc:
        raise SharpinfError(f"{where}: {key} = {ref!r} names no function ({exc})") from None
    if not callable(obj):
        raise SharpinfError(f"{where}: {key} = {ref!r} is not a function")
    return obj


def variant_from(entry: dict, path: Path, index: int) -> Variant:
    """One [[variant]] table -> a Variant; every problem is one line naming the entry."""
    where = f"{path.name}, variant {index + 1} ({entry.get('op', '?')}={entry.get('name', '?')})"
    unknown = set(entry) - {"op", "name", "files", "launch", "summary", "like", *_REFS, *_FLAGS}
    if unknown:
        raise SharpinfError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    for key in ("op", "name", "files", "summary"):
        if key not in entry:
            raise SharpinfError(f"{where}: no {key}")
    if entry["op"] not in OP_NAMES:
        raise SharpinfError(f"{where}: unknown op {entry['op']!r}; the ops are {', '.join(OP_NAMES)}")
    kw: dict[str, Any] = {}
    if "like" in entry:  # a copy: the source's launcher, fits and flags, on its own files
        src = REGISTRY[entry["op"]].get(entry["like"])
        if src is None:
            raise SharpinfError(f"{where}: like = {entry['like']!r} is no {entry['op']} variant declared before it")
        kw = {k: getattr(src, k) for k in ("launcher", *_REFS, *_FLAGS)}
        kw["like"] = entry["like"]
    elif "launch" not in entry:
        raise SharpinfError(f"{where}: no launch (or like)")
    if "launch" in entry:
        kw["launcher"] = _resolve(where, "launch", entry["launch"])
    for key in _REFS:
        if key in entry:
            kw[key] = _resolve(where, key, entry[key])
    kw.update({k: entry[k] for k in _FLAGS if k in entry})
    return Variant(entry["op"], entry["name"], tuple(entry["files"]), summary=entry["summary"], **kw)


def load_registry(path: Path | None = None) -> None:
    """(Re)read the registry file into REGISTRY: every variant, baseline first per op."""
    path = path or registry_file()
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SharpinfError(f"kernel variant registry {path}: {exc}") from None
    for op in OP_NAMES:
        REGISTRY[op].clear()
    for i, entry in enumerate(doc.get("variant", [])):
        register(variant_from(entry, path, i))
    empty = [op for op in OP_NAMES if not REGISTRY[op]]
    if empty:
        raise SharpinfError(f"kernel variant registry {path}: no variant of {', '.join(empty)}")


load_registry()

# The named sets. fast: the fastest measured (matmul "best": dp4a, or mmq where an H200 measured it
# faster -- matmul_mmq.py's BEST_MIN_TOKENS; attention split: flash measured faster only for long
# prefills, and the two are not bit-identical, so one cannot stand in for the other per step).
SETS: dict[str, dict[str, str]] = {
    "simple": {"matmul": "simple", "attention": "simple", "rope_kv": "simple", "moe": "simple", "sample": "simple"},
    "fast": {"matmul": "best", "attention": "split", "rope_kv": "fused", "moe": "fast", "sample": "radix"},
    # the tensor-core set: mmq matmuls and MoE experts for steps of >= 16 tokens, flash attention
    "tensor": {"matmul": "mmq", "attention": "flash", "rope_kv": "fused", "moe": "mmq", "sample": "radix"},
    # fast with each linear layer's kernel picked by the GPU's clock (ops/matmul_tuned.py): the same bits
    "tuned": {"matmul": "tuned", "attention": "split", "rope_kv": "fused", "moe": "fast", "sample": "radix"},
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
    moe: str = "simple"
    sample: str = "simple"

    def __post_init__(self):
        for op in OP_NAMES:
            variant(op, getattr(self, op))  # one clear line for a name nobody registered

    def of(self, op: str) -> Variant:
        """The registered variant this choice runs for `op` (what StepKernels dispatches to)."""
        return variant(op, getattr(self, op))

    @property
    def q8_activations(self) -> bool:
        """The linear layers read q8_1 activations (the matmul variant declares it; the reference then
        rounds them the same way). The one test of it: StepKernels, the workspace and trace ask here."""
        return self.of("matmul").activations == "q8_1"

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
        if v is baseline(op) or launched & set(v.files):
            continue
        raise SharpinfError(f"kernels {choice.name}: {v.label} launched none of its own kernels "
                            f"({', '.join(v.files)}); its launcher dispatches other kernels "
                            f"({', '.join(sorted(launched)) or 'none'})")


def choices_for(spec: str, is_moe: bool | None = None) -> list:
    """`--kernels all`: the baseline, the named sets, and a choice for each registered variant no set
    holds (over the baselines): between them every variant of every op -- but for a dense model
    (is_moe False) no moe variant's own choice, which would run the baseline's kernels again. Any other
    spec stands for itself (resolved per backend by resolve_kernels)."""
    if isinstance(spec, str) and spec.strip().lower() == "all":
        out: list = list(SETS)
        covered = {(op, name) for ops in SETS.values() for op, name in ops.items()}
        for op in OP_NAMES:
            if op == "moe" and is_moe is False:
                continue
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
                         "brings": v.brings, "like": v.like,
                         "sets": [s for s, ops in SETS.items() if ops.get(op) == v.name]})
    return rows
