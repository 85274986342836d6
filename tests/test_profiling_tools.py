"""The kernel-profiling helpers in bench/: sass_mix.py (what a kernel's loop issues, from its SASS,
no GPU), ncu_targets.py (each chosen kernel-bench case launched once, for Nsight Compute),
walk_rule_fit.py (the attention launch-shape rule's constants from a GPU's timings of both shapes) and
kernel_tables.py (the kernels bench's JSON as markdown tables)."""

from __future__ import annotations

import json

import pytest
from bench_scripts import BENCH, load

sass_mix = load("sass_mix")
ncu_targets = load("ncu_targets")

# nvdisasm's layout: a function header, labels, /*addr*/ instructions; a loop from .L_x_1 back to
# itself through a skipped slow path (@0070 .. @0080) and a forward branch that closes no loop
SASS = """
//--------------------- .text.other_kernel          --------------------------
other_kernel:
        /*0000*/                   EXIT ;
//--------------------- .text.k                     --------------------------
        .global k
k:
.text.k:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_TID.X ;
.L_x_1:
        /*0020*/                   LDSM.16.M88.4 R4, [R2] ;
        /*0030*/                   IMMA.16832.S8.S8 R8, R4.ROW, R6.COL, RZ ;
        /*0040*/                   FADD R12, R8, -12582912 ;
        /*0050*/                   FFMA R13, R12, R14, R13 ;
        /*0060*/               @P0 BRA `(.L_x_2) ;
        /*0070*/                   I2F.RP R20, R21 ;
        /*0080*/                   MUFU.RCP R20, R20 ;
.L_x_2:
        /*0090*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*00a0*/                   ISETP.GE.AND P1, PT, R3, 0x4, PT ;
        /*00b0*/              @!P1 BRA `(.L_x_1) ;
        /*00c0*/                   BRA `(.L_x_3) ;
.L_x_3:
        /*00d0*/                   EXIT ;
"""


def test_sass_mix_finds_the_loop_and_its_blocks():
    blocks, loops = sass_mix.parse(SASS, "k")
    assert [b.label for b in blocks] == ["entry", ".L_x_1", "@70", ".L_x_2", "@c0", ".L_x_3"]
    (loop,) = loops  # the forward branch to .L_x_3 closes none; other_kernel's EXIT is not k's
    assert loop.head == ".L_x_1" and [b.label for b in loop.blocks] == [".L_x_1", "@70", ".L_x_2"]
    r = sass_mix.report(blocks, loops, None, set(), per=4)
    assert r["iteration_instructions"] == 10
    assert r["by_class"] == {"control": 2, "float": 3, "convert": 1, "shared": 1, "mma": 1, "sync": 1, "integer": 1}
    assert r["per_unit"]["warp_instructions"] == 10 / 4
    cold = sass_mix.report(blocks, loops, ".L_x_1", {"@70"}, per=None)  # the slow path left out
    assert cold["iteration_instructions"] == 8 and "convert" not in cold["by_class"]
    assert cold["by_class"]["float"] == 2  # MUFU went with it


NESTED = """
//--------------------- .text.k                     --------------------------
k:
        /*0000*/                   S2R R0, SR_TID.X ;
.L_x_1:
        /*0010*/                   IADD3 R1, R1, 0x1, RZ ;
.L_x_2:
        /*0020*/                   IDP.4A.S8.S8 R2, R3, R4, R2 ;
        /*0030*/                   IDP.4A.S8.S8 R5, R3, R6, R5 ;
        /*0040*/              @!P0 BRA `(.L_x_2) ;
        /*0050*/                   FADD R7, R2, R5 ;
        /*0060*/              @!P1 BRA `(.L_x_1) ;
.L_x_3:
        /*0070*/                   FADD R8, R8, R7 ;
        /*0080*/              @!P2 BRA `(.L_x_3) ;
        /*0090*/                   EXIT ;
"""


