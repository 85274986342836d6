"""`sharpinf kernels new OP NAME`: a new kernel variant that compiles and passes as it is.

It writes two things and touches nothing else:
  kernels_cu/<op>_<name>.cu   a copy of a registered variant's launched file (the op's baseline by
                              default), its header replaced by the copy's contract to fill in: what
                              it changes, tiles, launch shape, invariance, expected bound, and the
                              loop to prove and measure it;
  one [[variant]] entry       appended to the registry (sharpinf/ops/variants.toml, or
                              $SHARPINF_VARIANTS): `like = <source>` runs the source's launcher on
                              the new file and takes every key it declares -- its scratch (written
                              out in the entry, so the Workspace's buffers for it are in sight),
                              rounding, requirements, token range --, so dispatch, the workspace,
                              `--kernels all`, `kernels list`, the kernels bench and the kernel
                              tests take it up at once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from sharpinf.errors import SharpinfError
from sharpinf.ops import variants as V
from sharpinf.runtime.paths import kernels_dir

_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}$")
OP_TESTS = {"matmul": "tests/test_kernels_matmul_variants.py", "ffn": "tests/test_kernels_matmul_ffn.py",
            "link": "tests/test_kernels_layer_link.py", "attention": "tests/test_kernels_attention.py",
            "rope_kv": "tests/test_kernels_rope.py", "moe": "tests/test_kernels_moe.py",
            "sample": "tests/test_kernels_sampling.py"}  # where each op's variants are tested
RESERVED = {"auto", "all", *V.SETS}

HEADER = """\
// {file} -- variant `{name}` of {op} (`--kernels {op}={name}`), a copy of {source} ({op}={like}):
// until it is changed it computes what {source} computes, bit for bit. Its contract, to keep true
// (and to say, as every kernel's header does):
//   What it changes against {baseline_file} (the readable baseline), and why it should be faster:
//   Inputs' layout, tiles: as {source}'s header says, until changed
//   Launch: as {like}'s launcher, {launcher}, run on this file (same entry names and
//     arguments); a new shape needs a launcher of its own, declared with `launch =` in its entry
//   Batch invariance: a token's result depends on its own inputs, in a fixed order, as in {source}
//   Bound (GB/s or TFLOP/s beside the device's peak):
// The loop (docs/adding-a-variant.md):
//   pytest {tests} -k {name}    every kernel test of the op, on the emulator with racecheck and initcheck
//   sharpinf verify MODEL --kernels {op}={name} --only kernel,cross-path [--trace]
//   sharpinf bench MODEL --suite kernels --op {op} --variant {name}
"""


def body_of(source: str) -> str:
    """A kernel source without its leading comment block (the header a copy replaces with its own)."""
    lines = source.splitlines(keepends=True)
    i = 0
    while i < len(lines) and lines[i].lstrip().startswith("//"):
        i += 1
    return "".join(lines[i:])


@dataclass
class Scaffold:
    op: str
    name: str
    like: str
    file: Path  # the new kernel source
    registry: Path  # the registry file the entry was appended to
    entry: str  # the entry's text


def _check_name(op: str, name: str) -> None:
    if op not in V.OP_NAMES:
        raise SharpinfError(f"unknown op {op!r}: the ops are {', '.join(V.OP_NAMES)}")
    if not _NAME.match(name):
        raise SharpinfError(f"variant name {name!r}: use a lowercase identifier (letters, digits, _), "
                            "starting with a letter, at most 32 characters")
    if name in RESERVED:
        raise SharpinfError(f"variant name {name!r} names a kernel set; choose another")
    if name in V.REGISTRY[op]:
        raise SharpinfError(f"{op}={name} is already registered ({', '.join(V.REGISTRY[op][name].files)})")


def new_variant(op: str, name: str, like: str | None = None, summary: str | None = None) -> Scaffold:
    """Copy `like`'s launched file (default: the op's baseline) to kernels_cu/<op>_<name>.cu under a
    header, and append its registry entry. Nothing is written if either would clash."""
    _check_name(op, name)
    src_variant = V.variant(op, like) if like else V.baseline(op)
    if not src_variant.files:
        raise SharpinfError(f"{src_variant.label} owns no kernel file to copy: --from one that does "
                            f"({', '.join(n for n, v in V.REGISTRY[op].items() if v.files) or 'none yet'})")
    src = kernels_dir() / src_variant.files[0]
    dest = kernels_dir() / f"{op}_{name}.cu"
    if dest.exists():
        raise SharpinfError(f"{dest} exists already: choose another name or remove it")
    registry = V.registry_file()
    text = src.read_text()
    header = HEADER.format(file=dest.name, name=name, op=op, source=src.name, like=src_variant.name, tests=OP_TESTS[op],
                           baseline_file=V.baseline(op).files[0],
                           launcher=f"{src_variant.launcher.__module__}.{src_variant.launcher.__name__}")
    summary = summary or f"a copy of {op}={src_variant.name} ({src.name}): say what it changes"
    entry = (f'\n[[variant]]\nop = "{op}"\nname = "{name}"\nlike = "{src_variant.name}"\n'
             f'files = ["{dest.name}"]\n{_declared(src_variant)}summary = "{_toml_str(summary)}"\n')
    dest.write_text(header + body_of(text))
    try:
        with registry.open("a") as f:
            f.write(entry)
        V.load_registry()  # proves the entry loads; the new variant is registered in this process too
    except BaseException:
        dest.unlink(missing_ok=True)
        _drop_entry(registry, entry)
        raise
    return Scaffold(op, name, src_variant.name, dest, registry, entry)


def _ref(fn) -> str:
    return f"{fn.__module__}:{fn.__name__}"


def _declared(v: V.Variant) -> str:
    """The keys `like` takes from v that shape what the variant needs -- its scratch, rounding,
    requirements -- written out, so the entry shows them (and editing one changes only this variant)."""
    lines = []
    if v.scratch:
        refs = [f'"{_ref(s)}"' for s in v.scratch]
        lines.append(f"scratch = {refs[0] if len(refs) == 1 else '[' + ', '.join(refs) + ']'}")
    if v.rounding != "f32":
        lines.append(f'rounding = "{v.rounding}"')
    if v.requires:
        lines.append(f"requires = [{', '.join(repr(str(r)).replace(chr(39), chr(34)) for r in v.requires)}]")
    return "".join(line + "\n" for line in lines)


def _toml_str(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def _drop_entry(registry: Path, entry: str) -> None:
    text = registry.read_text()
    if text.endswith(entry):
        registry.write_text(text[: -len(entry)])
