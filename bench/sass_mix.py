"""The instruction mix of a kernel's loops, read from its SASS: what an iteration issues, no GPU needed.

    python bench/sass_mix.py FILE.cu ENTRY [--arch sm_90] [--nvcc] [--define NAME=VALUE ...]
                             [--cold LABEL,...] [--per N] [--blocks] [--inner OPCODE] [--json]

Compiles one entry point of kernels_cu/FILE.cu as the runtime selects it (SHARPINF_SELECT and
SHARPINF_WANT_<entry>: only that entry is built) to a CUBIN -- with the NVRTC sharpinf runs with
(the venv's, from the `check` or cudaNN extra), or with --nvcc the nvcc on PATH (same ptxas as
the device's NVRTC of that CUDA version: on the device image, CUDA 13.0) -- disassembles it with
nvdisasm (on PATH, or the nvidia-cuda-nvdisasm wheel: `pip install nvidia-cuda-nvdisasm`), and
finds its loops: a branch back to an earlier label closes one. For the largest loop (or --loop
LABEL) it prints the instructions of one iteration by class -- tensor-core mma, float, integer,
conversion, shared and global memory, barrier, control -- and the basic blocks it holds, each
with its own count, so that the blocks an iteration skips (a slow path behind a branch, e.g. an
integer division, or work every 4th iteration) can be named with --cold and left out of the
total. --per N divides the warp instructions of an iteration by N: give it the work units a warp
does in one iteration (matmul_mmq: 32 rows x 32 tokens = 1024 terms a warp per chunk) to get
warp instructions per unit; x32 is lane instructions per unit. An SM issues 4 warp instructions
a clock (one per scheduler), so units / s <= 4 x clock x SMs / (warp instructions per unit): the
issue bound, which a kernel meets only with enough warps to hide every latency.

It also prices the iteration on one scheduler's pipes (pipe_cycles: the FMA pipes, the ALU at half
rate, the conversion unit at an eighth, the tensor core at its peak): the largest of those and the
issue slots is what a scheduler spends on a warp's iteration when every latency is hidden -- an
I2F where the magic-number add was (dp4a.cuh's DP_I2F_CVT probe) shows up as the XU passing issue.
And from the instructions' control bits (nvdisasm -hex) it sums the stalls ptxas scheduled for one
warp -- the fixed latencies (an FFMA's 4 cycles, an IMMA's result), not the waits on memory -- and
divides them by that bound: the warps a scheduler needs to stay busy, to set beside the occupancy
ptxas's registers allow.

And it counts memory rounds (--rounds): walking an iteration -- or the whole function, which is what a
decode kernel's short-lived block runs -- in address order, the global loads issued before an
instruction reads (or overwrites) the register one of them fills; that read waits on memory and
ends a round. A loop that loads a value and uses it before the next load (a copy loop whose store
the next load may not pass, a sum that adds each value as it arrives) shows one load a round: a
round trip to L2 or HBM an element, the latency chain that sets a small kernel's time. Kernels
written to batch their loads (attention_split.cu's fetch, rms_scale's) show many loads a round. The
counts are static: a loop's body counts once in the function's figure, so multiply a loop's rounds
by its trip count (the reader knows it: a copy loop of n values over T threads runs n / T times).
A wait is what ptxas wrote in the control bits: each load sets one of 6 scoreboards and an
instruction waits on a mask of them, so a load on a board no wait names stays in flight past other
loads' waits. "In flight at its end" counts the loads an iteration leaves in flight: issued for the
next iteration, a prefetch (gemv_rows.cuh's batches, 12 Q4_K loads at NT = 1).

What it cannot say: how often a branch inside the loop is taken (the reader knows: --cold), the waits
on shared and global memory and barriers, or anything about memory traffic beyond the instructions that
cause it. ncu on a GPU says those.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

# opcode (before the first '.') -> class; anything else is "other"
CLASSES = {
    "mma": ("IMMA", "HMMA", "DMMA", "HGMMA", "IGMMA", "QGMMA", "BMMA"),
    "float": ("FADD", "FMUL", "FFMA", "FMNMX", "FSEL", "FSET", "FSETP", "FCHK", "HADD2", "HMUL2", "HFMA2", "MUFU",
              "FSWZADD"),
    "convert": ("I2F", "F2I", "I2FP", "F2FP", "F2F", "I2I", "FRND"),
    "integer": ("IADD3", "IMAD", "IABS", "IMNMX", "VIADD", "VIMNMX", "LOP3", "SHF", "LEA", "ISETP", "SEL", "PRMT", "IDP",
                "BMSK", "POPC", "FLO", "BREV", "SGXT", "IMUL", "IADD", "LOP", "SHL", "SHR", "UIADD3", "UIMAD", "ULOP3",
                "USHF", "ULEA", "USEL", "UISETP", "UPRMT", "UFLO", "UPOPC", "UBMSK", "USGXT", "VABSDIFF4",
                "VABSDIFF"),
    "move": ("MOV", "CS2R", "S2R", "S2UR", "R2UR", "LDC", "ULDC", "SHFL", "P2R", "R2P", "PLOP3", "VOTE", "UMOV"),
    "shared": ("LDS", "STS", "LDSM", "STSM", "ATOMS", "LDGSTS"),
    "global": ("LDG", "STG", "LD", "ST", "ATOMG", "RED", "ATOM", "LDL", "STL", "UBLKCP", "UTMALDG", "UTMASTG"),
    "sync": ("BAR", "DEPBAR", "LDGDEPBAR", "WARPSYNC", "MEMBAR", "ARRIVES", "SYNCS", "ERRBAR", "CCTL"),
    "control": ("BRA", "BSSY", "BSYNC", "EXIT", "RET", "CALL", "JMP", "BRX", "WARPGROUP", "YIELD", "NOP", "BPT"),
}
_CLASS_OF = {op: c for c, ops in CLASSES.items() for op in ops}
LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?);")
HEX = re.compile(r"/\*\s*(0x[0-9a-f]{16})\s*\*/")
LABEL = re.compile(r"^(\.L_x_\d+):")
SOURCE = re.compile(r'//## File "(.*?)", line (\d+)')  # nvdisasm -g: the source line of what follows
BRANCH = re.compile(r"\bBRA\b.*`\((\.L_x_\d+)\)")


@dataclass
class Block:
    label: str  # the label it starts at; "@ADDR" (its first instruction's) after a branch; "entry" the first
    ops: list[str] = field(default_factory=list)  # full opcodes (IMMA.16832.S8.S8, ...)
    stalls: list[int] = field(default_factory=list)  # each one's stall count (-hex listings), else empty
    ctrl: list[int] = field(default_factory=list)  # each one's control word (the upper 64 bits; -hex listings)
    texts: list[str] = field(default_factory=list)  # each instruction's text: opcode and operands, no predicate
    lines: list[str] = field(default_factory=list)  # each one's source line (FILE:N) when compiled with line info

    def rows(self) -> list[tuple]:
        """(text, source line[, control word]) of each instruction: the control word where -hex gave all."""
        if len(self.ctrl) == len(self.texts):
            return list(zip(self.texts, self.lines, self.ctrl))
        return list(zip(self.texts, self.lines))


@dataclass
class Loop:
    head: str  # the label the back branch goes to
    blocks: list[Block]

    def ops(self, cold: set[str] = frozenset()) -> list[str]:
        return [op for b in self.blocks if b.label not in cold for op in b.ops]

    def stalls(self, cold: set[str] = frozenset()) -> list[int]:
        return [st for b in self.blocks if b.label not in cold for st in b.stalls]

    def texts(self, cold: set[str] = frozenset()) -> list[tuple]:
        return [row for b in self.blocks if b.label not in cold for row in b.rows()]


def opclass(op: str) -> str:
    return _CLASS_OF.get(op.split(".")[0], "other")


def parse(sass: str, entry: str | None = None) -> tuple[list[Block], list[Loop]]:
    """The basic blocks (label to label) of `entry`'s text (the only or the first function when None) and
    its loops, innermost-or-not, each from the label a branch jumps back to through that branch."""
    blocks: list[Block] = []
    inside = entry is None
    back: list[tuple[int, str]] = []  # (block index of the branch, target label)
    after_branch = False
    source = ""
    for raw in sass.splitlines():
        src = SOURCE.search(raw)
        if src:
            source = f"{Path(src.group(1)).name}:{src.group(2)}"
            continue
        if raw.startswith("//---") and ".text." in raw:
            name = raw.split(".text.", 1)[1].split()[0]
            if inside and blocks:
                break  # the next function
            inside = entry is None or name == entry
            continue
        if not inside:
            continue
        m = LABEL.match(raw.strip())
        if m:
            blocks.append(Block(m.group(1)))
            after_branch = False
            continue
        m = LINE.match(raw)
        if not m:
            hi = HEX.fullmatch(raw.strip())
            if hi and blocks and len(blocks[-1].stalls) < len(blocks[-1].ops):  # the instruction's second word
                blocks[-1].stalls.append(stall_cycles(int(hi.group(1), 16)))
                blocks[-1].ctrl.append(int(hi.group(1), 16))
            continue
        text = m.group(2).strip()
        if text.startswith("@"):
            text = text.split(None, 1)[1]
        op = text.split()[0]
        if not blocks or after_branch:  # a branch ends a block: what follows it is the code it skips
            blocks.append(Block("entry" if not blocks else f"@{m.group(1).lstrip('0') or '0'}"))
        blocks[-1].ops.append(op)
        blocks[-1].texts.append(text)
        blocks[-1].lines.append(source)
        after_branch = op == "BRA"
        b = BRANCH.search(text)
        if b:
            back.append((len(blocks) - 1, b.group(1)))
    index = {b.label: i for i, b in enumerate(blocks)}
    loops = [Loop(target, blocks[index[target] : at + 1]) for at, target in back if target in index and index[target] <= at]
    return blocks, loops


def stall_cycles(high_word: int) -> int:
    """The stall count of an instruction's control bits (Volta to Hopper: bits 105-108 of the 128-bit
    word, i.e. 41-44 of its upper 64): the cycles ptxas makes this warp wait before its next instruction
    may issue -- how it covers a fixed latency (an FFMA's result, an IMMA's) without a scoreboard."""
    return (high_word >> 41) & 0xF


# Which pipe of an SM sub-partition (one scheduler) executes an opcode, and for how many cycles a warp
# instruction holds it. Sources: the CUDA C++ Programming Guide's throughput table for compute capability
# 9.0 (per SM and clock: 128 FP32 add/mul/fma, 64 integer add/logic/shift/compare and integer multiply-add,
# 16 conversions), NVIDIA's account of GH100's pipes (FMA-heavy: FP32, IMAD, IDP; FMA-lite: FP32 only; ALU:
# the other integer, logic and compare work), and H100's dense int8 tensor rate (~1,000 MACs a clock a
# sub-partition: an m16n8k32's 4,096 in 4 cycles, a floor -- mma.sync runs below wgmma's peak). Opcodes not
# listed only take their issue slot. VIADD (new in sm_90) is counted on the ALU: an assumption.
FMA_ANY = ("FADD", "FMUL", "FFMA", "FSWZADD", "HADD2", "HMUL2", "HFMA2")  # either FMA pipe, 2 cycles there
FMA_HEAVY = ("IMAD", "IMUL", "IDP")  # the heavy FMA pipe only, 2 cycles
ALU = ("IADD3", "LOP3", "SHF", "LEA", "ISETP", "SEL", "PRMT", "IMNMX", "VIMNMX", "IABS", "VIADD", "FMNMX", "FSEL",
       "FSETP", "FSET", "MOV", "PLOP3", "P2R", "R2P", "BMSK", "SGXT", "IADD", "LOP", "SHL", "SHR", "CS2R", "F2FP")
XU = ("I2F", "F2I", "I2FP", "F2F", "FRND", "MUFU", "POPC", "FLO", "BREV")  # conversions, transcendentals: 8
TENSOR = {"IMMA": 4, "HMMA": 4}  # cycles a warp instruction (m16n8k32 int8 / m16n8k16 f16) at the peak rate


def pipe_cycles(ops: list[str]) -> dict:
    """Cycles an iteration holds each pipe of its scheduler, and the largest of them and the issue
    slots (1 an instruction): what one scheduler needs for one warp's iteration when latencies are
    hidden. FP32 work is split between the two FMA pipes as evenly as the heavy pipe's IMAD/IDP allow."""
    n = Counter(op.split(".")[0] for op in ops)
    heavy = sum(n[o] for o in FMA_HEAVY)
    fp32 = sum(n[o] for o in FMA_ANY)
    out = {
        "issue": len(ops),
        "fma": max(2 * heavy, heavy + fp32),  # 2 cycles a warp on a 16-lane pipe; two pipes share FP32
        "alu": 2 * sum(n[o] for o in ALU),
        "xu": 8 * sum(n[o] for o in XU),
        "tensor": sum(c * n[o] for o, c in TENSOR.items()),
    }
    out["bound"] = max(out, key=out.get)
    return out


