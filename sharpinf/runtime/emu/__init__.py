"""The CPU emulator of the CUDA execution model: C++ runtime (cuda_emu.h,
emu_sched.cpp, emu_fiber.cpp) plus the Python glue that builds kernel sources
with g++ (build.py), loads and launches them (module.py), records graphs
(graph.py) and runs risky kernels in a child process (isolate.py)."""

from pathlib import Path

EMU_DIR = Path(__file__).resolve().parent
