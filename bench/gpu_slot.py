"""A GPU slot spent by plan (bench/gpu_slot.sh is its entry; bench/slot/ holds its parts): the carried
wheels installed and what the runs need checked before any time is spent, then the stages of
bench/slot/plan.py in order within GPU_SLOT_S, then results.tgz + summary.md (+ slot.log) in $OUT after
every stage. A second command resumes where the first stopped (the state in GPU_SLOT_DIR).

    python3 bench/gpu_slot.py [--stages a,b,...] [--fresh]

Environment: GPU_SLOT_S (the slot's seconds over every command, default 780), GPU_SLOT_CALL_S (this
command's, default 560: the device tool kills one at 600), GPU_SLOT_DRY=1 (no GPU: a fake clock walks
every stage, every bench command line checked by its --dry-run), GPU_SLOT_FAKE (dry run: JSON {run id:
seconds} over the plan's expected ones), GPU_SLOT_DIR (work folder, default .slot), GPU_SLOT_CARRY
(default .slot-carry), OUT (default /tmp/sharpinf-slot-out)."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.slot import carry, gate  # noqa: E402
from bench.slot.pack import pack  # noqa: E402
from bench.slot.plan import stages as plan_stages  # noqa: E402
from bench.slot.runner import Ctx, FakeClock, RealClock  # noqa: E402
from bench.slot.spend import Budget, spend  # noqa: E402
from bench.slot.state import SlotState  # noqa: E402
from bench.slot.summary import plan_table, summary  # noqa: E402


class SlotError(Exception):
    """A bad setting or a box that lacks what the runs need: one line, before any time is spent."""


def _env_num(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    if not raw:
        return default
    try:
        v = float(raw)
    except ValueError:
        raise SlotError(f"{name} must be a number of seconds, got {raw!r}") from None
    if v <= 0:
        raise SlotError(f"{name} must be > 0, got {raw!r}")
    return v


def settings() -> dict:
    dry = os.environ.get("GPU_SLOT_DRY", "0")
    if dry not in ("0", "1"):
        raise SlotError(f"GPU_SLOT_DRY must be 0 or 1, got {dry!r}")
    fake_raw = os.environ.get("GPU_SLOT_FAKE", "")
    try:
        fake = json.loads(fake_raw) if fake_raw else {}
        assert isinstance(fake, dict) and all(isinstance(v, (int, float)) and v >= 0 for v in fake.values())
    except (ValueError, AssertionError):
        raise SlotError(f"GPU_SLOT_FAKE must be a JSON object of run id: seconds >= 0, got {fake_raw!r}") from None
    if fake and dry != "1":
        raise SlotError("GPU_SLOT_FAKE is the dry run's: set GPU_SLOT_DRY=1 with it")
    return {"slot_s": _env_num("GPU_SLOT_S", 780), "call_s": _env_num("GPU_SLOT_CALL_S", 560), "dry": dry == "1",
            "fake": fake, "work": Path(os.environ.get("GPU_SLOT_DIR", ROOT / ".slot")),
            "carry": Path(os.environ.get("GPU_SLOT_CARRY", ROOT / ".slot-carry")),
            "out": Path(os.environ.get("OUT", "/tmp/sharpinf-slot-out"))}


def setup_box(cfg: dict, work: Path, say) -> dict:
    """The real box: the carried wheels (only those of packages it lacks), what the runs import, the GPU's
    name, llama.cpp's build and the real SmolLM2 when they came. {placeholders and the run folder's gpu}."""
    site = Path("/tmp/site")
    got, trouble = carry.install(cfg["carry"], site) if (cfg["carry"] / "wheels").is_dir() else ([], "")
    if trouble:
        raise SlotError(trouble)
    if got:
        say(f"installed from {cfg['carry']}: {', '.join(got)}")
    sys.path.append(str(site))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH"), str(site)]))
    lacks = carry.missing() + [m for m in ("cupy",) if _lacks_module(m)]
    if lacks:
        raise SlotError(f"this box lacks {', '.join(lacks)}: carry their wheels (bench/prepare_gpu_slot.sh)")
    from sharpinf.runtime.select import get_backend

    f = get_backend("cuda").describe()
    slug = re.sub(r"[^A-Za-z0-9]+", "-", f.get("gpu") or f["device"]).strip("-").lower()
    out = {"slug": slug, "llama": "committed", "smol": "smollm2-135m-shape:Q4_1",
           "xdist": ("-n", str(min(16, os.cpu_count() or 1)), "--dist", "loadgroup") if not _lacks_module("xdist") else ()}
    tar, llama = cfg["carry"] / "llama-cuda-sm90.tar.xz", work / "llama"
    if tar.is_file() and not (llama / "bin" / "llama-bench").is_file():
        llama.mkdir(parents=True, exist_ok=True)
        with tarfile.open(tar) as t:
            t.extractall(llama)
    if (llama / "bin" / "llama-bench").is_file():
        out["llama"] = str(llama)
        cub = next((str(p.parent) for r in sys.path if r and Path(r).is_dir()
                    for p in Path(r).glob("nvidia/**/libcublas.so.*")), "")
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(llama / "bin"), cub,
                                                                      os.environ.get("LD_LIBRARY_PATH")]))
    halves = [p for h in carry.HALVES for p in sorted((cfg["carry"] / h).glob("*"))]
    if len(halves) >= 2:
        from sharpinf.model.registry import pull

        try:
            say(f"real SmolLM2 joined: {pull('smollm2-135m', sources=[str(p) for p in halves])}")
            out["smol"] = "smollm2-135m"
        except Exception as exc:  # the shape model stands in; the summary's log says why
            say(f"real SmolLM2: the halves did not join ({exc}); its shape model stands in")
    return out


def _lacks_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", default="", help="comma list of stages to run (default: all, in the plan's order)")
    ap.add_argument("--fresh", action="store_true", help="forget the state of an earlier command: a new slot")
    args = ap.parse_args()
    cfg = settings()
    work, out_dir = cfg["work"], cfg["out"]
    out_dir.mkdir(parents=True, exist_ok=True)
    log = open(out_dir / "slot.log", "a")

    def say(line: str) -> None:
        print(line, flush=True)
        log.write(line + "\n")
        log.flush()

    # the box first: the carried wheels (gguf) go in before anything imports sharpinf
    box = {"slug": "dry", "llama": "committed", "smol": "smollm2-135m-shape:Q4_1", "xdist": ()} if cfg["dry"] \
        else setup_box(cfg, work, say)
    first, rest = gate.selections(gate.never_timed())
    stages = plan_stages(first, rest)
    names = [s.name for s in stages]
    chosen = [s.strip() for s in args.stages.split(",") if s.strip()] or names
    bad = [s for s in chosen if s not in names]
    if bad:
        raise SlotError(f"--stages: no stage {', '.join(bad)}; the stages are {', '.join(names)}")
    state_path = work / "state.json"
    state = SlotState.load(state_path) if state_path.exists() and not args.fresh else \
        SlotState(cfg["slot_s"], f"{box['slug']}-{time.strftime('%Y%m%d')}")
    state.slot_s, state.calls = cfg["slot_s"], state.calls + 1
    run_dir = work / "run" / state.run_name
    ctx = Ctx(sys.executable, run_dir, box["llama"], box["smol"], tuple(box["xdist"]), ncu=_ncu(),
              excluded=state.excluded)
    clock = FakeClock(cfg["fake"]) if cfg["dry"] else RealClock()
    budget = Budget(cfg["slot_s"], cfg["call_s"], state.spent_s, clock)
    facts = "dry run: a fake clock, nothing run" if cfg["dry"] else _nvidia_smi()
    say(f"GPU slot {state.run_name}, command {state.calls}: {budget.left():.0f} s to spend of "
        f"{cfg['slot_s'] - state.spent_s:.0f} left; {facts}")
    say(plan_table(stages, state))

    def after_stage(st) -> None:
        if st.name == "gate":
            res, unread = gate.gate_result([run_dir / f"{r.id}.xml" for r in st.runs])
            state.excluded.update(res.failed)
            ctx.excluded = state.excluded
            state.gate_notes = ([f"{res.tests} tests, {res.failures} failed"] + unread
                                + [f"failed, no variant named: {t}" for t in res.unattributed[:20]])
            say(f"gate: {'; '.join(state.gate_notes[:3])}; left out: {state.excluded or 'none'}")
        state.save(state_path)
        pack(run_dir, work / "logs", state_path, summary(stages, state, run_dir, box["slug"], facts), out_dir, work)

    spend(stages, set(chosen), ctx, budget, state, state_path, work / "logs", after_stage, say)
    pack(run_dir, work / "logs", state_path, summary(stages, state, run_dir, box["slug"], facts), out_dir, work)
    say(plan_table(stages, state))
    if cfg["dry"]:  # the runs the fake clock skipped are checked too: every command line, every dry run
        from bench.slot.runner import check_command

        seen = {rid for rid, _ in clock.checked}
        for st in stages:
            for r in st.runs:
                if r.id not in seen:
                    ok, how, text = check_command(ctx.fill(r.argv), r.env)
                    clock.checked += [(r.id, how)] if how != "named" else []
                    clock.failed += [] if ok else [f"{r.id}: {text.strip()[-300:]}"]
        say(f"dry run: {len(clock.checked)} commands checked by their --dry-run, {len(clock.failed)} refused")
        for line in clock.failed:
            say(f"  refused: {line}")
        return 1 if clock.failed else 0
    return 0


def _ncu() -> str:
    import shutil

    return shutil.which("ncu") or next((str(p) for p in sorted(Path("/opt/nvidia").glob("nsight-compute/*/ncu"))), "ncu")


def _nvidia_smi() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi: {exc}"


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except SlotError as exc:
        print(f"gpu_slot: {exc}", file=sys.stderr)
        raise SystemExit(2)