def test_sass_mix_names_the_innermost_loops_issuing_an_opcode():
    """--inner IDP: the chunk loop inside a row loop, not the row loop (the largest, which holds it too),
    nor a loop that issues none."""
    blocks, loops = sass_mix.parse(NESTED, "k")
    assert sorted(lp.head for lp in loops) == [".L_x_1", ".L_x_2", ".L_x_3"]
    assert sass_mix.innermost(blocks, loops, "IDP") == [{"head": ".L_x_2", "instructions": 3, "IDP": 2}]
    assert sass_mix.innermost(blocks, loops, "IMMA") == []


def test_sass_mix_prices_the_pipes_and_reads_the_stalls():
    """nvdisasm -hex prints each instruction's second word on the next line; bits 41-44 of it are the
    stall count. The pipes: FP32 shares the two FMA pipes, IMAD/IDP only the heavy one, the ALU at half
    rate, conversions at an eighth."""
    word = lambda stall: f"/* 0x{stall << 41:016x} */"  # noqa: E731
    sass = "\n".join([
        "k:", ".L_x_1:",
        f"        /*0000*/                   IDP.4A.S8.S8 R1, R2, R3, R1 ;  /* 0x0000000000000000 */", "    " + word(2),
        f"        /*0010*/                   FFMA R4, R5, R6, R4 ;  /* 0x0000000000000000 */", "    " + word(4),
        f"        /*0020*/                   I2F.RP R7, R8 ;  /* 0x0000000000000000 */", "    " + word(1),
        f"        /*0030*/                   LOP3.LUT R9, R9, 0xf, RZ, 0xc0, !PT ;  /* 0x0000000000000000 */", "    " + word(0),
        f"        /*0040*/              @!P1 BRA `(.L_x_1) ;  /* 0x0000000000000000 */", "    " + word(5),
    ])
    blocks, loops = sass_mix.parse(sass, None)
    assert blocks[0].stalls == [2, 4, 1, 0, 5]
    r = sass_mix.report(blocks, loops, None, set(), per=None)
    assert r["pipes"] == {"issue": 5, "fma": 2, "alu": 2, "xu": 8, "tensor": 0, "bound": "xu"}
    assert r["stall_cycles"] == 2 + 4 + 1 + 1 + 5 and r["warps_to_hide"] == 13 / 8
    assert "stall_cycles" not in sass_mix.report(*sass_mix.parse(SASS, "k"), None, set(), None)  # no -hex words


def test_sass_mix_counts_memory_rounds():
    """A round ends where an instruction reads or overwrites a register a pending global load fills: a
    copy loop that stores each value before the next load takes a round a load; a batch of loads (a
    128-bit one fills 4 registers) takes one round until the first use. Source lines from -g listings."""
    serial = sass_mix.parse("\n".join([
        "k:", ".L_x_1:",
        '        //## File "/x/gather.cu", line 14',
        "        /*0000*/                   LDG.E R2, desc[UR4][R4.64] ;",
        "        /*0010*/                   STG.E desc[UR4][R6.64], R2 ;",
        "        /*0020*/                   IADD3 R4, P0, R4, 0x4, RZ ;",
        "        /*0030*/              @!P1 BRA `(.L_x_1) ;"]), None)
    (lp,) = serial[1]
    assert sass_mix.loop_rounds([lp]) == [{"head": ".L_x_1", "instructions": 4, "global_loads": 1, "rounds": 1,
                                           "loads_a_round": 1.0, "carried": 0, "load_lines": {"gather.cu:14": 1}}]
    batched = [("LDG.E.128 R8, desc[UR4][R2.64]", ""), ("LDG.E.64 R12, desc[UR4][R2.64+0x10]", ""),
               ("LDG.E R14, desc[UR4][R2.64+0x18]", ""), ("FADD R20, R16, R17", ""),  # R16: no load's
               ("FADD R20, R11, R20", ""),  # the 128-bit load's last register: the first wait
               ("LDG.E R30, desc[UR4][R2.64+0x20]", ""), ("MOV R30, RZ", ""),  # overwritten while pending: a wait
               ("LDG.E R31, desc[UR4][R2.64+0x24]", "")]  # in flight at the end: a third round
    r = sass_mix.memory_rounds(batched)
    assert (r["global_loads"], r["rounds"], r["carried"]) == (5, 3, 1) and r["load_lines"] == {}
    assert sass_mix.memory_rounds(batched[:3])["rounds"] == 1  # still in flight at the end: waited on after it
    assert sass_mix.memory_rounds(batched[:3])["carried"] == 3  # (in a loop: the next iteration's)


