"""bench/gpu_slot.sh is what a GPU slot runs: 15 minutes of wall in all, commands of <= 10 min, <= 8 files
back. Without a GPU its dry run (GPU_SLOT_DRY=1) walks every stage on a fake clock -- each run "takes" its
expected seconds, or those GPU_SLOT_FAKE gives -- and checks every `sharpinf bench`, gpu_check.py and
single_stream.py command line through its own --dry-run. These tests hold it to: the budget order, the
resume, at most 3 files in $OUT, the carry's size rule, the gate's failures left out of the timed stages,
and (a real clock, a real kill) a run cut at its limit keeping its finished rows and the summary."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from bench.slot import carry, gate, runner
from bench.slot.pack import OUT_FILES, pack
from bench.slot.plan import Run, Stage, stages
from bench.slot.spend import Budget, spend
from bench.slot.state import SlotState
from bench.slot.summary import plan_table, summary
from bench.suites.common import read_rows

ROOT = Path(__file__).resolve().parents[1]
STAGE_LINE = re.compile(r"^\[(\d+) s\] (\w+): (\d+ runs|skipped)", re.M)


def _slot(tmp_path, name="out", fresh=True, **env):
    e = {**os.environ, "GPU_SLOT_DRY": "1", "GPU_SLOT_DIR": str(tmp_path / "work"), "OUT": str(tmp_path / name),
         "PYTHON": sys.executable, "PYTHONPATH": str(ROOT), **{k: str(v) for k, v in env.items()}}
    p = subprocess.run(["bash", "bench/gpu_slot.sh"] + (["--fresh"] if fresh else []), cwd=ROOT, env=e,
                       capture_output=True, text=True, timeout=120)
    return p, tmp_path / name


def _junit(path: Path, failed: list[tuple[str, str]], passed: int = 3) -> None:
    cases = "".join(f'<testcase classname="tests.test_kernels_basic" name="test_ok_{i}"/>' for i in range(passed))
    cases += "".join(f'<testcase classname="{c}" name="{n}"><failure message="x"/></testcase>' for c, n in failed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>')


def test_dry_run_walks_every_stage_in_budget_order_and_checks_every_command(tmp_path):
    before = set((ROOT / "bench" / "results" / "gpu").iterdir())
    run_dir = tmp_path / "work" / "run" / f"dry-{time.strftime('%Y%m%d')}"
    _junit(run_dir / "gate-new.xml", [("tests.test_kernels_matmul_variants", "test_tiers[cuda-mmq_narrow-Q4_K]"),
                                      ("tests.test_kernels_basic", "test_rmsnorm[cuda]")])
    slow = {"attn-split": 60, "attn-walk": 60}  # attention's runs slower than expected: its budget (150 s) binds
    p, out = _slot(tmp_path, fresh=False, GPU_SLOT_S=5000, GPU_SLOT_CALL_S=5000, GPU_SLOT_FAKE=json.dumps(slow))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    m = re.search(r"dry run: (\d+) commands checked by their --dry-run, 0 refused", p.stdout)
    assert m and int(m.group(1)) >= 30, p.stdout[-2000:]
    print(p.stdout[p.stdout.rindex("stage      budget"):])  # the plan: stage, budget, expected, spent
    plan = stages(*gate.selections(gate.never_timed()))
    started = [(int(t), name) for t, name, _ in STAGE_LINE.findall(p.stdout)]
    assert [n for _, n in started] == [s.name for s in plan]  # every stage, in the plan's order
    assert [t for t, _ in started] == sorted(t for t, _ in started)
    state = SlotState.load(tmp_path / "work" / "state.json")
    for st in plan:  # each within its own budget; the required ones first
        assert sum(state.runs[r.id].seconds for r in st.runs) <= st.budget_s
    assert [s.optional for s in plan] == sorted(s.optional for s in plan)
    assert state.runs["attn-4k-split"].status == "done"
    assert state.runs["attn-4k-walk"].status == "skipped" and state.runs["attn-4k-walk"].note == "needs ~20 s, 10 s left"
    assert sorted(f.name for f in out.iterdir()) == sorted(OUT_FILES)
    # the gate: mmq_narrow's failure left out of the matmul suite; a failure no variant owns named only
    assert state.excluded == {"matmul": ["mmq_narrow"]}
    assert any("test_rmsnorm[cuda]" in n for n in state.gate_notes)
    argv = (tmp_path / "work" / "logs" / "matmul-8b.log").read_text().splitlines()[0].split()
    variants = argv[argv.index("--variant") + 1].split(",")
    assert "mmq_narrow" not in variants and {"dp4a", "mmq", "gemv"} <= set(variants)
    assert state.runs["decode-8b-tuned"].status == "done"  # tuned holds no mmq_narrow
    text = (out / "summary.md").read_text()
    assert "left out of the timed stages: matmul: mmq_narrow" in text
    assert set((ROOT / "bench" / "results" / "gpu").iterdir()) == before  # nothing written in the tree


def test_a_second_command_resumes_where_the_first_stopped(tmp_path):
    p1, out1 = _slot(tmp_path, "out1", GPU_SLOT_S=780, GPU_SLOT_CALL_S=300)
    assert p1.returncode == 0, p1.stderr[-2000:]
    s1 = SlotState.load(tmp_path / "work" / "state.json")
    done1 = {k for k, r in s1.runs.items() if r.status == "done"}
    assert {"models", "gate-new", "gate-rest", "peers"} <= done1 and "tg-pdl1-qwen3" not in done1
    assert s1.spent_s <= 300 - 15
    assert "tuned: skipped" in p1.stdout or "pdl: skipped" in p1.stdout  # what did not fit says so
    p2, out2 = _slot(tmp_path, "out2", fresh=False, GPU_SLOT_S=780, GPU_SLOT_CALL_S=560)
    assert p2.returncode == 0, p2.stderr[-2000:]
    s2 = SlotState.load(tmp_path / "work" / "state.json")
    assert s2.calls == 2 and s2.spent_s <= 780
    for rid in done1:  # not run again: no line of the second command says it ran
        assert f"] {rid}: done" not in p2.stdout
        assert s2.runs[rid].seconds == s1.runs[rid].seconds
    assert {"decode-8b-tuned", "tg-8b-tuned", "tg-pdl1-qwen3"} <= {k for k, r in s2.runs.items() if r.status == "done"}
    assert sorted(f.name for f in out2.iterdir()) == sorted(OUT_FILES)
    with tarfile.open(out2 / "results.tgz") as t:
        names = t.getnames()
    assert any(n.endswith("/summary.md") for n in names) and any(n.endswith("/logs/peers.log") for n in names)


def test_a_run_cut_at_its_limit_keeps_its_finished_rows_and_the_summary(tmp_path, monkeypatch):
    """Negative control: a suite that overruns (it ignores SIGINT: only the kill stops it) is cut by the real
    clock; the rows it wrote before are in the tarball and the summary, marked cut."""
    monkeypatch.setattr(runner, "KILL_GRACE_S", 0.3)
    run_dir = tmp_path / "work" / "run" / "gpu-20990101"
    script = ("import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
              "from bench.suites.common import RowLog\n"
              f"rows = RowLog(__import__('pathlib').Path({str(run_dir / 'slow')!r}) / 'kernels.rows.jsonl', "
              "{'suite': 'kernels'})\n"
              "for n in (1, 8, 64):\n"
              "    rows.append({'phase': 'decode', 'op': 'matmul', 'shape': 'o', 'variant': 'dp4a', 'tokens': n, 'us': 10.0 * n})\n"
              "time.sleep(60)\n")
    st = Stage("slow", 30, (Run("slow-suite", (sys.executable, "-c", script), 1, 1.5),
                            Run("after", (sys.executable, "-c", "pass"), 0.1, 5)))
    state = SlotState(60, run_dir.name)
    work, out = tmp_path / "work", tmp_path / "out"
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    clock = runner.RealClock()
    said = []
    spend((st,), {"slow"}, runner.Ctx(sys.executable, run_dir), Budget(60, 60, 0, clock), state, work / "state.json",
          work / "logs", lambda s: pack(run_dir, work / "logs", work / "state.json",
                                        summary((st,), state, run_dir, "gpu", "test"), out, work), said.append)
    assert clock.now() < 15  # killed, not waited for
    assert state.runs["slow-suite"].status == "cut" and state.runs["after"].status == "done"
    with tarfile.open(out / "results.tgz") as t:
        data = t.extractfile(f"{run_dir.name}/slow/kernels.rows.jsonl").read()
    (tmp_path / "rows.jsonl").write_bytes(data)
    head, rows = read_rows(tmp_path / "rows.jsonl")
    assert head == {"suite": "kernels"} and [r["tokens"] for r in rows] == [1, 8, 64]
    text = (out / "summary.md").read_text()
    assert "| slow-suite | slow | cut |" in text and "cut at 2 s: its finished rows kept" in text
    assert "| kernels slow decode matmul o dp4a N=64 (cut) | 640.00 us |" in text
    assert sorted(f.name for f in out.iterdir()) == ["results.tgz", "summary.md"]


def test_gate_reads_junit_into_variants(tmp_path):
    f = tmp_path / "g.xml"
    _junit(f, [("tests.test_kernels_attention", "test_same_bits[cuda-f16-flash]"),
               ("tests.test_kernels_moe", "test_moe[cuda-mmq-Q4_K]"),
               ("tests.test_kernels_kv_cache", "test_append[cuda]")])
    res = gate.read_junit(f)
    assert res.failed == {"attention": ["flash"], "moe": ["mmq"]} and res.tests == 6 and res.failures == 3
    assert res.unattributed == ["tests.test_kernels_kv_cache::test_append[cuda]"]
    first, rest = gate.selections(["mmq_narrow", "timed"])
    assert first == "mmq_narrow or timed" and rest == "not (mmq_narrow or timed)"
    # a --kernels choice holding a failed variant is refused, not run on it
    r = Run("x", ("py", "-m", "sharpinf", "bench", "m", "--kernels", "tuned", "--out", "o"), 1, 1)
    argv, why = runner.leave_out(r, list(r.argv), {"matmul": ["timed"]})
    assert argv is None and "matmul=timed" in why


def test_carry_size_rule_and_one_wheel_a_package(tmp_path):
    c = tmp_path / "carry"
    (c / "wheels").mkdir(parents=True)
    (c / "wheels" / "gguf-0.17.1-py3-none-any.whl").write_bytes(b"w" * 1000)
    assert carry.check(c, 6 << 20) == []
    big = c / "llama-cuda-sm90.tar.xz"
    with open(big, "wb") as f:
        f.truncate(60 << 20)  # sparse: its size, no disk
    (problem,) = carry.check(c, 6 << 20)
    assert "66.0 MiB with the working tree" in problem and "over the 64 MiB" in problem
    big.unlink()
    (c / "smol-a").mkdir()
    with open(c / "smol-a" / "m.00", "wb") as f:
        f.truncate(47 << 20)  # a half travels in a call of its own: not added to the main call
    assert carry.check(c, 6 << 20) == []
    (c / "wheels" / "gguf-0.16.0-py3-none-any.whl").write_bytes(b"w")
    assert carry.check(c, 6 << 20) == ["two wheels of gguf: pip installs one version of each"]
    p = subprocess.run([sys.executable, "-m", "bench.slot.carry", "--check", str(c)], cwd=ROOT, capture_output=True,
                       text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 1 and "two wheels of gguf" in p.stderr


def test_bad_settings_are_one_line_each(tmp_path):
    for env, word in (({"GPU_SLOT_S": "ten"}, "GPU_SLOT_S must be a number"), ({"GPU_SLOT_DRY": "yes"}, "GPU_SLOT_DRY"),
                      ({"GPU_SLOT_FAKE": "[1]"}, "GPU_SLOT_FAKE must be a JSON object")):
        p, out = _slot(tmp_path, **env)
        assert p.returncode == 2 and p.stderr.strip().splitlines() == [p.stderr.strip()] and word in p.stderr, p.stderr


def test_plan_table_names_each_stage_with_its_budget_and_expected_seconds():
    plan = stages("a", "not a")
    table = plan_table(plan, SlotState(780, "x"))
    for st in plan:
        assert re.search(rf"^{st.name}\*? +{st.budget_s:.0f} +{st.expected_s:.0f} ", table, re.M), table
    req = [s for s in plan if not s.optional]
    assert sum(s.budget_s for s in req) <= 780 - 60  # the required stages' budgets fit the default slot
    assert [s.name for s in req] == ["setup", "gate", "peers", "matmul", "tuned", "pdl"]
    assert next(s for s in plan if s.name == "gate").budget_s <= 90


def test_every_probe_define_of_the_plan_is_a_kernels_knob():
    """A probe run compiles the kernels with -DNAME=VALUE (SHARPINF_NVRTC_OPTIONS); a NAME no kernel reads
    is silently ignored -- the run would time the committed kernels under a probe's name. Each NAME the
    plan passes is one a kernels_cu/ source defaults with #ifndef NAME."""
    from sharpinf.runtime.paths import kernels_dir

    names = {n for st in stages("a", "b") for r in st.runs
             for n in re.findall(r"-D(\w+)", r.env.get("SHARPINF_NVRTC_OPTIONS", ""))}
    assert len(names) >= 8, names
    sources = "".join(p.read_text() for p in kernels_dir().iterdir() if p.suffix in (".cu", ".cuh"))
    knobs = set(re.findall(r"#ifndef (\w+)", sources))
    assert not names - knobs, f"probe defines no kernel reads: {sorted(names - knobs)}"


def test_the_runbook_imports_nothing_that_needs_the_carried_wheels_before_it_installs_them():
    """The box lacks gguf until setup_box installs the carried wheel: bench/gpu_slot.py (and every part it
    imports at its top) must load without it -- sharpinf, which imports gguf, only after the install."""
    code = ("import sys; sys.modules['gguf'] = None; sys.path.insert(0, '.'); import bench.gpu_slot; "
            "print(sorted(m for m in sys.modules if m.startswith('sharpinf')))")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "[]", p.stdout
