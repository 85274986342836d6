"""What an install puts where: the extra the Makefile picks from the driver, and the NVRTC and
headers found in either pip layout (CUDA 12: nvidia/cuda_nvrtc + cuda_runtime; CUDA 13: nvidia/cu13),
never an NVRTC of one major with the headers of another."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from sharpinf.runtime import paths

REPO = Path(__file__).resolve().parents[1]


# -- the Makefile's choice of extras -------------------------------------------------------------

def fake_smi(tmp_path: Path, header: str | None) -> dict[str, str]:
    """An env whose nvidia-smi prints `header`, or fails like one without a driver (None)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    if header is None:
        smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed: it could not communicate with the driver'\nexit 9\n")
    else:
        smi.write_text(f"#!/bin/sh\necho '+-----+'\necho '| {header} |'\n")
    smi.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("SHARPINF_EXTRAS", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    tools = os.path.dirname(shutil.which("make") or "/usr/bin/make")
    env["PATH"] = os.pathsep.join([str(bin_dir), tools, "/usr/bin", "/bin"])
    return env


SMI_13 = "NVIDIA-SMI 580.95.05   Driver Version: 580.95.05   CUDA Version: 13.0"
SMI_12 = "NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4"


DRIVERS = ["cuda13-driver", "cuda12-driver", "no-driver"]


@pytest.mark.parametrize("header,major", [(SMI_13, "13"), (SMI_12, "12"), (None, "")], ids=DRIVERS)
def test_cuda_major_helper(tmp_path, header, major):
    out = subprocess.run(["sh", str(REPO / ".ci" / "cuda_major")], env=fake_smi(tmp_path, header),
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == major and out.stderr == ""


def planned_install(env: dict[str, str], venv: Path) -> str:
    """`make -n install`: the commands make would run, none of them run."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    out = subprocess.run(["make", "-n", "-C", str(REPO), "install", f"VENV={venv}"], env=env,
                         capture_output=True, text=True, check=True)
    return out.stdout


@pytest.mark.parametrize("header,extras", [(SMI_13, "dev,cuda13"), (SMI_12, "dev,cuda12"), (None, "dev,check")],
                         ids=DRIVERS)
def test_make_install_picks_the_extra_from_the_driver(tmp_path, header, extras):
    plan = planned_install(fake_smi(tmp_path, header), tmp_path / "venv")
    assert set(re.findall(r'-e "\.\[([^\]]*)\]"', plan)) == {extras}  # uv's install and pip's fallback
    assert f".installed-{extras}" in plan  # a change of extras is a new stamp: it reinstalls


def test_make_install_extras_override_and_major_switch(tmp_path):
    env = fake_smi(tmp_path, SMI_13)
    env["SHARPINF_EXTRAS"] = "dev,cuda12"
    plan = planned_install(env, tmp_path / "venv")
    assert set(re.findall(r'-e "\.\[([^\]]*)\]"', plan)) == {"dev,cuda12"}
    assert "uninstall -q -y cupy-cuda13x nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cuda-crt nvidia-cuda-nvdisasm" in plan


def test_no_extra_mixes_cuda_majors():
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert not any("nvidia" in d or "cuda" in d for d in extras["dev"])
    for name, major in (("cuda12", "12"), ("cuda13", "13"), ("check", "12")):
        toolkit = [d for d in extras[name] if d.startswith("cuda-toolkit[")]
        assert len(toolkit) == 1 and toolkit[0].endswith(f"=={major}.*") and "nvrtc" in toolkit[0]
    assert any(d.startswith("cupy-cuda12x") for d in extras["cuda12"])
    assert any(d.startswith("cupy-cuda13x") for d in extras["cuda13"])


# -- the pip layouts -----------------------------------------------------------------------------

def cuda_h(include: Path, version: int) -> Path:
    include.mkdir(parents=True, exist_ok=True)
    (include / "cuda.h").write_text(f"#pragma once\n#define CUDA_VERSION {version}\n")
    (include / "cuda_fp16.h").write_text("#pragma once\n")
    return include


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A fake site-packages `nvidia` namespace, an empty /usr/local/cuda, no cupy loaded."""
    nvidia = tmp_path / "site-packages" / "nvidia"
    nvidia.mkdir(parents=True)
    module = types.ModuleType("nvidia")
    module.__path__ = [str(nvidia)]
    monkeypatch.setitem(sys.modules, "nvidia", module)
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    monkeypatch.setattr(paths, "SYSTEM_CUDA", tmp_path / "usr-local-cuda")
    monkeypatch.delenv("CUDA_PATH", raising=False)
    return nvidia


def install_cu12(nvidia: Path):
    (nvidia / "cuda_nvrtc" / "lib").mkdir(parents=True)
    (nvidia / "cuda_nvrtc" / "lib" / "libnvrtc.so.12").write_bytes(b"")
    return cuda_h(nvidia / "cuda_runtime" / "include", 12090)


def install_cu13(nvidia: Path):
    (nvidia / "cu13" / "lib").mkdir(parents=True)
    (nvidia / "cu13" / "lib" / "libnvrtc.so.13").write_bytes(b"")
    return cuda_h(nvidia / "cu13" / "include", 13000)


def test_cu12_layout(site):
    inc12 = install_cu12(site)
    assert paths.pip_nvrtc_library() == site / "cuda_nvrtc" / "lib" / "libnvrtc.so.12"
    assert paths.nvrtc_major() == 12
    assert paths.cuda_include_dirs() == [inc12] == paths.cuda_include_dirs(12)
    assert paths.cuda_include_dirs(13) == []


def test_cu13_layout(site):
    inc13 = install_cu13(site)
    assert paths.pip_nvrtc_library() == site / "cu13" / "lib" / "libnvrtc.so.13"
    assert paths.pip_nvrtc_library(12) is None
    assert paths.nvrtc_major() == 13
    assert paths.cuda_include_dirs() == [inc13] == paths.cuda_include_dirs(13)
    assert paths.cuda_include_dirs(12) == []


def test_headers_follow_the_nvrtc_major_when_both_are_installed(site, monkeypatch):
    inc12, inc13 = install_cu12(site), install_cu13(site)
    assert paths.cuda_include_dirs(12) == [inc12] and paths.cuda_include_dirs(13) == [inc13]
    assert paths.pip_nvrtc_library(12).name == "libnvrtc.so.12"
    # cupy loaded: its NVRTC is the one in use, whatever pip holds
    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(nvrtc=types.SimpleNamespace(getVersion=lambda: (12, 8)))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    assert paths.nvrtc_major() == 12 and paths.cuda_include_dirs() == [inc12]


def test_system_headers_only_when_their_major_matches(site, tmp_path, monkeypatch):
    system = cuda_h(tmp_path / "usr-local-cuda" / "include", 13000)
    assert paths.header_major(system) == 13
    assert paths.cuda_include_dirs(13) == [system]
    assert paths.cuda_include_dirs(12) == []
    monkeypatch.setenv("CUDA_PATH", str(tmp_path / "cuda-12.4"))
    cuda_path = cuda_h(tmp_path / "cuda-12.4" / "include", 12040)
    assert paths.cuda_include_dirs(12) == [cuda_path]
    assert paths.cuda_include_dirs() == [system]  # no NVRTC at all (the emulator): any headers do


def test_nvrtc_check_compiles_against_its_own_major(site):
    from sharpinf.runtime.nvrtc_check import compile_options

    install_cu12(site), install_cu13(site)
    assert f"-I{site / 'cu13' / 'include'}" in compile_options("sm_90", major=13)
    assert f"-I{site / 'cuda_runtime' / 'include'}" in compile_options("sm_90", major=12)
    assert not any("cu13" in o for o in compile_options("sm_90", major=12))


# -- the wheel ------------------------------------------------------------------------------------

WHEEL_CHECK = """
import json, os, subprocess, sys
import numpy as np
import sharpinf, sharpinf.step.forward, oracles.reference, oracles.paths, bench.suites
from sharpinf.ops import basic
from sharpinf.runtime.paths import kernels_dir
from sharpinf.runtime.select import get_backend
assert sharpinf.__file__.startswith(sys.argv[1]), sharpinf.__file__  # the wheel, not the tree
kernels = kernels_dir()
assert kernels.is_relative_to(sys.argv[1]), kernels
listed = json.loads(subprocess.run([sys.executable, "-m", "sharpinf", "kernels", "list", "--json"],
                                   capture_output=True, text=True, check=True).stdout)
missing = [f for v in listed for f in v["files"] if not (kernels / f).is_file()]
assert listed and not missing, missing
be = get_backend("emu")  # the emulator's sources and the kernel files, from the wheel
x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
w = np.linspace(0.5, 1.5, 64, dtype=np.float32)
y = be.empty((3, 64), np.float32)
basic.rmsnorm(be, be.upload(x), be.upload(w), y, 3, 64, 1e-6)
err = np.abs(be.download(y) - basic.rmsnorm_reference(x, w, 1e-6)).max()
assert err < 1e-5, err
leaked = [m.__name__ for n, m in list(sys.modules.items())
          if n.split(".")[0] in ("sharpinf", "oracles", "bench") and not (getattr(m, "__file__", None) or sys.argv[1]).startswith(sys.argv[1])]
assert not leaked, f"imported from outside the wheel (the editable install's finder): {leaked}"
print("wheel ok", len(listed))
"""


def test_the_wheel_from_a_clean_tree_holds_the_package(tmp_path):
    """Built from the tracked files (git archive: nothing untracked or ignored), installed into a folder of its own: the step,
    the oracles, the bench suites, every registered kernel file and the emulator's sources are in it, and a kernel
    runs from it. What an editable install cannot show: a module left out of pyproject's list."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    src = tmp_path / "src"
    git = ["git", "-C", str(REPO)]
    # the tracked files as they are now (`stash create` snapshots edits without touching the tree)
    tree = subprocess.run(git + ["stash", "create"], capture_output=True, text=True, check=True).stdout.strip()
    archive = subprocess.run(git + ["archive", tree or "HEAD"], capture_output=True, check=True).stdout
    src.mkdir()
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run(pip + ["wheel", "--no-deps", "-w", str(tmp_path / "dist"), str(src)], check=True,
                   capture_output=True)
    wheel, = (tmp_path / "dist").glob("sharpinf-*.whl")
    target = tmp_path / "site"
    subprocess.run(pip + ["install", "--no-deps", "--target", str(target), str(wheel)], check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(target), "SHARPINF_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", WHEEL_CHECK, str(target)], cwd=tmp_path, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0 and "wheel ok" in out.stdout, out.stderr[-3000:]
