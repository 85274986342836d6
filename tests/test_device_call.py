"""bench/device_call.sh is what a lent GPU runs: 15 device minutes a session, in few sessions, so a
command line that its CLI refuses costs a measurement nobody can take again soon. In its dry mode
(DEVICE_DRY=1) every `sharpinf bench` run of every stage goes through the CLI's --dry-run -- the
suites, sizes, --kernels, --op, --variant and the model's name checked, nothing loaded -- and
gpu_check.py's through its own (parts, peers sizes); the script fails if any is refused. No GPU, no
model, ~10 s. And every probe define it compiles the kernels with is one a kernel reads."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_bench_command_of_the_device_call_holds(tmp_path):
    env = {**os.environ, "DEVICE_DRY": "1", "OUT": str(tmp_path),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}  # python3: this venv's
    before = set((ROOT / "bench" / "results" / "gpu").iterdir())
    p = subprocess.run(["bash", "bench/device_call.sh", "peers,moe,kernels,probes,ncu,tests"],
                       cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    m = re.search(r"dry run: (\d+) bench commands checked, 0 failed", p.stdout)
    assert m and int(m.group(1)) >= 20, p.stdout[-2000:]
    assert set((ROOT / "bench" / "results" / "gpu").iterdir()) == before  # nothing written in the tree


def test_every_probe_define_of_the_device_call_is_a_kernels_knob():
    """A probe run compiles the kernels with -DNAME=VALUE (SHARPINF_NVRTC_OPTIONS); a NAME no kernel reads
    is silently ignored -- the run would time the committed kernels under a probe's name. Each NAME the
    script passes is one a kernels_cu/ source defaults with #ifndef NAME."""
    from sharpinf.runtime.paths import kernels_dir

    script = (ROOT / "bench" / "device_call.sh").read_text()
    names = {n for opts in re.findall(r"SHARPINF_NVRTC_OPTIONS=(\"[^\"]*\"|\S+)", script)
             for n in re.findall(r"-D(\w+)", opts)}
    assert len(names) >= 8, names
    sources = "".join(p.read_text() for p in kernels_dir().iterdir() if p.suffix in (".cu", ".cuh"))
    knobs = set(re.findall(r"#ifndef (\w+)", sources))
    assert not names - knobs, f"probe defines no kernel reads: {sorted(names - knobs)}"