# -- memory rounds -------------------------------------------------------------------------------
GLOBAL_LOADS = ("LDG", "LD", "ATOMG", "ATOM", "LDL")  # fill a register from memory (atomics return the old value)
REG = re.compile(r"\bR(\d+)\b")  # general registers (RZ, UR, P are not)


def _regs(operands: str) -> list[int]:
    return [int(r) for r in REG.findall(operands)]


def scoreboards(ctrl: int) -> tuple[int | None, int]:
    """(the scoreboard a variable-latency instruction sets when its result lands, or None; the mask of
    scoreboards it waits on before it issues) from its control word (Volta to Hopper: bits 110-112 and
    116-121 of the 128-bit word, 46-48 and 52-57 of its upper 64; 7: none)."""
    wb = (ctrl >> 46) & 7
    return (None if wb == 7 else wb), (ctrl >> 52) & 0x3F


def memory_rounds(texts: list[tuple]) -> dict:
    """Global loads and the rounds they take in straight-line address order: a round ends where an
    instruction waits on a pending load. texts: (an instruction's text, its source line[, its control
    word]). With control words (-hex), the wait is the scoreboard mask ptxas set: it waits on the loads
    of those scoreboards only, the others stay in flight. Without them, an instruction that reads or
    overwrites a register a pending load fills waits, and every pending load is taken as landed (a
    128-bit load fills 4 registers, a 64-bit one 2)."""
    boards = len(texts) > 0 and all(len(row) == 3 for row in texts)
    pending: set[int] = set()
    on_board: list[int] = []  # scoreboard mode: the board of each load in flight
    loads = rounds = in_flight = 0  # in_flight: (register mode) the loads of the round not yet waited on
    fresh = False  # (scoreboard mode) a load issued since the last wait: the next wait is a new round
    lines: Counter = Counter()
    for text, line, *ctrl in texts:
        op, _, operands = text.partition(" ")
        base = op.split(".")[0]
        if boards:
            wb, wait = scoreboards(ctrl[0])
            if any(wait >> b & 1 for b in on_board):  # waits on a load: a round, unless nothing issued since
                rounds, fresh = rounds + fresh, False  # the last wait (its loads were in flight together)
                on_board = [b for b in on_board if not wait >> b & 1]
            if base in GLOBAL_LOADS:
                loads += 1
                lines[line] += 1
                on_board.append(7 if wb is None else wb)  # 7: a load without a board is never waited on
                fresh = True
            continue
        regs = _regs(operands.split(", desc[", 1)[0] if base in GLOBAL_LOADS else operands)
        if base in GLOBAL_LOADS:
            addr = _regs(operands.split(", ", 1)[1]) if ", " in operands else []
            if pending & (set(addr) | set(regs[:1])):
                rounds, pending, in_flight = rounds + 1, set(), 0
            if regs:
                width = 4 if ".128" in op else 2 if ".64" in op else 1
                pending |= set(range(regs[0], regs[0] + width))
            loads += 1
            in_flight += 1
            lines[line] += 1
            continue
        if pending & set(regs):  # read, or overwritten (a destination waits for the load too)
            rounds, pending, in_flight = rounds + 1, set(), 0
    carried = len(on_board) if boards else (in_flight if pending else 0)
    rounds += 1 if (fresh if boards else carried) else 0  # loads still in flight at the end are waited on after it
    # carried: of a loop's iteration, the loads still in flight at its end -- issued for the next
    # iteration (a prefetch), which waits on them while this one's other loads are long done
    return {"global_loads": loads, "rounds": rounds, "loads_a_round": loads / rounds if rounds else 0.0,
            "carried": carried, "load_lines": dict(lines.most_common()) if any(lines) else {}}


