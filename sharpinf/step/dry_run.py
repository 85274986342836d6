"""What a step launches, found without launching it: compile ahead, launch counts, the dispatch check.

The step's own launchers run under backend.collecting() (each launch names its (file, entry point);
nothing compiles, nothing runs) over the real workspace and a stand-in descriptor and KV pool, so
the names are exactly what a real step of that size would launch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from sharpinf.model.config import ModelConfig
from sharpinf.ops.variants import check_dispatched, ops_of
from sharpinf.progress import note, progress_bar
from sharpinf.runtime.backend import Backend, Wanted
from sharpinf.step.buffers import StepCapacity, StepDescriptor
from sharpinf.step.launches import StepLaunches

Names = list[tuple[str, str]]  # (file, entry point)


@dataclass(frozen=True)
class _PoolShape:
    """Enough of a KV pool to name the kernels a step needs (compile ahead, before the pool exists)."""

    kv_dtype: str
    block_size: int
    k: list
    v: list


@dataclass
class DryRun:
    backend: Backend
    cfg: ModelConfig
    launches: StepLaunches
    capacity: StepCapacity

    def launch_names(self, kv_dtype: str, tokens: int = 1, mode: str | None = None) -> tuple[Wanted, Wanted]:
        """(file, entry point) of every launch of a body of `tokens` tokens and of a sampling head
        of as many rows, in order, with KV in kv_dtype. The attention in the launch shape `mode`
        ("split", "walk": each window the variant can walk), or as its rule takes it for a step of
        unknown contexts."""
        be, sk = self.backend, self.launches.step_kernels
        # the capacity's sequence count, as every real step's descriptor carries it (flash attention's
        # launch shape depends on it: ops/attention.py's walks)
        shape = StepDescriptor(be, StepCapacity(tokens, self.capacity.seqs, tokens, 1), 1, 16, 0)
        pool = _PoolShape(kv_dtype, 16, [be.empty((1,), np.uint8)] * self.cfg.n_layer,
                          [be.empty((1,), np.uint8)] * self.cfg.n_layer)
        shapes = sk.attention_shapes(kv_dtype, tokens, shape.cap.seqs + 1, None, mode)
        with be.collecting() as body:
            self.launches.body(tokens, pool, shape, shapes)
        with be.collecting() as head:
            self.launches.head(tokens, True, shape)
        return body, head

    def kernels_used(self, kv_dtype: str) -> Names:
        """(file, entry point) of every kernel a step runs with KV in kv_dtype (and the history
        flush a long penalised prompt needs, so it never compiles mid-serving). Kernels that
        depend on the step's size are collected at the sizes that switch them: the token counts gemv's
        decode kernels compile (1, 2, 4, 8: matmul=gemv, moe=gemv), a whole tile of tokens (mma, mmq:
        16), best's threshold (64), and the capacity (best takes mmq for a matrix once the step's grid
        fills the GPU, and no step is larger); the attention in each launch shape (a step's contexts
        choose it: attention_shapes)."""
        sizes = sorted({1, 2, 4, 8, 16, 64, self.capacity.tokens})
        modes = (None, "split", "walk") if self.launches.step_kernels.attn.shape else (None,)
        names = [n for size in sizes for mode in modes for part in self.launch_names(kv_dtype, size, mode)
                 for n in (*part, *part.also)]  # also: kernels a launch may take instead (matmul=timed's)
        return list(dict.fromkeys(names + [("sampling.cu", "seen_update")]))

    def check_dispatch(self, kv_dtype: str) -> Names:
        """A chosen variant's launches come from its own kernels (ops/variants.py, check_dispatched);
        returns kernels_used, which the check reads."""
        used = self.kernels_used(kv_dtype)
        check_dispatched(self.launches.step_kernels.choice, {f for f, _ in used}, ops_of(self.cfg))
        return used

    def launches_per_layer(self, kv_dtype: str) -> int:
        """Kernel launches of one transformer layer (a decode step runs n_layer of these, plus the
        embedding and the head)."""
        body, _ = self.launch_names(kv_dtype)
        return (len(body) - 1) // self.cfg.n_layer  # the embedding is the one launch outside the layers

    def graph_launches(self, kv_dtype: str, token_buckets: int, row_buckets: int) -> int:
        """Kernel launches the graphs of capture_graphs() hold (for the memory estimate): a body a token
        bucket, on a GPU up to one more for each window whose attention can walk (a window's shape
        flips once as the contexts grow: ops/attention.py's walks_pays), and a head a row bucket."""
        body, head = self.launch_names(kv_dtype)
        sk, shapes = self.launches.step_kernels, 1
        if sk.attn.shape and self.backend.multiprocessors:
            with self.backend.collecting():
                walked = sk.attention_shapes(kv_dtype, 1, self.capacity.seqs + 1, None, "walk")
            shapes += walked.count("walk")
        return len(body) * token_buckets * shapes + len(head) * row_buckets


def compile_ahead(be: Backend, wanted: Names) -> dict:
    """Compile those entry points (disk-cached), a file at a time; returns what compile_report says."""
    files = list(dict.fromkeys(f for f, _ in wanted))
    t0 = time.perf_counter()
    with progress_bar("compiling kernels", len(files)) as advance:
        be.compile(wanted, progress=advance)
    secs = time.perf_counter() - t0
    note(f"compiled {len(wanted)} kernels from {len(files)} files in {secs:.1f} s")
    return {"entry_points": len(wanted), "files": len(files), "seconds": round(secs, 3)}
