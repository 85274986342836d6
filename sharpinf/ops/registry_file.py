"""Reading variants.toml into the registry (ops/variants.py's REGISTRY and SETS): every problem is one
line naming the entry -- an unknown key, op or variant, a "module:function" that is not there, a
requirement or `bits` naming no variant, a set that breaks its variants' requirements."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path
from typing import Any, Callable

from sharpinf.errors import SharpinfError
from sharpinf.ops import variant as V

FLAGS = ("activations", "writes_q8", "rounding", "bits")  # plain values
REFS = ("fits", "norm", "gate_up", "qtypes", "shape")  # "module:function" keys besides launch
NUMBERS = ("min_tokens", "max_tokens")  # a number, or "module:NAME" of one
LISTS = ("scratch", "requires")  # one entry or a list
INHERITED = ("launcher", *REFS, *FLAGS, *NUMBERS, *LISTS)  # what `like` takes from its source
KEYS = {"op", "name", "files", "launch", "summary", "like", *REFS, *FLAGS, *NUMBERS, *LISTS}


def _object(where: str, key: str, ref: str) -> Any:
    mod, sep, attr = str(ref).partition(":")
    try:
        if not sep:
            raise ValueError("not module:name")
        return getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise SharpinfError(f"{where}: {key} = {ref!r} names nothing ({exc})") from None


def _function(where: str, key: str, ref: str) -> Callable:
    obj = _object(where, key, ref)
    if not callable(obj):
        raise SharpinfError(f"{where}: {key} = {ref!r} is not a function")
    return obj


def _number(where: str, key: str, value) -> int:
    n = _object(where, key, value) if isinstance(value, str) else value
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise SharpinfError(f"{where}: {key} = {value!r} is not a token count (a whole number >= 1)")
    return n


def _listed(value) -> list:
    return list(value) if isinstance(value, list) else [value]


def variant_from(entry: dict, path: Path, index: int) -> V.Variant:
    """One [[variant]] table -> a Variant."""
    where = f"{path.name}, variant {index + 1} ({entry.get('op', '?')}={entry.get('name', '?')})"
    unknown = set(entry) - KEYS
    if unknown:
        raise SharpinfError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    for key in ("op", "name", "summary"):
        if key not in entry:
            raise SharpinfError(f"{where}: no {key}")
    op = entry["op"]
    if op not in V.OP_NAMES:
        raise SharpinfError(f"{where}: unknown op {op!r}; the ops are {', '.join(V.OP_NAMES)}")
    kw: dict[str, Any] = {"launcher": None}
    if "like" in entry:  # a copy: every key of the source but its files (and those it gives itself)
        src = V.REGISTRY[op].get(entry["like"])
        if src is None:
            raise SharpinfError(f"{where}: like = {entry['like']!r} is no {op} variant declared before it")
        kw = {k: getattr(src, k) for k in INHERITED} | {"like": entry["like"]}
    elif "launch" not in entry and (op not in V.STRATEGY_OPS or "files" in entry):
        raise SharpinfError(f"{where}: no launch (or like)")
    if "launch" in entry:
        kw["launcher"] = _function(where, "launch", entry["launch"])
    kw |= {k: _function(where, k, entry[k]) for k in REFS if k in entry}
    kw |= {k: _number(where, k, entry[k]) for k in NUMBERS if k in entry}
    kw |= {k: entry[k] for k in FLAGS if k in entry}
    if "scratch" in entry:
        kw["scratch"] = tuple(_function(where, "scratch", s) for s in _listed(entry["scratch"]))
    if "requires" in entry:
        try:
            kw["requires"] = tuple(V.Requirement.parse(r) for r in _listed(entry["requires"]))
        except SharpinfError as exc:
            raise SharpinfError(f"{where}: {exc}") from None
    try:
        return V.Variant(op, entry["name"], tuple(entry.get("files", ())), summary=entry["summary"], **kw)
    except SharpinfError as exc:
        raise SharpinfError(f"{where}: {exc}") from None


def _check_names(path: Path) -> None:
    """What the entries name of each other exists: requirements' and bits' variants."""
    for op, vs in V.REGISTRY.items():
        for v in vs.values():
            for r in v.requires:
                if not any(r.met(o) for o in V.REGISTRY[r.op].values()):
                    raise SharpinfError(f"{path.name}: {v.label} requires {r}: no {r.op} variant "
                                        f"({', '.join(V.REGISTRY[r.op])}) meets it")
            if v.bits is not None and v.bits not in vs:
                raise SharpinfError(f"{path.name}: {v.label}: bits = {v.bits!r} is no {op} variant")


def _sets(doc: dict, path: Path) -> dict[str, dict[str, str]]:
    out = {}
    for name, ops in doc.get("set", {}).items():
        where = f"{path.name}, set {name}"
        if not isinstance(ops, dict):
            raise SharpinfError(f"{where}: a set is a table of op = variant")
        unknown = set(ops) - set(V.OP_NAMES)
        if unknown:
            raise SharpinfError(f"{where}: unknown op(s) {', '.join(sorted(unknown))}")
        full = {op: ops.get(op, V.baseline(op).name) for op in V.OP_NAMES}
        for op, vname in full.items():
            try:
                V.variant(op, vname)
            except SharpinfError as exc:
                raise SharpinfError(f"{where}: {exc}") from None
            if vname in doc.get("set", {}):
                raise SharpinfError(f"{where}: {op}={vname}: a variant named as a set")
        why = V.broken(full)
        if why:  # a named set is consistent by construction
            raise SharpinfError(f"{where}: {why[0]}")
        out[name] = full
    return out


def load_registry(path: Path | None = None) -> None:
    """(Re)read the registry file into REGISTRY and SETS: every variant, baseline first per op."""
    path = path or V.registry_file()
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SharpinfError(f"kernel variant registry {path}: {exc}") from None
    unknown = set(doc) - {"variant", "set"}
    if unknown:
        raise SharpinfError(f"kernel variant registry {path}: unknown table(s) {', '.join(sorted(unknown))}")
    for op in V.OP_NAMES:
        V.REGISTRY[op].clear()
    V.SETS.clear()
    set_names = set(doc.get("set", {}))
    for i, entry in enumerate(doc.get("variant", [])):
        if entry.get("name") in set_names:
            raise SharpinfError(f"{path.name}, variant {i + 1} ({entry.get('op', '?')}={entry['name']}): "
                                f"{entry['name']!r} names a kernel set; choose another name")
        V.register(variant_from(entry, path, i))
    empty = [op for op in V.OP_NAMES if not V.REGISTRY[op]]
    if empty:
        raise SharpinfError(f"kernel variant registry {path}: no variant of {', '.join(empty)}")
    _check_names(path)
    V.SETS.update(_sets(doc, path))