@pytest.fixture
def sass_tools():
    """A real kernel's SASS needs NVRTC and nvdisasm (the `check` extra has both): skip without them."""
    if sass_mix.find_nvdisasm() is None:
        pytest.skip("nvdisasm not installed (pip install nvidia-cuda-nvdisasm)")
    try:
        from sharpinf.runtime.nvrtc_check import Nvrtc

        Nvrtc()
    except Exception as exc:  # noqa: BLE001 -- no NVRTC on this machine
        pytest.skip(f"no NVRTC: {exc}")


def test_sass_mix_on_a_real_kernel(sass_tools):
    """matmul_mmq_q4_k's chunk loop, compiled as the runtime selects it and disassembled: a warp's
    32 rows x 32 tokens are 2 x 4 mma tiles, so the loop holds 8 IMMA -- twice: the terms of full warp tiles
    and those of a tile the tokens end in are two copies (mmq_rows.cuh, 2026-11-28)."""
    cubin, compiler = sass_mix.compile_cubin(BENCH.parent / "kernels_cu" / "matmul_mmq.cu", "matmul_mmq_q4_k", "sm_90",
                                            [], use_nvcc=False)
    blocks, loops = sass_mix.parse(sass_mix.disassemble(cubin), "matmul_mmq_q4_k")
    r = sass_mix.report(blocks, loops, None, set(), per=1024)
    assert compiler.startswith("NVRTC") and r["by_opcode"]["IMMA"] == 16, r["by_opcode"]
    assert r["by_class"]["float"] > 8 * 12  # the dp4a-exact float terms: 16 a tile of 4 outputs a lane (2026-11-27)
    assert r["stall_cycles"] >= r["iteration_instructions"] and r["pipes"]["tensor"] == 16 * 4  # -hex words read


def test_sass_mix_counts_a_real_kernels_rounds(sass_tools):
    """gather_rows_f32 compiled with line info: its copy loop issues its 16 loads in one round (the loop
    that stored each value as it arrived took a round a load, 2026-11-28)."""
    cubin, _ = sass_mix.compile_cubin(BENCH.parent / "kernels_cu" / "gather.cu", "gather_rows_f32", "sm_90", [],
                                      use_nvcc=False, lineinfo=True)
    blocks, loops = sass_mix.parse(sass_mix.disassemble(cubin, lineinfo=True), "gather_rows_f32")
    (copy,) = [lp for lp in sass_mix.loop_rounds(loops) if lp["global_loads"] == 16]
    assert copy["rounds"] == 1 and [ln.split(":")[0] for ln in copy["load_lines"]] == ["gather.cu"], copy


@pytest.mark.parametrize("entry,carried", [("matmul_gemv_q4_k_t1_g32", 12), ("matmul_gemv_q8_0_t1_g32", 36),
                                           ("matmul_gemv_q8_0_t1", 36)])
