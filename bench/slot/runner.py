"""One run of the plan: its placeholders filled, the gate's failed variants left out of it, then run under its
timeout (a real clock: the command, its output to a log; a cut sends SIGINT, then SIGKILL to its process
group) or walked (the dry run's fake clock: the run "takes" its expected seconds or those GPU_SLOT_FAKE gives,
and every `sharpinf bench`, gpu_check.py and single_stream.py command line is checked by its own --dry-run)."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.slot.plan import ROOT, Run

KILL_GRACE_S = 5  # after SIGINT, before SIGKILL: a suite's KeyboardInterrupt unwinds, its rows are on disk already


@dataclass
class Ctx:
    """What the placeholders stand for, and the variants the gate failed."""
    py: str
    run_dir: Path
    llama: str = "committed"
    smol: str = "smollm2-135m-shape:Q4_1"
    xdist: tuple[str, ...] = ()
    ncu: str = "ncu"
    excluded: dict[str, list[str]] = field(default_factory=dict)

    def fill(self, argv: tuple[str, ...]) -> list[str]:
        subs = {"{py}": self.py, "{run}": str(self.run_dir), "{results}": str(self.run_dir.parent),
                "{llama}": self.llama, "{smol}": self.smol, "{ncu}": self.ncu}
        out: list[str] = []
        for a in argv:
            if a == "{xdist}":
                out += self.xdist
                continue
            for k, v in subs.items():
                a = a.replace(k, v)
            out.append(a)
        return out


def kernels_spec(argv: list[str]) -> dict[str, str]:
    """{op: variant} of a run's --kernels (a set, or op=variant,...); {} without one."""
    from sharpinf.ops.variants import SETS, KernelChoice

    if "--kernels" not in argv:
        return {}
    spec = argv[argv.index("--kernels") + 1]
    return dict(SETS[spec]) if spec in SETS else KernelChoice.parse(spec).to_json()


def leave_out(run: Run, argv: list[str], excluded: dict[str, list[str]]) -> tuple[list[str] | None, str]:
    """(the argv with the gate's failed variants left out, a note), or (None, why) when the run would time
    nothing but them: a --kernels choice holding one, or a --variant list holding only them."""
    if not excluded:
        return argv, ""
    bad = {(op, v) for op, names in excluded.items() for v in names}
    hit = sorted(f"{op}={v}" for op, v in kernels_spec(argv).items() if (op, v) in bad)
    if hit:
        return None, f"its kernels hold {', '.join(hit)}, which failed the gate"
    if not run.ops:
        return argv, ""
    from sharpinf.ops.variants import variants_of

    names = {n for op in run.ops for n in excluded.get(op, [])}
    if not names:
        return argv, ""
    if "--variant" in argv:
        i = argv.index("--variant") + 1
        keep = [v for v in argv[i].split(",") if v not in names]
        if not keep:
            return None, f"every variant it times ({argv[i]}) failed the gate"
        return argv[:i] + [",".join(keep)] + argv[i + 1:], f"left out {', '.join(sorted(names))} (failed the gate)"
    keep = [v for op in run.ops for v in variants_of(op) if v not in names]
    at = argv.index("--out")
    return (argv[:at] + ["--variant", ",".join(dict.fromkeys(keep))] + argv[at:],
            f"left out {', '.join(sorted(names))} (failed the gate)")


@dataclass
class Outcome:
    rc: int
    seconds: float
    cut: bool


class RealClock:
    def __init__(self):
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def execute(self, run: Run, argv: list[str], timeout: float, log: Path) -> Outcome:
        env = {**os.environ, **run.env, "PYTHONUNBUFFERED": "1"}
        t = self.now()
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as f:
            f.write("+ " + " ".join(argv) + "\n")
            f.flush()
            try:
                p = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                                     start_new_session=True)  # its own group: a cut reaches its children too
            except OSError as exc:
                f.write(f"could not start: {exc}\n")
                return Outcome(127, self.now() - t, False)
            try:
                return Outcome(p.wait(timeout=max(timeout, 0.1)), self.now() - t, False)
            except subprocess.TimeoutExpired:
                _stop(p)
                f.write(f"\ncut at its limit of {timeout:.0f} s\n")
                return Outcome(124, self.now() - t, True)


def _stop(p: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGINT, KILL_GRACE_S), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, sig)
        try:
            p.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


class FakeClock:
    """The dry run's clock: each run takes `seconds[run.id]` (GPU_SLOT_FAKE), else its expected seconds; a run
    given more than its timeout is cut there. Command lines are checked, nothing runs."""

    def __init__(self, seconds: dict[str, float] | None = None):
        self.t = 0.0
        self.seconds = seconds or {}
        self.checked: list[tuple[str, str]] = []  # (run id, what checked it)
        self.failed: list[str] = []

    def now(self) -> float:
        return self.t

    def execute(self, run: Run, argv: list[str], timeout: float, log: Path) -> Outcome:
        ok, how, text = check_command(argv, run.env)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("+ " + " ".join(argv) + f"\n[dry: {how}]\n{text}")
        if how != "named":
            self.checked.append((run.id, how))
        if not ok:
            self.failed.append(f"{run.id}: {text.strip().splitlines()[-1] if text.strip() else 'refused'}")
        took = float(self.seconds.get(run.id, run.expected_s))
        cut = took > timeout
        self.t += min(took, timeout)
        return Outcome(124 if cut else (0 if ok else 2), min(took, timeout), cut)


def check_command(argv: list[str], env: dict) -> tuple[bool, str, str]:
    """(holds, what checked it, its output): the command line through its own --dry-run, in this process
    (a CLI start a command would cost the CI test a second each)."""
    rest = argv[1:]
    if rest[:3] == ["-m", "sharpinf", "bench"]:
        return _in_process(lambda: _cli(rest[2:] + ["--dry-run"]), "sharpinf bench --dry-run", env)
    for script in ("bench/gpu_check.py", "bench/single_stream.py"):
        if rest[:1] == [script]:
            return _in_process(lambda: _script(script, rest[1:] + ["--dry-run"]), f"{Path(script).name} --dry-run", env)
    return True, "named", ""


def _cli(args: list[str]) -> int:
    from sharpinf.cli import main

    try:
        main(args)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def _script(script: str, args: list[str]) -> int:
    import importlib.util

    sys.path.insert(0, str(ROOT / "bench"))  # the script's own folder, as when it is run
    argv, sys.argv = sys.argv, [script] + args
    try:
        spec = importlib.util.spec_from_file_location(f"slot_dry_{Path(script).stem}", ROOT / script)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        try:
            return int(mod.main() or 0)
        except SystemExit as exc:
            return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    finally:
        sys.argv = argv
        sys.path.remove(str(ROOT / "bench"))


def _in_process(fn, how: str, env: dict) -> tuple[bool, str, str]:
    buf = io.StringIO()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # a probe's SHARPINF_NVRTC_OPTIONS, as the command would see it
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            rc = fn()
    except Exception as exc:  # a check that breaks is a refused command, said in its log
        rc, _ = 2, buf.write(f"{type(exc).__name__}: {exc}\n")
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    return rc == 0, how, buf.getvalue()
