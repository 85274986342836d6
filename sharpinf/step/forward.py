"""ForwardPass: one step of the transformer over a packed, paged Batch, every op a kernel.

Prefill, chunked prefill, decode and mixed steps are the same call: the Batch says
which tokens of which sequences run and where their KV lives. Per layer:

    h   = rmsnorm(x) * attn_norm
    qkv = h @ [Wq; Wk; Wv]^T (+ bias)                   [N, q_dim + 2 kv_dim]
    q,k = rmsnorm per head (qwen3), then rope at each token's absolute position
    K/V of this step -> paged cache via slot_mapping
    o   = varlen paged causal attention
    x  += o @ Wo^T
    x  += (silu(h2 @ Wg^T) * (h2 @ Wu^T)) @ Wd^T        h2 = rmsnorm(x) * ffn_norm
(gemma3: each layer's sliding window and RoPE base, GELU for silu, and each sublayer's output
through its post-norm before the add; qwen3moe: the FFN is the router's k experts of each token,
weighted and added in rank order, the `moe` op; ModelConfig says which.)
then only the rows that want logits: gather -> final rmsnorm -> LM head -> (sampling).
Which kernels do each op is the `kernels` choice (ops/variants.py; step/kernels.py emits them;
`sharpinf kernels list` shows every variant and set); "auto" (the default) is fast on a GPU, simple on the emulator.

How a step runs (see step/buffers.py and step/plan.py): the activations live in a
Workspace allocated once; the batch is written into one pinned staging buffer and sent
with one copy; the step is padded up to its bucket (Nb tokens, Rb rows) and runs as two
plans -- lists of launches prepared once per bucket over those fixed buffers -- which
eager mode runs and capture_graphs() turns into CUDA graphs; the sampled ids come back
through pinned memory. A step is submit() (everything up to the async copy of the sampled ids,
then a marker) and PendingStep.result() (wait for that marker only): two pinned staging
buffers used in turn let step n+1 be packed and queued while step n runs, its decode tokens
fed on the device from step n's sampled ids (feed_rows); forward() is submit + result.
Kernels are compiled at construction, only the entry points this model uses.
"""

from __future__ import annotations

import copy
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from sharpinf.step.batch import Batch
from sharpinf.step.weights import upload_weights
from sharpinf.errors import BackendError
from sharpinf.step.kv_pool import KVPool
from sharpinf.model.config import ModelConfig
from sharpinf.model.loader import LoadedModel
from sharpinf.ops.embedding import embed
from sharpinf.ops.sampling import BIAS_STRIDE, count_words, history_words, seen_update
from sharpinf.ops.variants import KernelChoice, check_dispatched, ops_of, resolve_kernels
from sharpinf.progress import note, progress_bar
from sharpinf.runtime.backend import Backend, Wanted
from sharpinf.step.buffers import SamplingRows, StepCapacity, StepDescriptor, Workspace
from sharpinf.step.kernels import StepKernels
from sharpinf.step.plan import PlanCache, bucket_for, bucket_ladder


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


DEFAULT_CAPACITY = StepCapacity(tokens=64, seqs=8, rows=8, history=64)
KV_SHAPE_KEYS = 32  # a step's longest context, rounded up to this, picks the attention's launch shape (its
                    # smallest partition: the rule counts partitions, so the rounding changes no choice)


@dataclass
class StepOutput:
    logits: Any  # device float32 [R, vocab], R = len(batch.logits_rows): a workspace view, valid until the next step
    sampled: np.ndarray | None  # host int32 [R]: the chosen ids, when the step sampled


@dataclass(eq=False)
class PendingStep:
    """A submitted step: its work is queued on the device; result() waits for its end marker only
    (recorded after the copy of its sampled ids), never for steps submitted after it."""

    backend: Backend
    logits: Any  # device float32 [R, vocab]: a workspace view, valid until the next step's head runs
    host_ids: np.ndarray | None  # pinned int32 [R] the sampled ids arrive in; None: the step samples nothing
    done: Any  # the backend's marker after the step's last queued work
    logits_host: np.ndarray | None = None  # float32 [len(copy_rows), vocab], valid once result() returned
    sampled: np.ndarray | None = None  # the ids, once result() has taken them

    taken: bool = False  # result() has waited (its buffers may be used again)
    # submitted with masks_later: (rows padded, staging buffer) until ForwardPass.sample() queues its sampling
    deferred: tuple[int, int] | None = None

    def result(self) -> StepOutput:
        """Wait for this step's ids (and copied logits rows); the StepOutput forward() returns. A step
        that brings nothing back (no sampling, no copied rows) waits for nothing, as forward() never did."""
        if self.deferred is not None:
            raise RuntimeError("a step submitted with masks_later has no ids until ForwardPass.sample() queues "
                               "its sampling")
        if not self.taken:
            self.taken = True
            if self.host_ids is not None or self.logits_host is not None:
                self.backend.wait(self.done)
            if self.host_ids is not None:
                self.sampled = self.host_ids.copy()
        return StepOutput(self.logits, self.sampled)


