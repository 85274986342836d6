"""Programmatic dependent launch's contract, read off the PTX of every entry point.

With SHARPINF_PDL=1 the GPU backend lets a kernel's blocks start while the kernel before it in the
stream is still running (common.cuh, "programmatic dependent launch"). That is safe only if the
kernel touches nothing another kernel writes before its `griddepcontrol.wait`. A mistake there
does not fail on the emulator (one kernel at a time) and fails on a GPU only by chance, so the
rule is checked where it can be proven: in the PTX NVRTC makes of each entry, without a GPU.

An entry keeps the contract when every path from its start reaches an unpredicated
`griddepcontrol.wait` having done nothing that reaches memory another kernel writes. No thread may
exit before it: the wait covers only the kernel just before (its direct prerequisite), so the chain
holds only if that kernel waited for its own -- a grid whose threads all left early could complete
while the kernel before it still runs, and the kernel after it would read that one's outputs.
Before the wait only an allowlist passes (anything else is refused, whatever it is): arithmetic,
conversions, moves and compares; loads and stores of parameter, local and shared memory; warp and
block collectives; `griddepcontrol.launch_dependents`; prefetches into L2 (`prefetch.*.L2`,
`cp.async.bulk.prefetch.L2`: L2 is coherent for the whole GPU, so what they bring is never stale
-- it is how a matvec asks for its weights early); and branches forward to a label that is
itself before the wait (an if/else NVVM made of index arithmetic). Statements are split at `;` and
at inline asm braces, labels apart, so several on one line are each judged. Instructions are read
as NVVM wrote them, so a load the compiler hoisted above the wait is caught too -- in an optimized
build (make test-all's; make test reads the optimized sm_90 builds of the fast kernels' files, and
test_pdl.py the matvecs' prefetching build).

    entry_verdicts(ptx) -> {entry: None (keeps it) or "why not"}
"""

from __future__ import annotations

import re

_ENTRY = re.compile(r"^\.(?:visible\s+|weak\s+)?\.entry\s+(\w+)\s*\(", re.M)
_LABEL = re.compile(r"^([$%\w.]+):(?!:)\s*")  # not a qualifier's "::"
_WAIT = "griddepcontrol.wait"
# Before the wait only these (an allowlist: an instruction not named here is refused, whatever it is):
# arithmetic and logic, conversions and moves (cvta: address arithmetic), compares and selects, warp
# and block collectives over registers and shared memory, fences, the trigger (not exits: see above)
_SAFE = {"add", "sub", "mul", "mad", "mul24", "mad24", "sad", "div", "rem", "abs", "neg", "min", "max", "popc",
         "clz", "bfind", "fns", "brev", "bfe", "bfi", "bmsk", "szext", "dp4a", "dp2a", "and", "or", "xor", "not",
         "cnot", "lop3", "shf", "shl", "shr", "prmt", "mov", "cvt", "cvta", "setp", "selp", "set", "slct", "testp",
         "copysign", "fma", "rcp", "sqrt", "rsqrt", "sin", "cos", "lg2", "ex2", "tanh", "isspacep", "activemask",
         "nanosleep", "membar", "fence", "bar", "barrier", "vote", "shfl", "match", "redux"}
_PRIVATE = {"param", "local", "shared", "shared::cta"}  # ld/st spaces: the thread's, the block's, the launch's


def _bodies(ptx: str) -> dict[str, list[str]]:
    """Each entry's body: its lines from the opening brace to the matching closing one (an inline asm
    scope on lines of its own nests; one on one line stays in its line)."""
    out: dict[str, list[str]] = {}
    lines = ptx.splitlines()
    for i, line in enumerate(lines):
        m = _ENTRY.match(line)
        if not m:
            continue
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
        out[m.group(1)] = body
    return out


def statements(body: list[str]) -> list[str]:
    """The body's statements in order, one each: comments dropped, split at `;` (several may share a
    line), an inline asm scope's braces dropped (they open or close a statement; a vector operand's
    braces never do), a label its own statement ("NAME:")."""
    lines = [line.split("//", 1)[0].strip() for line in body]
    # a directive line without a `;` (-G's .loc, .file) would merge into the statement after it
    lines = [line for line in lines if not (line.startswith(".") and ";" not in line)]
    text = re.sub(r"/\*.*?\*/", " ", "\n".join(lines), flags=re.S)
    out = []
    for part in text.split(";"):
        s = " ".join(part.split())
        while s[:1] in ("{", "}"):
            s = s[1:].lstrip()
        while (m := _LABEL.match(s)) is not None:
            out.append(m.group(1) + ":")
            s = s[m.end():]
        if s:
            out.append(s)
    return out


def _split(stmt: str) -> tuple[str, str, str]:
    """(guard, opcode, operands) of an instruction: guard '' or '@p' / '@!p'."""
    guard = ""
    if stmt.startswith("@"):
        guard, _, stmt = stmt.partition(" ")
    op, _, rest = stmt.partition(" ")
    return guard, op, rest


def _why_not(op: str, rest: str, at: int, labels: dict[str, int]) -> str | None:
    """None where instruction `op rest` (statement `at`, before the wait) is safe there, else why not."""
    parts = op.split(".")
    root = parts[0]
    if root in _SAFE:
        return None
    if root in ("ld", "st") and _PRIVATE & set(parts[1:]):
        return None
    if op == "griddepcontrol.launch_dependents":
        return None
    # prefetches into L2 (coherent for the whole GPU: what they bring is never stale), not into L1
    if (root in ("prefetch", "prefetchu") or op.startswith("cp.async.bulk.prefetch.")) and any(
            q.startswith("L2") for q in parts[1:]):
        return None
    if root in ("ret", "exit"):
        return "an exit before"
    if root == "bra":  # forward, to a label before the wait: an if/else of index arithmetic
        target = rest.split()[-1] if rest else ""
        return None if labels.get(target, -1) > at else "a branch not forward to a label before"
    return "not known safe before"


def verdict(body: list[str]) -> str | None:
    """None when the body keeps the contract, else the first statement that breaks it."""
    stmts = statements(body)
    parsed = [None if s.endswith(":") or s.startswith(".") else _split(s) for s in stmts]
    wait_at = next((i for i, p in enumerate(parsed) if p and p[1] == _WAIT), None)
    if wait_at is None:
        return f"no {_WAIT} in the entry"
    if parsed[wait_at][0]:
        return f"{stmts[wait_at]}: a predicated wait (some threads pass it)"
    labels = {s[:-1]: i for i, s in enumerate(stmts[:wait_at]) if s.endswith(":")}
    for i, p in enumerate(parsed[:wait_at]):
        if p is None:
            continue
        why = _why_not(p[1], p[2], i, labels)
        if why is not None:
            return f"{stmts[i]}: {why} {_WAIT}"
    return None


def entry_verdicts(ptx: str) -> dict[str, str | None]:
    """{entry: None or why it breaks the contract} for every entry point in a PTX module."""
    return {name: verdict(body) for name, body in _bodies(ptx).items()}