def test_gemv_keeps_a_batch_of_weight_loads_in_flight_across_its_loop(sass_tools, entry, carried):
    """matmul_gemv's row stream issues the next batch's weight loads before it dots the batch at hand,
    and they are still in flight when the iteration ends: 4 Q4_K chunks, 3 128-bit loads each; 4 Q8_0
    runs, 9 words a lane each (gemv_rows.cuh's coalesced runs). Fetched and dotted in one iteration,
    ptxas had sunk each chunk's loads after the previous chunk's dots (none carried; 2026-11-28); Q8_0's
    per-lane fetch, its 16-bit tail behind a branch, carried 10 of ~40: a restructuring that lets either
    happen again fails. (Q8_0 at n_in 4096 runs its _g32 entry, G compiled in since 2026-11-28; below 512
    inputs the entry with G from n_in.)"""
    cubin, _ = sass_mix.compile_cubin(BENCH.parent / "kernels_cu" / "matmul_gemv.cu", entry, "sm_90", [],
                                      use_nvcc=False)
    blocks, loops = sass_mix.parse(sass_mix.disassemble(cubin), entry)
    # the row stream: the loop with the most loads, the outermost (first) of those -- the warp-divergent
    # fallback paths of its __syncwarps (BRA.DIV) re-enter it further down, and close loops of their own
    stream = max(sass_mix.loop_rounds(loops), key=lambda lp: lp["global_loads"])
    assert stream["carried"] >= carried, stream


def test_ncu_targets_launches_each_chosen_case_once(capsys):
    """On the emulator: the cases of exactly the named bench ops and variants, each once, in order."""
    rc = ncu_targets.main(["synth", "--backend", "emu", "--op", "matmul", "--variant", "mmq,dp4a",
                           "--decode", "1,16", "--prefill", "", "--context", "40"])
    assert rc == 0
    lines = [ln.split() for ln in capsys.readouterr().out.splitlines()[1:]]
    # N = 1: dp4a only (mmq serves >= 16 tokens); N = 16: both; no ffn_in, norm or baseline rows
    assert [(ln[1], ln[3]) for ln in lines] == ([("N=1", "dp4a")] * 4 + [("N=16", "dp4a"), ("N=16", "mmq")] * 4)
    assert {ln[2] for ln in lines} == {"matmul"} and [ln[4] for ln in lines[:4]] == ["qkv", "o", "down", "lm_head"]
    with pytest.raises(SystemExit, match="no case matches"):
        ncu_targets.main(["synth", "--backend", "emu", "--op", "matmul", "--variant", "mmq", "--decode", "1",
                          "--prefill", ""])


def test_walk_rule_fit_pairs_both_shapes_and_finds_the_constants_that_pick_the_faster(tmp_path, capsys):
    """bench/walk_rule_fit.py: each case's split and walk times paired from two runs, cases without both
    or without the rule's inputs left out with a reason; on timings whose faster shape is what the rule
    picks at WALK_PASSES 1.5, MERGE_COST 1.0, the fit loses nothing there and the current constants lose
    the case where they pick the other."""
    fit = load("walk_rule_fit")
    combos = [(512, 9), (512, 41), (512, 65), (8, 9), (264, 8), (1024, 32), (64, 65), (4096, 3)]

    def run(shape_forced: str) -> dict:
        rows = []
        for blocks, parts in combos:
            walks = "walk" if fit.walks_pays(blocks, parts, min(16, parts), 528, 528, 1.5, 1.0) else "split"
            us = 100.0 if shape_forced == "split" else (50.0 if walks == "walk" else 150.0)
            rows.append({"op": "attention", "variant": "split", "shape": f"{blocks} x {parts}", "tokens": blocks,
                         "us": us, "launch_shape": shape_forced,
                         "rule": {"blocks": blocks, "parts": parts, "splits": min(16, parts), "walk_slots": 528,
                                  "split_slots": 528}})
        rows.append({"op": "attention", "variant": "flash", "shape": "lonely", "tokens": 1, "us": 1.0,
                     "launch_shape": shape_forced, "rule": {"blocks": 1, "parts": 2, "splits": 2, "walk_slots": None,
                                                            "split_slots": None}})
        return {"results": {"rows": rows + [{"op": "matmul", "variant": "dp4a", "shape": "x", "tokens": 1, "us": 9.0}]}}

    split, walk = run("split"), run("walk")
    walk["results"]["rows"].append({"op": "attention", "variant": "split", "shape": "walk only", "tokens": 3, "us": 1.0,
                                    "launch_shape": "walk", "rule": {"blocks": 3, "parts": 1, "splits": 1,
                                                                      "walk_slots": 4, "split_slots": 4}})
    found, skipped = fit.cases([split, walk])
    assert len(found) == len(combos) and {c.shape for c in found} == {f"{b} x {p}" for b, p in combos}
    assert sorted(skipped) == ["flash lonely N=1: the rule read no walk_slots, split_slots",
                               "split walk only N=3: timed only walk"]
    result = fit.fit(found)
    assert result["best"]["lost_us"] == 0 and result["current"]["lost_us"] == 50.0  # (512, 41): walk there
    paths = []
    for name, doc in (("split", split), ("walk", walk)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(doc))
    assert fit.main([str(p) for p in paths]) == 0
    out = capsys.readouterr().out
    assert "loses 50.0 us" in out and "512 x 41" in out and "left out: split walk only N=3" in out
    assert fit.main([str(paths[0])]) == 1  # the split run alone: nothing paired


