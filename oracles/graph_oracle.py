"""The graph-vs-eager oracle: a step replayed from a CUDA graph gives the bits eager mode gives.

The same schedule of steps (prefill, chunked prefill, decode, mixed; every sequence's last
token sampling with its own parameters and repetition-penalty history) runs twice over
fresh, equally placed KV pools:
  eager  each step launched one by one at its exact shape (no padding);
  graphs each step padded to its bucket and replayed from graphs captured once at start.
Logits and sampled ids must be bit-identical: by design a token's result depends neither on
padding nor on how the launches reach the GPU. On the emulator, "graphs" are its recorded
launches, which also catch a buffer reallocated after capture.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oracles.compare import OracleResult, nonfinite
from oracles.paged_runner import PagedRunner
from sharpinf.step.forward import ForwardPass
from sharpinf.step.kv_pool import KVPool
from sharpinf.step.buffers import SamplingRows, StepCapacity

Step = list[tuple[int, int]]  # (sequence, tokens fed this step)


@dataclass
class Schedule:
    tokens: list[list[int]]  # each sequence's tokens, fed in order (teacher-forced)
    steps: list[Step]
    params: list[tuple[float, float, float, float, int]]  # per sequence: temperature, top_p, min_p, penalty, top_k

    def capacity(self) -> StepCapacity:
        most = max(sum(n for _, n in st) for st in self.steps)
        S = len(self.tokens)
        return StepCapacity(tokens=most, seqs=S, rows=S, history=most + S)

    def describe(self) -> str:
        kinds = {"prefill" if all(n > 1 for _, n in st) else "decode" if all(n == 1 for _, n in st) else "mixed"
                 for st in self.steps}
        return f"{len(self.tokens)} seqs, {len(self.steps)} steps ({', '.join(sorted(kinds))})"


def standard_schedule(n_vocab: int, seed: int = 0) -> Schedule:
    """Three sequences: a whole prefill, a chunked prefill beside decodes, then batched decodes."""
    rng = np.random.default_rng(seed)
    lens = [23, 9, 40]
    tokens = [rng.integers(0, n_vocab, n + 6).tolist() for n in lens]
    steps = [[(0, 23), (1, 9)], [(0, 1), (1, 1), (2, 17)], [(0, 1), (1, 1), (2, 23)]]
    steps += [[(0, 1), (1, 1), (2, 1)] for _ in range(4)]
    params = [(0.0, 1.0, 0.0, 1.0, 0), (0.8, 0.9, 0.0, 1.3, 40), (1.2, 1.0, 0.05, 1.0, 0)]
    return Schedule(tokens, steps, params)


class _Driver:
    """A PagedRunner plus the per-sequence sampling state the engine's ModelRunner keeps."""

    def __init__(self, fp: ForwardPass, sched: Schedule, kv_dtype: str, block_size: int, seed: int):
        need = sum(-(-len(t) // block_size) for t in sched.tokens) + 2
        pool = KVPool(fp.backend, fp.cfg, num_blocks=need, block_size=block_size, kv_dtype=kv_dtype)
        pool.poison()
        self.run = PagedRunner(fp, pool, seed=seed)
        self.sids = [self.run.new_seq() for _ in sched.tokens]
        self.sched, self.fed, self.synced = sched, [0] * len(sched.tokens), [0] * len(sched.tokens)

    def step(self, st: Step) -> tuple[np.ndarray, np.ndarray]:
        sched = self.sched
        work = [(self.sids[s], sched.tokens[s][self.fed[s] : self.fed[s] + n]) for s, n in st]
        for s, n in st:
            self.fed[s] += n
        # a penalised sequence has presence/frequency penalties too: its slot's generated counts,
        # which the kernel itself increments, must come out the same padded or not
        params = np.array([[*sched.params[s][:4], *((0.5, 0.25) if sched.params[s][3] != 1.0 else (0.0, 0.0))]
                           for s, _ in st], np.float32)
        slots = np.array([s if sched.params[s][3] != 1.0 else -1 for s, _ in st], np.int32)
        clear = np.array([int(self.synced[s] == 0 and slots[r] >= 0) for r, (s, _) in enumerate(st)], np.int32)
        adds = [sched.tokens[s][self.synced[s] : self.fed[s]] if slots[r] >= 0 else [] for r, (s, _) in enumerate(st)]
        for r, (s, _) in enumerate(st):
            if slots[r] >= 0:
                self.synced[s] = self.fed[s]
        rows = SamplingRows(params, np.array([sched.params[s][4] for s, _ in st], np.int32),
                            np.array([1000 + s for s, _ in st], np.uint64), np.array([self.fed[s] for s, _ in st], np.int32),
                            slots, clear, np.concatenate([[0], np.cumsum([len(a) for a in adds])]).astype(np.int32),
                            np.array([t for a in adds for t in a], np.int32))
        logits = self.run.step(work, sampling=rows)
        return np.concatenate(logits), self.run.last_sampled


def oracle_graph_vs_eager(fp: ForwardPass, sched: Schedule, kv_dtype: str = "f16", block_size: int = 16,
                          seed: int = 0) -> OracleResult:
    cap = sched.capacity()
    eager = fp.with_own_buffers(cap)
    eager.exact_shapes = True
    graphed = fp.with_own_buffers(cap)
    e = _Driver(eager, sched, kv_dtype, block_size, seed)
    g = _Driver(graphed, sched, kv_dtype, block_size, seed)
    report = graphed.capture_graphs(g.run.pool)
    case = f"{sched.describe()}, {report['graphs']} graphs, KV {kv_dtype}"
    for i, st in enumerate(sched.steps):
        le, se = e.step(st)
        lg, sg = g.step(st)
        bad = nonfinite(lg, le, "graphs", "eager")
        if bad:
            return OracleResult("graph-vs-eager", case, None, None, None, False, f"step {i}: {bad}")
        if not np.array_equal(le.view(np.uint32), lg.view(np.uint32)):
            d = float(np.max(np.abs(le.astype(np.float64) - lg)))
            return OracleResult("graph-vs-eager", case, d, None, None, False, f"step {i}: logits differ (max {d:.2e})")
        if not np.array_equal(se, sg):
            return OracleResult("graph-vs-eager", case, 0.0, None, None, False, f"step {i}: sampled {sg} vs eager {se}")
    want = 2 * len(sched.steps)  # body and head of every step came from a graph, never a fallback
    if graphed.graph_replays != want or eager.graph_replays != 0:
        return OracleResult("graph-vs-eager", case, 0.0, None, None, False,
                            f"{graphed.graph_replays} graph replays for {want} plans (eager: {eager.graph_replays})")
    return OracleResult("graph-vs-eager", case, 0.0, None, None, True, "bit-identical")
