"""Programmatic dependent launch's contract, read off the PTX of every entry point.

With SHARPINF_PDL=1 the GPU backend lets a kernel's blocks start while the kernel before it in the
stream is still running (common.cuh, "programmatic dependent launch"). That is safe only if the
kernel touches nothing another kernel writes before its `griddepcontrol.wait`. A mistake there
does not fail on the emulator (one kernel at a time) and fails on a GPU only by chance, so the
rule is checked where it can be proven: in the PTX NVRTC makes of each entry, without a GPU.

An entry keeps the contract when every path from its start reaches `griddepcontrol.wait` (or exits)
-- before the wait no call, and a branch only forward to a label that is itself before the wait (an
if/else NVVM made of index arithmetic) -- and nothing before the wait reads or writes global memory:
no load, store, atomic, reduction or async copy in the global or generic state space. Allowed
before it: parameter, local and shared memory, arithmetic, `griddepcontrol.launch_dependents`,
and prefetches (`prefetch`, `cp.async.bulk.prefetch`: hints that read nothing into a register),
which is how a matvec asks for its weights early. A thread may exit before its wait (it touches
nothing then). Instructions are read as NVVM wrote them, so a load the compiler hoisted above the
wait (a `const __restrict__` load is free to move past an asm without a memory clobber) is caught
too.

    entry_verdicts(ptx) -> {entry: None (keeps it) or "why not"}
"""

from __future__ import annotations

import re

_ENTRY = re.compile(r"^\.(?:visible\s+|weak\s+)?\.entry\s+(\w+)\s*\(", re.M)
_WAIT = "griddepcontrol.wait"
# opcode prefixes that move data through memory
_MEMORY = ("ld.", "ldu.", "st.", "atom.", "red.", "tex.", "tld4.", "suld.", "sust.", "sured.", "multimem.")
_COPIES = ("cp.", "tensormap.")  # copies and tensor maps: from global memory, whatever their destination
_SAFE_SPACES = {"param", "local", "shared", "shared::cta"}  # thread- or block-private, or the launch's values
_PREFETCH = ("prefetch.", "prefetchu.", "cp.async.bulk.prefetch.")
_CONTROL = ("bra", "brx.", "call", "call.")


def _bodies(ptx: str) -> dict[str, list[str]]:
    """Each entry's body: its instruction lines from the opening brace to the matching closing
    one (inline asm scopes are braces of their own and nest)."""
    out: dict[str, list[str]] = {}
    lines = ptx.splitlines()
    index = {i: m for i, m in enumerate(lines) if _ENTRY.match(m)}
    for i in index:
        name = _ENTRY.match(lines[i]).group(1)
        j = i
        while lines[j].strip() != "{":
            j += 1
        depth, body = 0, []
        for line in lines[j:]:
            s = line.strip()
            if s == "{":
                depth += 1
            elif s == "}":
                depth -= 1
                if depth == 0:
                    break
            else:
                body.append(s)
        out[name] = body
    return out


def _instruction(line: str) -> str:
    """The opcode of a PTX statement (its guard predicate dropped), '' for what is not one."""
    s = line.split("//", 1)[0].strip()
    if not s or s.startswith("."):  # declarations: .reg, .shared, .local, .pragma
        return ""
    if s.startswith("@"):
        s = s.split(None, 1)[1] if " " in s or "\t" in s else ""
    return s.split(None, 1)[0].rstrip(";") if s else ""


def verdict(body: list[str]) -> str | None:
    """None when the body keeps the contract, else the first statement that breaks it."""
    statements = [t for t in (line.split("//", 1)[0].strip() for line in body) if t]
    wait_at = next((i for i, t in enumerate(statements) if _instruction(t) == _WAIT), len(statements))
    # labels before the wait: a branch there may only jump forward to one of them (an if/else the
    # compiler made of index arithmetic), so every path still runs into the wait or exits
    labels = {t[:-1]: i for i, t in enumerate(statements[:wait_at]) if t.endswith(":")}
    for i, s in enumerate(statements[:wait_at]):
        op = _instruction(s)
        if not op or s.endswith(":") or op.startswith(_PREFETCH):
            continue
        if op in _CONTROL or op.startswith(_CONTROL[1:]):
            target = s.rstrip(";").split()[-1]
            if op.startswith("bra") and labels.get(target, -1) > i:
                continue
            return f"a branch or call before {_WAIT}: {s}"
        if op.startswith(_COPIES) or (op.startswith(_MEMORY) and not _SAFE_SPACES & set(op.split(".")[1:])):
            return f"global or generic memory before {_WAIT}: {s}"
    return None if wait_at < len(statements) else f"no {_WAIT} in the entry"


def entry_verdicts(ptx: str) -> dict[str, str | None]:
    """{entry: None or why it breaks the contract} for every entry point in a PTX module."""
    return {name: verdict(body) for name, body in _bodies(ptx).items()}