def test_kernel_tables_merge_runs_into_one_table_an_op(tmp_path, capsys):
    """bench/kernel_tables.py: a split-forced and a walk-forced run merge into one attention table with a
    column a launch shape, `*` where the rule takes the other shape, the bandwidth share at N <= 8 only;
    a probe build's run gets columns of its own; --ops keeps the ops asked for; files without rows exit 1."""
    tables = load("kernel_tables")

    def row(op, variant, tokens, us, shape=None, rule=None, pct=None):
        return {"op": op, "phase": "decode", "shape": f"{op} case", "variant": variant, "tokens": tokens, "us": us,
                "pct_of_bandwidth": pct, **({"launch_shape": shape, "rule_shape": rule} if shape else {})}

    split = {"results": {"rows": [row("matmul", "dp4a", 1, 10.0, pct=33.4), row("matmul", "dp4a", 64, 150.0, pct=5.0),
                                  row("attention", "split", 64, 142.5, "split", "walk")]}}
    walk = {"results": {"rows": [row("attention", "split", 64, 40.0, "walk", "walk")]}}
    text = tables.tables([split, walk])
    assert "| decode | matmul case | 1 | 10.0 (33%) |" in text and "| decode | matmul case | 64 | 150.0 |" in text
    assert "| phase | shape | N | split split | split walk |" in text
    assert "| decode | attention case | 64 | 142.5* | 40.0 |" in text
    # a probe build's run: columns of its own, labelled with its defines, the default build's cells kept
    probe = {"device": {"describe": {"nvrtc_options": "-DGV_COALESCE=2 -DGV_U=2"}},
             "results": {"rows": [row("matmul", "dp4a", 1, 12.0, pct=30.0)]}}
    text = tables.tables([split, walk, probe])
    assert "| phase | shape | N | dp4a | dp4a [GV_COALESCE=2 GV_U=2] |" in text
    assert "| decode | matmul case | 1 | 10.0 (33%) | 12.0 (30%) |" in text
    only = tables.tables([split, walk], ["attention"])
    assert "matmul" not in only and "### attention" in only
    files = [tmp_path / "s.json", tmp_path / "w.json", tmp_path / "empty.json"]
    for f, doc in zip(files, (split, walk, {"results": {"rows": []}})):
        f.write_text(json.dumps(doc))
    assert tables.main([str(files[0]), str(files[1]), "--ops", "attention"]) == 0
    assert "142.5*" in capsys.readouterr().out
    assert tables.main([str(files[2])]) == 1
