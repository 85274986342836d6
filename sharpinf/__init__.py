"""sharpinf: LLM inference research toolkit.

Every op of the forward pass is CUDA C in kernels_cu/, run by NVRTC/CuPy on a GPU
or by the CPU emulator elsewhere; oracles/ holds the NumPy truth.
"""

__version__ = "0.1.0"