def mix(ops: list[str]) -> Counter:
    return Counter(opclass(op) for op in ops)


def find_nvdisasm() -> str | None:
    found = shutil.which("nvdisasm")
    if found:
        return found
    import site

    for root in site.getsitepackages() + [site.getusersitepackages()]:
        for cand in sorted(Path(root).glob("nvidia/**/bin/nvdisasm")):
            if not os.access(cand, os.X_OK):  # unpacked without the execute bit (not by pip)
                try:
                    cand.chmod(cand.stat().st_mode | 0o111)
                except OSError:
                    continue
            return str(cand)
    return None


def compile_cubin(file: Path, entry: str, arch: str, defines: list[str], use_nvcc: bool,
                  lineinfo: bool = False) -> tuple[bytes, str]:
    """(CUBIN, what compiled it) of `entry` alone; lineinfo: with the source lines (the same code)."""
    from sharpinf.runtime.cuda_source import selection_defines
    from sharpinf.runtime.paths import kernels_dir

    opts = list(selection_defines([entry])) + [f"-D{d}" for d in defines] + (["-lineinfo"] if lineinfo else [])
    if use_nvcc:
        nvcc = shutil.which("nvcc")
        if nvcc is None:
            sys.exit("--nvcc: no nvcc on PATH")
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "k.cubin"
            p = subprocess.run([nvcc, f"-arch={arch}", "-cubin", "-std=c++17", f"-I{kernels_dir()}", *opts, "-o", str(out),
                                str(file)], capture_output=True, text=True)
            if p.returncode:
                sys.exit(f"{file.name}: nvcc failed:\n{p.stderr}")
            version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
            return out.read_bytes(), f"nvcc ({version})"
    from sharpinf.runtime.nvrtc_check import Nvrtc, compile_options

    nv = Nvrtc()
    ok, log, cubin = nv.compile(file.read_text(), file.name, compile_options(arch, [file.parent], nv.version()[0]) + opts)
    if not ok:
        sys.exit(f"{file.name}: NVRTC failed:\n{log}")
    return cubin, "NVRTC %d.%d" % nv.version()


