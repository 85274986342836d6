"""sharpinf: LLM inference research toolkit.

Every op of the forward pass is CUDA C in kernels_cu/, run by NVRTC/CuPy on a GPU
or by the CPU emulator elsewhere; oracles/ holds the NumPy truth.
"""

import os as _os

__version__ = "0.1.0"


def _point_cupy_cache_at_ours() -> None:
    # CuPy may read CUPY_CACHE_DIR when it is imported, and any module could import it first:
    # set it before any of ours can, unless the user chose one.
    from sharpinf.runtime.paths import cache_root

    _os.environ.setdefault("CUPY_CACHE_DIR", str(cache_root() / "cupy"))


_point_cupy_cache_at_ours()
