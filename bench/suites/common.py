"""What the benchmark suites share: the run context, timers, statistics, results, plots.

Timing rule: a GPU runs kernels asynchronously, so every timer reading is preceded by
`backend.synchronize()` (`timed` and `Stopwatch` do it); on the emulator it is a no-op.
"""

from __future__ import annotations

import gc
import json
import math
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sharpinf.runtime.backend import Backend

SYNTH_NAME = "synth"
SYNTH_KW = dict(n_embd=128, n_layer=2)  # the default model: synthetic llama, Q8_0


def default_model_path() -> Path:
    from sharpinf.model.synth import synthetic_model

    return synthetic_model("llama", "Q8_0", **SYNTH_KW)


SHAPE_MARK = "-shape:"  # SHAPE-shape:TYPE, e.g. qwen3-8b-shape:Q4_K


def parse_shape(model: str) -> tuple[str, str]:
    """SHAPE-shape:TYPE -> (SHAPE, TYPE), SHAPE one of sharpinf.model.shapes.SHAPES."""
    from sharpinf.errors import SharpinfError
    from sharpinf.model.shapes import SHAPES

    name, qtype = model.split(SHAPE_MARK, 1)
    if name not in SHAPES:
        raise SharpinfError(f"no shape {name!r}: the shapes are {', '.join(SHAPES)}")
    return name, qtype


def check_context(context_length: int, context: int, prefill_context: Sequence[int] = ()) -> None:
    """ValueError where a suite's sequences (decoding at `context`, prompts of `prefill_context`) do not fit
    the model's context length -- the suites' check, and the dry run's before anything loads."""
    if context + 1 >= context_length:
        raise ValueError(f"context {context} does not fit the model's context length {context_length}")
    too_long = [P for P in prefill_context if P > context_length]
    if too_long:
        raise ValueError(f"prefill length {too_long[0]} does not fit the model's context length {context_length}")


def resolve_bench_model(model: str | None) -> tuple[Path, str]:
    """(path, label): None or "synth" -> the synthetic default; SHAPE-shape:TYPE -> a benchmark
    model of a real model's shape in TYPE (sharpinf.model.shapes.SHAPES, tiled random weights, made
    once); else a registered name or a path."""
    if model is None or model == SYNTH_NAME:
        return default_model_path(), f"synthetic llama Q8_0 (n_embd={SYNTH_KW['n_embd']}, n_layer={SYNTH_KW['n_layer']})"
    if SHAPE_MARK in str(model):
        from sharpinf.model.shapes import shape_model

        return shape_model(*parse_shape(str(model))), str(model)
    from sharpinf.model.registry import resolve_model

    return resolve_model(model), str(model)