@dataclass(frozen=True)
class _PoolShape:
    """Enough of a KV pool to name the kernels a step needs (compile ahead, before the pool exists)."""

    kv_dtype: str
    block_size: int
    k: list
    v: list


@dataclass
class ForwardPass:
    """The model's weights on the device and the machinery to run steps over them.

    capacity: the largest step (tokens, sequences, logits rows, new history ids); it grows
    on demand until freeze() (the engine freezes it: its graphs hold the buffers' addresses).
    kv_dtype: the KV cache dtype whose kernels are compiled ahead (others compile on first use).
    kernels: "auto" (default: "fast" on a GPU, "simple" on the emulator), "fast", "simple",
    {op: variant} or "op=variant,..." (ops/variants.py); .choice is what runs ("fast" leaves out a
    variant the model's shapes do not fit, and says so).
    """

    model: LoadedModel
    backend: Backend
    capacity: StepCapacity = DEFAULT_CAPACITY
    kv_dtype: str = "f16"
    compile_ahead: bool = True
    cfg: ModelConfig = field(init=False)
    layers: list[DeviceLayer] = field(init=False)
    use_graphs: bool = True  # replay captured graphs where there are some (capture_graphs)
    exact_shapes: bool = False  # no padding: a plan per exact step shape (the graph-vs-eager oracle's eager side)
    kernels: Any = "auto"

    def __post_init__(self):
        be = self.backend
        self.cfg = self.model.config
        self.choice: KernelChoice = resolve_kernels(self.kernels, self.cfg, be, self.model)
        w = upload_weights(be, self.model)
        self.token_embd, self.output, self.output_norm, self.layers = w.token_embd, w.output, w.output_norm, w.layers
        self.frozen = False
        self._plans = PlanCache(be)
        self._pool_ref: Any = None
        self._desc: StepDescriptor | None = None
        self._resize(self.capacity)
        used = self._check_dispatch()
        self.compile_report: dict | None = None
        if self.compile_ahead:
            self.compile_kernels(self.kv_dtype, used)

    # -- buffers ------------------------------------------------------------------------------
    def _resize(self, cap: StepCapacity) -> None:
        """(Re)allocate the workspace for `cap`; plans and the descriptor go with the old buffers,
        the per-slot state (history bits, generated counts, logit_bias) moves over (its slots stay held).

        Per slot (cap.rows of them, one per running request that needs one): ceil(V/32) u32 of
        history bits, ceil(V/2) u32 of u16 counts (V * 2 bytes: 98 KiB for V = 49152), and
        BIAS_STRIDE i32 of logit_bias (2.4 KiB); workspace_bytes() counts them."""
        old = getattr(self, "seen_bits", None)  # None: a fresh ForwardPass
        old = None if old is None else (old, self.counts, self.slot_bias)
        self.release_plans()
        self.capacity = cap
        self.ws = Workspace(self.backend, self.cfg, cap, self.choice)
        self.kernels = StepKernels(self.backend, self.cfg, self.choice, self.ws)
        V = self.cfg.n_vocab
        self.seen_bits = self.backend.zeros((cap.rows, history_words(V)), np.uint32)
        self.counts = self.backend.zeros((cap.rows, count_words(V)), np.uint32)
        self.slot_bias = self.backend.zeros((cap.rows, BIAS_STRIDE), np.int32)
        if old is not None:
            for new, prev in zip((self.seen_bits, self.counts, self.slot_bias), old):
                new[: prev.shape[0]] = prev
        self._prev_sampled = 0  # rows of the last step's sampled ids in ws.sampled (none in new buffers)
        self.token_ladder = bucket_ladder(cap.tokens)
        self.row_ladder = bucket_ladder(cap.rows)

    def release_plans(self) -> None:
        """Drop plans, graphs and the descriptor (they hold the KV pool's and the buffers' memory)."""
        if self._desc is not None:
            self._desc.retire()
        self._plans.clear()
        self._shape_memo = {}  # ($SHARPINF_ATTENTION_MODE may have changed)
        self._desc = None
        self._pool_ref = None

    def _fit(self, need: StepCapacity) -> None:
        if self.capacity.covers(need):
            return
        if self.frozen:
            raise BackendError(f"step of {need} exceeds the frozen capacity {self.capacity} (the engine sizes it "
                               "from max_num_batched_tokens and max_num_seqs: a bug if you see this)")
        grown = StepCapacity(_next_pow2(need.tokens), _next_pow2(need.seqs), _next_pow2(need.rows),
                             _next_pow2(need.history))
        self._resize(self.capacity.union(grown))

    def _bind(self, kv: KVPool, width: int) -> StepDescriptor:
        """The descriptor for `kv` (its block size, scratch block and table width)."""
        d = self._desc
        same_pool = self._pool_ref is not None and self._pool_ref() is kv
        if d is not None and same_pool and width <= d.width:
            return d
        if self.frozen and d is not None:
            raise BackendError("a frozen ForwardPass runs one KV pool, the one its graphs were captured with"
                               if not same_pool else f"a block table of {width} blocks is wider than the frozen "
                               f"descriptor's {d.width}")
        full = -(-self.cfg.context_length // kv.block_size)
        self.release_plans()
        self._desc = StepDescriptor(self.backend, self.capacity, max(width, min(full, kv.num_blocks)),
                                    kv.block_size, kv.scratch_block, history_words(self.cfg.n_vocab))
        self._pool_ref = weakref.ref(kv)
        return self._desc

    @property
    def graph_replays(self) -> int:
        """Plans run from a captured graph so far (two a step: body and head)."""
        return self._plans.replays

    @property
    def plans(self) -> dict:
        """The recorded plans: ("body", Nb, attention shapes) or ("head", Rb, samples) -> list of Launch."""
        return self._plans.plans

    @property
    def graphs(self) -> dict:
        """The captured graphs, keyed like plans."""
        return self._plans.graphs

    @property
    def descriptor(self) -> StepDescriptor | None:
        """The step descriptor of the bound KV pool (host staging + device copy)."""
        return self._desc

    def workspace_bytes(self) -> int:
        slots = int(self.seen_bits.nbytes) + int(self.counts.nbytes) + int(self.slot_bias.nbytes)
        desc = self._desc.nbytes + int(self._desc.masks.nbytes) if self._desc else 0
        return self.ws.nbytes + slots + desc

    def set_slot_bias(self, slot: int, row: np.ndarray) -> None:
        """Slot `slot`'s logit_bias row (ops.sampling.bias_row), sent when a request takes the slot
        (before its step's launch on the same stream)."""
        self.backend.copy_to_device(np.ascontiguousarray(row, np.int32), self.slot_bias[slot])

    def with_own_buffers(self, capacity: StepCapacity = DEFAULT_CAPACITY, kernels: Any = None) -> "ForwardPass":
        """Another ForwardPass over the same uploaded weights, with its own step buffers and
        plans, unfrozen (the oracles run a lone sequence beside a frozen engine's), in the same
        kernel variants or in `kernels`."""
        other = copy.copy(self)
        other.frozen, other.use_graphs = False, True
        if kernels is not None:
            other.kernels, other.choice = kernels, resolve_kernels(kernels, self.cfg, self.backend, self.model)
        other._plans, other._desc, other.seen_bits = PlanCache(self.backend), None, None
        other._resize(capacity)
        if kernels is not None:
            other._check_dispatch()
        return other

    def _check_dispatch(self) -> list[tuple[str, str]]:
        """A chosen variant's launches come from its own kernels (ops/variants.py, check_dispatched);
        returns kernels_used, which the check reads."""
        used = self.kernels_used(self.kv_dtype)
        check_dispatched(self.choice, {f for f, _ in used}, ops_of(self.cfg))
        return used

    def freeze(self) -> None:
        """No more growth: graphs and plans may hold every buffer's address from now on."""
        self.frozen = True

    # -- compile ahead, capture -----------------------------------------------------------------
    def _launch_names(self, kv_dtype: str, tokens: int = 1,
                      mode: str | None = None) -> tuple[Wanted, Wanted]:
        """(file, entry point) of every launch of a body of `tokens` tokens and of a sampling head
        of as many rows, in order, with KV in kv_dtype: the launchers run with nothing compiled or
        launched (backend.collecting). The attention in the launch shape `mode` ("split", "walk": each
        window the variant can walk), or as its rule takes it for a step of unknown contexts."""
        be = self.backend
        # the capacity's sequence count, as every real step's descriptor carries it (flash attention's
        # launch shape depends on it: ops/attention.py's walks)
        shape = StepDescriptor(be, StepCapacity(tokens, self.capacity.seqs, tokens, 1), 1, 16, 0)
        pool = _PoolShape(kv_dtype, 16, [be.empty((1,), np.uint8)] * self.cfg.n_layer,
                          [be.empty((1,), np.uint8)] * self.cfg.n_layer)
        with be.collecting() as body:
            self._emit_body(tokens, pool, shape, self.kernels.attention_shapes(kv_dtype, tokens, shape.cap.seqs + 1,
                                                                                None, mode))
        with be.collecting() as head:
            self._emit_head(tokens, True, shape)
        return body, head

    def kernels_used(self, kv_dtype: str) -> list[tuple[str, str]]:
        """(file, entry point) of every kernel a step runs with KV in kv_dtype (and the history
        flush a long penalised prompt needs, so it never compiles mid-serving). Kernels that
        depend on the step's size are collected at the sizes that switch them: the token counts gemv's
        decode kernels compile (1, 2, 4, 8: matmul=gemv, moe=gemv), a whole tile of tokens (mma, mmq:
        16), best's threshold (64), and the capacity (best takes mmq for a matrix once the step's grid
        fills the GPU, and no step is larger); the attention in each launch shape (a step's contexts
        choose it: attention_shapes)."""
        sizes = sorted({1, 2, 4, 8, 16, 64, self.capacity.tokens})
        modes = (None, "split", "walk") if self.kernels.attn.shape else (None,)
        names = [n for size in sizes for mode in modes for part in self._launch_names(kv_dtype, size, mode)
                 for n in (*part, *part.also)]  # also: kernels a launch may take instead (matmul=timed's)
        return list(dict.fromkeys(names + [("sampling.cu", "seen_update")]))

    def launches_per_layer(self) -> int:
        """Kernel launches of one transformer layer in the chosen variants (a decode step runs
        n_layer of these, plus the embedding and the head)."""
        body, _ = self._launch_names(self.kv_dtype)
        return (len(body) - 1) // self.cfg.n_layer  # the embedding is the one launch outside the layers

    def graph_launches(self) -> int:
        """Kernel launches the graphs of capture_graphs() hold (for the memory estimate): a body a token
        bucket, on a GPU up to one more for each window whose attention can walk (a window's shape
        flips once as the contexts grow: ops/attention.py's walks_pays)."""
        body, head = self._launch_names(self.kv_dtype)
        shapes = 1
        if self.kernels.attn.shape and self.backend.multiprocessors:
            with self.backend.collecting():
                walked = self.kernels.attention_shapes(self.kv_dtype, 1, self.capacity.seqs + 1, None, "walk")
            shapes += walked.count("walk")
        return len(body) * len(self.token_ladder) * shapes + len(head) * len(self.row_ladder)

    def compile_kernels(self, kv_dtype: str, wanted: list[tuple[str, str]] | None = None) -> dict:
        """Compile ahead every kernel a step needs (only those entry points; disk-cached)."""
        wanted = wanted if wanted is not None else self.kernels_used(kv_dtype)
        files = list(dict.fromkeys(f for f, _ in wanted))
        t0 = time.perf_counter()
        with progress_bar("compiling kernels", len(files)) as advance:
            self.backend.compile(wanted, progress=advance)
        secs = time.perf_counter() - t0
        self.compile_report = {"entry_points": len(wanted), "files": len(files), "seconds": round(secs, 3)}
        note(f"compiled {len(wanted)} kernels from {len(files)} files in {secs:.1f} s")
        return self.compile_report

    def capture_graphs(self, kv: KVPool) -> dict:
        """Freeze, then capture a graph for every token bucket (body) and row bucket (head with
        sampling) of the capacity, over `kv`. Returns {"graphs", "seconds", "bytes"}."""
        self.freeze()
        d = self._bind(kv, 1)
        self._idle_step(d)
        keys = [(("body", n, sh), (lambda n=n, sh=sh: self._emit_body(n, kv, d, sh)))
                for n in self.token_ladder for sh in self._shapes_of_bucket(n, kv.kv_dtype, d)]
        keys += [(("head", r, True), (lambda r=r: self._emit_head(r, True, d))) for r in self.row_ladder]
        bytes_before = self.backend.graph_memory() or 0
        t0 = time.perf_counter()
        bodies = sum(k[0] == "body" for k, _ in keys)
        for key, emit in keys[:1] + keys[bodies:][:1]:  # load every kernel once, outside capture
            self.backend.run(self._plans.plan(key, emit))
        with progress_bar("capturing graphs", len(keys)) as advance:
            for key, emit in keys:
                advance(f"{key[0]} {key[1]}")
                self._plans.capture(key, emit)
        self.backend.synchronize()
        secs = time.perf_counter() - t0
        nbytes = (self.backend.graph_memory() or 0) - bytes_before
        note(f"captured {len(keys)} graphs in {secs:.1f} s")
        return {"graphs": len(keys), "seconds": round(secs, 3), "bytes": nbytes}

    def _idle_step(self, d: StepDescriptor) -> None:
        """A descriptor of padding only (every token in the padding sequence): running any plan
        over it touches nothing but the scratch block."""
        self.backend.synchronize()  # nothing may still be copying out of the staging buffer
        h = d.h
        for k in ("token_ids", "positions", "logits_rows", "params", "top_k", "steps", "clear", "count_n", "add_off",
                  "seeds"):
            h[k][...] = 0
        h["slot_mapping"][:] = d.scratch_block * d.block_size
        h["cu_seqlens"][:-1] = 0
        h["cu_seqlens"][-1] = self.capacity.tokens
        h["slots"][:] = -1
        h["mask_idx"][:] = -1
        h["feed_rows"][:] = -1
        d.upload(d.nbytes)

    # -- one step ---------------------------------------------------------------------------
    def forward(self, batch: Batch, kv: KVPool, validate: bool = True, sampling: SamplingRows | None = None) -> StepOutput:
        """Run the step; K/V of its tokens land in `kv`; logits for batch.logits_rows stay on the device;
        with `sampling`, one token per row is chosen on the device and comes back in .sampled."""
        return self.submit(batch, kv, validate, sampling).result()

    def submit(self, batch: Batch, kv: KVPool, validate: bool = True, sampling: SamplingRows | None = None,
               feed_rows: np.ndarray | None = None, copy_rows: Sequence[int] = (),
               masks_later: bool = False) -> "PendingStep":
        """Queue the step (pack, upload, body and head plans, the async copy of the sampled ids)
        and return at once; PendingStep.result() waits for this step's ids only. The next step may
        be packed and submitted before that: it packs into the other staging buffer.

        feed_rows [N]: per token, -1, or the row of the previous step's sampled ids that is this
        token (scheduled before that id reached the host; batch.token_ids holds any valid id there):
        the embedding takes the id on the device and writes it back into the step's token_ids.
        copy_rows: logits rows copied back to the host within this step (logprobs), before a later
        step overwrites them: PendingStep.logits_host.
        masks_later: the rows sampling.mask_idx names get their allowed-token masks only once the
        host knows them (a grammar whose last token is still in flight): the step is queued up to its
        logits, and sample(pending, masks) queues the sampling when the masks are ready -- the
        device meanwhile runs the step's body."""
        be, cfg = self.backend, self.cfg
        if validate:
            batch.validate(kv.num_blocks, cfg.n_vocab, cfg.kv_window)
        N, S, R = batch.n_tokens, batch.n_seqs, len(batch.logits_rows)
        if sampling is not None and sampling.n_rows != R:
            raise ValueError(f"sampling has {sampling.n_rows} rows, the batch {R} logits rows")
        self._fit(StepCapacity(N, S, max(R, 1), 1))  # before the flush: growth moves the history
        prev = self._prev_sampled  # rows of the previous step's ids in ws.sampled: what feed_rows may name
        if feed_rows is not None and (len(feed_rows) != N or feed_rows.max(initial=-1) >= prev):
            raise ValueError(f"feed_rows must have one entry per token ({N}), each -1 or a row the previous "
                             f"step sampled into these buffers (it sampled {prev})")
        if sampling is not None and len(sampling.add_ids) > self.capacity.history:
            sampling = self._flush_history(sampling, R)
        d = self._bind(kv, batch.block_tables.shape[1])
        Nb = N if self.exact_shapes else bucket_for(N, self.token_ladder)
        Rb = R if self.exact_shapes else bucket_for(R, self.row_ladder)
        d.upload(d.pack(batch, Nb, Rb, sampling, feed_rows))
        shapes = self.step_shapes(batch, Nb, kv.kv_dtype, d)
        self._plans.run(("body", Nb, shapes), lambda: self._emit_body(Nb, kv, d, shapes), self.use_graphs)
        samples = sampling is not None and R > 0
        later = samples and masks_later
        if R:  # (a step whose masks come later: its logits now, its sampling in sample())
            self._plans.run(("head", Rb, samples and not later), lambda: self._emit_head(Rb, samples and not later, d),
                            self.use_graphs)
        pending = PendingStep(be, self.ws.logits[:R], None, None)
        ids, pending.done = d.claim(pending)  # this staging buffer's ids buffer and marker
        if copy_rows:
            pending.logits_host = be.host_buffer(len(copy_rows) * cfg.n_vocab * 4).view(np.float32).reshape(-1, cfg.n_vocab)
            for i, r in enumerate(copy_rows):
                be.copy_to_host(self.ws.logits[r], pending.logits_host[i])
        if samples:
            pending.host_ids = ids[:R]
        self._prev_sampled = R if samples else 0
        if later:
            pending.deferred = (Rb, d.cur)
            return pending
        if samples:
            be.copy_to_host(self.ws.sampled[:R], pending.host_ids)
        be.record(pending.done)
        return pending

    def sample(self, pending: "PendingStep", masks: np.ndarray) -> None:
        """Queue the sampling of a step submitted with masks_later, with its masks (u32 [M, words]:
        row r's allowed ids are masks[mask_idx[r]], as SamplingRows): the masks' copy, the sampling
        kernel, the copy of the ids back. Before any later step is submitted (stream order is what
        lets the next step feed from these ids)."""
        if pending.deferred is None:
            raise RuntimeError("sample(): the step was not submitted with masks_later, or is sampled already")
        (Rb, buf), be, d = pending.deferred, self.backend, self._desc
        d.upload_masks(buf, masks)
        self._plans.run(("sample", Rb), lambda: self._emit_sample(Rb, d), False)  # a few launches: no graph
        pending.deferred = None
        be.copy_to_host(self.ws.sampled[: len(pending.host_ids)], pending.host_ids)
        be.record(pending.done)

    def greedy(self, batch: Batch, kv: KVPool, validate: bool = True) -> np.ndarray:
        """The greedy next token of each logits row (argmax on the device, ties to the lowest id)."""
        return self.forward(batch, kv, validate, SamplingRows.greedy(len(batch.logits_rows))).sampled

    def _flush_history(self, s: SamplingRows, R: int) -> SamplingRows:
        """More new history ids than the step's buffer holds (a long prompt's first sample): set
        them now with their own upload and launch; the step then adds none."""
        be = self.backend
        count_n = np.zeros(R, np.int32) if s.count_n is None else s.count_n
        seen_update(be, R, self.cfg.n_vocab, self.seen_bits, be.upload(s.slots), be.upload(s.clear),
                    be.upload(s.add_off), be.upload(np.concatenate([s.add_ids, np.full(1, -1, np.int32)])),
                    self.counts, be.upload(count_n))
        return SamplingRows(s.params, s.top_k, s.seeds, s.steps, s.slots, np.zeros(R, np.int32),
                            np.zeros(R + 1, np.int32), np.zeros(0, np.int32), None, s.mask_idx, s.masks)

    # -- the launches of a step (recorded into plans) ---------------------------------------------
    def _emit_body(self, N: int, kv, d: StepDescriptor, shapes: tuple[str, ...] = ()) -> None:
        """embed -> layers for N tokens (padding included) over the descriptor's device fields, the
        attention in `shapes` (StepKernels.attention_shapes)."""
        self._emit_embed(N, d)
        self.kernels.shapes = shapes
        try:
            self.kernels.layers(self.layers, kv, d, N)
        finally:
            self.kernels.shapes = ()  # launches made by hand choose their own (oracles/trace.py sets them)

    # -- the attention's launch shape: part of a body plan's key ---------------------------------
    def step_shapes(self, batch: Batch, N: int, kv_dtype: str, d: StepDescriptor) -> tuple[str, ...]:
        """The attention's launch shapes for `batch` run as a step of N tokens (its bucket): by its
        longest context (what submit keys the body by; StepKernels.shapes for launches made by hand)."""
        return self._attention_shapes(N, kv_dtype, d, int(batch.context_lens.max(initial=1)))

    def _attention_shapes(self, N: int, kv_dtype: str, d: StepDescriptor, keys: int) -> tuple[str, ...]:
        """The attention's launch shapes for a step of N tokens (its bucket) whose longest context is
        `keys` keys: the variant's rule (ops/attention.py), asked once per bucket and KV_SHAPE_KEYS
        keys (the rule counts whole partitions of at least that many)."""
        keys = -(-max(1, keys) // KV_SHAPE_KEYS) * KV_SHAPE_KEYS
        memo = self._shape_memo.setdefault((N, kv_dtype, d.cap.seqs), {})
        if keys not in memo:
            memo[keys] = self.kernels.attention_shapes(kv_dtype, N, d.cap.seqs + 1, keys)
        return memo[keys]

    def _shapes_of_bucket(self, N: int, kv_dtype: str, d: StepDescriptor) -> list[tuple[str, ...]]:
        """Every shape tuple a step of bucket N takes at some context up to the longest the descriptor's
        block tables hold: the bodies capture_graphs captures. Each window's shape flips at most once
        as the context grows (walk, then split: walks_pays), so where two contexts give the same tuple
        every context between them does, and bisection finds each flip."""
        longest = -(-min(self.cfg.context_length, d.width * d.block_size) // KV_SHAPE_KEYS) * KV_SHAPE_KEYS
        at = lambda keys: self._attention_shapes(N, kv_dtype, d, keys)  # noqa: E731
        found = {at(KV_SHAPE_KEYS), at(longest)}

        def between(lo: int, hi: int) -> None:  # contexts lo < hi (multiples of KV_SHAPE_KEYS), tuples differ
            if hi - lo <= KV_SHAPE_KEYS:
                return
            mid = (lo + hi) // 2 // KV_SHAPE_KEYS * KV_SHAPE_KEYS
            found.add(at(mid))
            for a, b in ((lo, mid), (mid, hi)):
                if at(a) != at(b):
                    between(a, b)
        if at(KV_SHAPE_KEYS) != at(longest):
            between(KV_SHAPE_KEYS, longest)
        return sorted(found)

    def _emit_embed(self, N: int, d: StepDescriptor) -> None:
        """ws.x = the embedding rows of the step's tokens (oracles/trace.py runs it alone)."""
        embed(self.backend, self.token_embd.raw, self.token_embd.qtype, d.d["token_ids"], self.ws.x, N, self.cfg.n_embd,
              self.cfg.embd_scale, feed=(d.d["feed_rows"], self.ws.sampled))

    def _emit_head(self, R: int, samples: bool, d: StepDescriptor) -> None:
        """The R logits rows: gather -> final norm -> LM head (-> sampling)."""
        self.kernels.head(self.output_norm, self.output, d.d["logits_rows"], R)
        if samples:
            self._emit_sample(R, d)

    def _emit_sample(self, R: int, d: StepDescriptor) -> None:
        """One token for each of the R logits rows (the sampling kernel, over the descriptor's rows)."""
        be, cfg, ws, dv = self.backend, self.cfg, self.ws, d.d
        self.kernels.sampler.launch(be, ws.logits, R, cfg.n_vocab, dv["params"], dv["top_k"], dv["seeds"], dv["steps"],
                                    self.seen_bits, dv["slots"], dv["clear"], dv["add_off"], dv["add_ids"], self.counts,
                                    dv["count_n"], self.slot_bias, dv["mask_idx"], d.masks, ws.sampled,
                                    ws.sample_scratch, acc=getattr(ws, "sample_acc", None))