def disassemble(cubin: bytes, lineinfo: bool = False) -> str:
    tool = find_nvdisasm()
    if tool is None:
        sys.exit("nvdisasm not found: put the CUDA toolkit's bin on PATH, or pip install nvidia-cuda-nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        p = subprocess.run([tool, "-c", "-hex", *(["-g"] if lineinfo else []), f.name], capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"nvdisasm failed: {p.stderr}")
    return p.stdout


def function_rounds(blocks: list[Block]) -> dict:
    """memory_rounds of the whole function in address order (every branch taken as falling through)."""
    return memory_rounds([row for b in blocks for row in b.rows()])


def loop_rounds(loops: list[Loop]) -> list[dict]:
    """memory_rounds of an iteration of each loop that loads from global memory."""
    out = []
    for lp in loops:
        r = memory_rounds(lp.texts())
        if r["global_loads"]:
            out.append({"head": lp.head, "instructions": len(lp.ops())} | r)
    return out


def innermost(blocks: list[Block], loops: list[Loop], opcode: str) -> list[dict]:
    """The innermost loops that issue `opcode` (IDP, IMMA: a kernel's chunk loops): each holds it, and no
    other loop that holds it lies inside. Where a kernel has several phases (ffn_dp4a, layer_dp4a) or
    paths, "the largest loop" is a phase loop around them; these are what an iteration of each costs."""
    at = {id(b): i for i, b in enumerate(blocks)}
    spans = {}
    for lp in loops:
        n = sum(op.split(".")[0] == opcode for op in lp.ops())
        if n:
            spans.setdefault((at[id(lp.blocks[0])], at[id(lp.blocks[-1])]), (lp, n))
    inner = [(a, z) for a, z in spans if not any((a <= a2 and z2 <= z) and (a2, z2) != (a, z) for a2, z2 in spans)]
    return [{"head": spans[k][0].head, "instructions": len(spans[k][0].ops()), opcode: spans[k][1]}
            for k in sorted(inner)]


def report(blocks: list[Block], loops: list[Loop], loop: str | None, cold: set[str], per: int | None) -> dict:
    if not loops:
        return {"function_instructions": sum(len(b.ops) for b in blocks), "loops": []}
    chosen = next((lp for lp in loops if lp.head == loop), None) if loop else max(loops, key=lambda lp: len(lp.ops()))
    if chosen is None:
        sys.exit(f"--loop {loop}: no loop starts there (loops: {', '.join(lp.head for lp in loops)})")
    ops = chosen.ops(cold)
    out = {
        "function_instructions": sum(len(b.ops) for b in blocks),
        "loops": [{"head": lp.head, "blocks": len(lp.blocks), "instructions": len(lp.ops())} for lp in loops],
        "loop": chosen.head,
        "cold": sorted(cold),
        "iteration_instructions": len(ops),
        "by_class": dict(mix(ops).most_common()),
        "by_opcode": dict(Counter(op.split(".")[0] for op in ops).most_common()),
        "blocks": [{"label": b.label, "instructions": len(b.ops), "cold": b.label in cold,
                    "by_class": dict(mix(b.ops).most_common())} for b in chosen.blocks],
    }
    out["pipes"] = pipe_cycles(ops)
    stalls = chosen.stalls(cold)
    if len(stalls) == len(ops):  # a -hex listing: the fixed latencies ptxas scheduled for one warp
        out["stall_cycles"] = sum(max(st, 1) for st in stalls)
        out["warps_to_hide"] = out["stall_cycles"] / out["pipes"][out["pipes"]["bound"]]
    if per:
        out["per_unit"] = {"units": per, "warp_instructions": len(ops) / per,
                           "by_class": {k: v / per for k, v in out["by_class"].items()}}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", help="a kernel source (kernels_cu/NAME.cu, or a path)")
    ap.add_argument("entry", help="the entry point, e.g. matmul_mmq_q4_k")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--nvcc", action="store_true", help="compile with the nvcc on PATH instead of the venv's NVRTC")
    ap.add_argument("--define", action="append", default=[], metavar="NAME=VALUE", help="an extra -D (repeatable)")
    ap.add_argument("--loop", help="the loop to count, by its head label (default: the largest)")
    ap.add_argument("--cold", default="", help="comma list of block labels an iteration skips (left out of the total)")
    ap.add_argument("--per", type=int, help="work units a warp does in one iteration: prints instructions per unit")
    ap.add_argument("--blocks", action="store_true", help="also list the loop's basic blocks")
    ap.add_argument("--sass", type=Path, help="also write the disassembly here")
    ap.add_argument("--rounds", action="store_true",
                    help="count memory rounds: the function's and each loop's global loads and the rounds they take "
                         "(compiled with line info, to name each load's source line)")
    ap.add_argument("--inner", metavar="OPCODE", help="also list the innermost loops that issue OPCODE (IDP for the "
                    "dp4a kernels, IMMA for the tensor-core ones): each phase's or path's chunk loop")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    a = ap.parse_args(argv)
    from sharpinf.runtime.paths import kernels_dir

    file = Path(a.file)
    if not file.exists():
        file = kernels_dir() / a.file
    if not file.exists():
        sys.exit(f"{a.file}: no such file here or in {kernels_dir()}")
    cubin, compiler = compile_cubin(file, a.entry, a.arch, a.define, a.nvcc, lineinfo=a.rounds)
    sass = disassemble(cubin, lineinfo=a.rounds)
    if a.sass:
        a.sass.write_text(sass)
    blocks, loops = parse(sass, a.entry)
    if not blocks:
        sys.exit(f"{a.entry}: not in the disassembly (is it an extern \"C\" entry of {file.name}?)")
    r = {"file": file.name, "entry": a.entry, "arch": a.arch, "compiler": compiler}
    r |= report(blocks, loops, a.loop, {c for c in a.cold.split(",") if c}, a.per)
    if a.rounds:
        r["rounds"] = {"function": function_rounds(blocks), "loops": loop_rounds(loops)}
    if a.inner:
        r["inner"] = innermost(blocks, loops, a.inner)
    if a.json:
        print(json.dumps(r, indent=1))
        return 0
    print(f"{r['entry']} ({r['file']}, {r['arch']}, {r['compiler']}): {r['function_instructions']} instructions")
    if a.rounds:
        print_rounds(r["rounds"])
    if not r["loops"]:
        print("no loop")
        return 0
    print("loops: " + ", ".join(f"{lp['head']} ({lp['instructions']})" for lp in r["loops"]))
    print(f"loop {r['loop']}: {r['iteration_instructions']} instructions an iteration"
          + (f" without the cold blocks {', '.join(r['cold'])}" if r["cold"] else ""))
    print("  " + ", ".join(f"{k} {v}" for k, v in r["by_class"].items()))
    print("  " + ", ".join(f"{k} {v}" for k, v in list(r["by_opcode"].items())[:16]))
    pc = r["pipes"]
    print(f"cycles a scheduler, one warp's iteration: " + ", ".join(f"{k} {pc[k]}" for k in pc if k != "bound")
          + f" -> bound by {pc['bound']}")
    if "stall_cycles" in r:
        print(f"one warp alone: {r['stall_cycles']} cycles of stalls ptxas scheduled (fixed latencies; scoreboard "
              f"waits on memory not counted) -> {r['warps_to_hide']:.1f} warps a scheduler to keep "
              f"{pc['bound']} busy")
    if "per_unit" in r:
        p = r["per_unit"]
        print(f"per unit (/{p['units']}): {p['warp_instructions']:.3f} warp instructions = "
              f"{32 * p['warp_instructions']:.2f} lane instructions; "
              + ", ".join(f"{k} {v:.3f}" for k, v in p["by_class"].items()))
    if a.inner:
        loops_text = ", ".join(f"{lp['head']} ({lp['instructions']} instructions, {lp[a.inner]} {a.inner})"
                               for lp in r["inner"])
        print(f"innermost loops issuing {a.inner}: {loops_text or 'none'}")
    if a.blocks:
        for b in r["blocks"]:
            mark = " (cold)" if b["cold"] else ""
            print(f"  {b['label']:>9} {b['instructions']:4d}{mark}  " + ", ".join(f"{k} {v}" for k, v in b["by_class"].items()))
    return 0


def print_rounds(rr: dict) -> None:
    def line(name: str, m: dict) -> str:
        where = ", ".join(f"{k} x{v}" for k, v in list(m["load_lines"].items())[:6])
        carried = f", {m['carried']} in flight at its end" if m["carried"] else ""
        return (f"  {name}: {m['global_loads']} global loads in {m['rounds']} rounds ({m['loads_a_round']:.1f} a round"
                f"{carried})" + (f"  [{where}]" if where else ""))

    print("memory rounds (loads issued before one is waited on; address order, branches fall through):")
    print(line("function", rr["function"]))
    for lp in rr["loops"]:
        print(line(f"loop {lp['head']} ({lp['instructions']} instructions), an iteration", lp))


if __name__ == "__main__":
    raise SystemExit(main())