@dataclass
class BenchContext:
    backend: Backend
    model: Any  # LoadedModel
    model_label: str
    out_dir: Path
    quick: bool = False
    console: Console = field(default_factory=lambda: Console(highlight=False))
    seed: int = 0
    kernels: Any = "auto"  # the kernel variants every suite runs (ops/variants.py)
    _fp: Any = field(default=None, repr=False)

    @property
    def on_gpu(self) -> bool:
        return self.backend.name == "cuda"

    def row_log(self, suite: str) -> "RowLog":
        """The suite's rows, each written to OUT/<suite>.rows.jsonl as it is measured (RowLog)."""
        return RowLog(self.out_dir / f"{suite}{ROWS_SUFFIX}",
                      {"suite": suite, "model": self.model_label, "backend": self.backend.name,
                       "kernels": kernels_name(self)})

    def forward_pass(self):
        """One ForwardPass (weights uploaded once) shared by the suites that drive it directly."""
        if self._fp is None:
            from sharpinf.step.forward import ForwardPass

            self._fp = ForwardPass(self.model, self.backend, kernels=self.kernels)
        return self._fp

    def progress(self) -> Progress:
        return Progress(TextColumn("{task.description}", markup=False, style="bold"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=self.console, transient=False)

    def release(self) -> None:
        """Give device memory back between suites (CuPy keeps freed blocks in its pool, which the
        next engine's KV budget would otherwise count as used); the shared ForwardPass's plans
        go too, since they hold the last suite's KV pool."""
        if self._fp is not None:
            self._fp.release_plans()
        gc.collect()
        if self.on_gpu:
            try:
                import cupy

                self.backend.synchronize()
                cupy.get_default_memory_pool().free_all_blocks()
            except Exception:
                pass


# -- timing ----------------------------------------------------------------------------------
def read_result_files(paths: Sequence[Path], tool: str) -> list[dict] | None:
    """The bench JSON documents at `paths` (the scripts in bench/ that read a run's results), or None
    after one line on stderr naming the file that does not read."""
    import sys

    docs = []
    for f in paths:
        try:
            docs.append(json.loads(Path(f).read_text()))
        except (OSError, ValueError) as exc:
            print(f"{tool}: {f}: {exc}", file=sys.stderr)
            return None
    return docs


def timed(backend: Backend, fn: Callable[[], Any]) -> float:
    """Seconds fn takes, device work included."""
    backend.synchronize()
    t0 = time.perf_counter()
    fn()
    backend.synchronize()
    return time.perf_counter() - t0


def repeat_timed(backend: Backend, fn: Callable[[], Any], repeats: int, warmup: int = 1) -> list[float]:
    for _ in range(warmup):
        fn()
    return [timed(backend, fn) for _ in range(repeats)]


def launch_timed(backend: Backend, calls: Sequence[Callable[[], Any]], repeats: int, min_calls: int = 32,
                 budget_s: float = 0.5) -> list[float]:
    """Device seconds per call of a kernel (or a few), one value per repeat.

    The calls' launches are recorded once. On a GPU they are captured into one CUDA graph that
    runs them back to back, repeated until a replay holds >= min_calls calls: one call's launch
    and a host sync would otherwise be most of what a microsecond kernel's timing measures. Give
    several calls over copies of the inputs (`calls`) so that together they exceed the L2 cache,
    or the numbers are the cache's, not the device memory's. Repeats stop at about budget_s of
    replays (at least 3). Elsewhere (the emulator) each repeat runs the recorded launches once."""
    with backend.recording() as plan:
        for call in calls:
            call()
    reps = -(-min_calls // len(calls)) if backend.gpu_shapes else 1
    n = reps * len(calls)
    with backend.capture() as graph:
        for _ in range(reps):
            backend.run(plan)
    warm = timed(backend, graph.replay)  # warm-up; a long replay (a big matrix) is repeated less
    repeats = max(3, min(repeats, int(budget_s / max(warm, 1e-9)))) if backend.gpu_shapes else repeats
    return [timed(backend, graph.replay) / n for _ in range(repeats)]


# -- statistics ------------------------------------------------------------------------------
def pct(xs, q: float) -> float | None:
    xs = [x for x in xs if x is not None]
    return float(np.percentile(xs, q)) if xs else None


def stats(xs) -> dict:
    """mean / p50 / p99 / max / n of a list (None entries dropped)."""
    xs = [float(x) for x in xs if x is not None]
    if not xs:
        return {"n": 0, "mean": None, "p50": None, "p99": None, "max": None}
    return {"n": len(xs), "mean": float(np.mean(xs)), "p50": pct(xs, 50), "p99": pct(xs, 99), "max": max(xs)}


def fmt_ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.2f}"


def fmt_rate(r: float | None) -> str:
    return "-" if r is None or not math.isfinite(r) else f"{r:,.1f}"


# -- results ---------------------------------------------------------------------------------
def device_facts(backend: Backend) -> dict:
    try:
        d = backend.describe()
    except Exception as exc:  # a describe() failure must not lose a benchmark
        d = {"backend": backend.name, "describe_error": str(exc)}
    name = d.get("gpu") or d.get("device")
    return {"name": str(name), "describe": d}


def model_facts(ctx: BenchContext) -> dict:
    from dataclasses import asdict

    cfg = ctx.model.config
    return {"label": ctx.model_label, "path": str(ctx.model.path), "config": asdict(cfg),
            "weight_bytes": int(sum(int(t.nbytes) for t in ctx.model.tensors.values()))}


def kernels_name(ctx: BenchContext) -> str:
    """The kernel set the suites ran, as resolved for this model and backend."""
    from sharpinf.ops.variants import resolve_kernels

    return resolve_kernels(ctx.kernels, ctx.model.config, ctx.backend).name


def envelope(ctx: BenchContext, suite: str, config: dict, results: dict) -> dict:
    """One suite's JSON: what ran where, its settings, and its numbers (with matmul=timed, the shapes
    it timed and what each chose)."""
    from sharpinf.ops.matmul_tuned import tuned_report

    tuned = tuned_report(ctx.backend)
    return {
        "suite": suite,
        "backend": ctx.backend.name,
        "device": device_facts(ctx.backend),
        "model": model_facts(ctx),
        "kernels": kernels_name(ctx),
        "config": config,
        "results": results,
        "host": {"python": platform.python_version(), "machine": platform.machine()},
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "quick": ctx.quick,
        **({"matmul_tuned": tuned} if tuned else {}),
    }


def _jsonable(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def write_json(path: Path, obj: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, default=_jsonable) + "\n")
    return path


ROWS_SUFFIX = ".rows.jsonl"


class RowLog(list):
    """A suite's rows, each also appended to `path` (JSON Lines) and flushed the moment it is measured:
    a run cut short -- a GPU slot's timeout, a kill -- keeps every row it finished. The suite's JSON
    replaces the file when the run ends (`finish_rows`); one left behind marks a cut run."""

    def __init__(self, path: Path, head: dict | None = None):
        super().__init__()
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # a fresh run's rows, not an earlier cut run's; the first line says what they are of
        self.path.write_text(json.dumps({"head": head or {}}) + "\n")

    def append(self, row: dict) -> None:
        super().append(row)
        with open(self.path, "a") as f:  # reopened a row: nothing held in a buffer when the kill comes
            f.write(json.dumps(row, default=_jsonable) + "\n")


def finish_rows(json_path: Path) -> None:
    """The suite's JSON is written: its partial rows file goes (the JSON holds them all)."""
    rows = json_path.with_suffix(ROWS_SUFFIX)
    if rows.exists():
        os.unlink(rows)


def read_rows(path: Path) -> tuple[dict, list[dict]]:
    """(head, rows) a cut run left (RowLog): every whole line; a line the kill broke off is dropped."""
    head, rows = {}, []
    for line in Path(path).read_text().splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            break
        if isinstance(d, dict) and set(d) == {"head"}:
            head = d["head"]
        else:
            rows.append(d)
    return head, rows


def dumps(obj) -> str:
    return json.dumps(obj, default=_jsonable)


# -- plots -----------------------------------------------------------------------------------
def pyplot():
    """matplotlib.pyplot on the Agg backend, or None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def latency_cdf(ax, seconds, name: str, unit: str) -> None:
    """A latency's CDF on ax in ms, with its p50 and p99 marked; unit names what a sample is."""
    xs = np.sort(np.asarray(seconds, dtype=float)) * 1e3
    if len(xs):
        ax.step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post")
        for q, style in ((50, "--"), (99, ":")):
            ax.axvline(np.percentile(xs, q), color="gray", ls=style, lw=1, label=f"p{q} {np.percentile(xs, q):.1f} ms")
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xlabel(f"{name} (ms)")
    ax.set_ylabel(f"fraction of {unit}")
    ax.set_title(f"{name} CDF")
    ax.grid(alpha=0.3)


def title_of(doc: dict) -> str:
    return f"{doc['model']['label']} on {doc['device']['name']} ({doc['backend']})"


def save_fig(plt, fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def random_prompt(rng: np.random.Generator, n: int, n_vocab: int) -> list[int]:
    """n token ids away from the low ids (special tokens live there in real vocabularies)."""
    lo = min(16, n_vocab - 1)
    return rng.integers(lo, n_vocab, size=n).tolist()
