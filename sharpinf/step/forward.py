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

How a step runs: submit() packs the batch, padded to its bucket (Nb tokens, Rb rows), into a pinned
staging buffer sent with one copy (step/buffers.py), runs its body and head plans (step/plan.py, the
launches of step/launches.py; CUDA graphs once capture_graphs() ran: step/graphs.py) and queues the
copy of the sampled ids and a marker, which PendingStep.result() alone waits for (step/pending.py):
step n+1 is packed and queued while step n runs, its decode tokens fed on the device from step n's
ids (feed_rows). Beside it: the per-slot sampling state (step/slots.py), the attention's launch
shapes (step/shapes.py), the bound KV pool (step/binding.py), and the dry run that names a step's
kernels without launching them, to compile ahead only those (step/dry_run.py).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from sharpinf.errors import BackendError
from sharpinf.model.config import ModelConfig
from sharpinf.model.loader import LoadedModel
from sharpinf.ops.variants import KernelChoice, resolve_kernels
from sharpinf.runtime.backend import Backend
from sharpinf.step.batch import Batch
from sharpinf.step.binding import PoolBinding
from sharpinf.step.buffers import SamplingRows, StepCapacity, StepDescriptor, Workspace
from sharpinf.step.dry_run import DryRun, compile_ahead
from sharpinf.step.graphs import capture_buckets
from sharpinf.step.kernels import StepKernels
from sharpinf.step.kv_pool import KVPool
from sharpinf.step.launches import StepLaunches
from sharpinf.step.pending import PendingStep, StepOutput
from sharpinf.step.plan import PlanCache, bucket_for, bucket_ladder
from sharpinf.step.shapes import AttentionShapes
from sharpinf.step.slots import SlotState
from sharpinf.step.weights import DeviceLayer, upload_weights

DEFAULT_CAPACITY = StepCapacity(tokens=64, seqs=8, rows=8, history=64)


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@dataclass
class ForwardPass:
    """The model's weights on the device and the machinery to run steps over them.

    capacity: the largest step (tokens, sequences, logits rows, new history ids); it grows
    on demand until freeze() (the engine freezes it: its graphs hold the buffers' addresses).
    kv_dtype: the KV cache dtype whose kernels are compiled ahead (others compile on first use).
    kernels: "auto" (default: "fast" on a GPU, "simple" on the emulator), "fast", "simple",
    {op: variant} or "op=variant,..." (ops/variants.py), kept as given; .choice is what runs ("fast"
    leaves out a variant the model's shapes do not fit, and says so), .step_kernels emits it.
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
        self.cfg = self.model.config
        self.choice: KernelChoice = resolve_kernels(self.kernels, self.cfg, self.backend, self.model)
        self.weights = w = upload_weights(self.backend, self.model)
        self.token_embd, self.output, self.output_norm, self.layers = w.token_embd, w.output, w.output_norm, w.layers
        self.frozen = False
        self._plans, self._binding = PlanCache(self.backend), PoolBinding(self.backend, self.cfg)
        self._allocate(self.capacity)
        used = self.dry_run.check_dispatch(self.kv_dtype)
        self.compile_report: dict | None = None
        if self.compile_ahead:
            self.compile_kernels(self.kv_dtype, used)

    # -- one step -----------------------------------------------------------------------------------
    def forward(self, batch: Batch, kv: KVPool, validate: bool = True, sampling: SamplingRows | None = None) -> StepOutput:
        """Run the step; K/V of its tokens land in `kv`; logits for batch.logits_rows stay on the device;
        with `sampling`, one token per row is chosen on the device and comes back in .sampled."""
        return self.submit(batch, kv, validate, sampling).result()

    def submit(self, batch: Batch, kv: KVPool, validate: bool = True, sampling: SamplingRows | None = None,
               feed_rows: np.ndarray | None = None, copy_rows: Sequence[int] = (),
               masks_later: bool = False) -> PendingStep:
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
            sampling = self.slots.flush_history(sampling, R)
        d = self._bind(kv, batch.block_tables.shape[1])
        Nb = N if self.exact_shapes else bucket_for(N, self.token_ladder)
        Rb = R if self.exact_shapes else bucket_for(R, self.row_ladder)
        d.upload(d.pack(batch, Nb, Rb, sampling, feed_rows))
        shapes = self.step_shapes(batch, Nb, kv.kv_dtype, d)
        self._plans.run(("body", Nb, shapes), lambda: self.launches.body(Nb, kv, d, shapes), self.use_graphs)
        samples = sampling is not None and R > 0
        later = samples and masks_later
        if R:  # (a step whose masks come later: its logits now, its sampling in sample())
            now = samples and not later
            self._plans.run(("head", Rb, now), lambda: self.launches.head(Rb, now, d), self.use_graphs)
        pending = PendingStep(be, self.ws.logits[:R], None, None)
        ids, pending.done = d.claim(pending)  # this staging buffer's ids buffer and marker
        if copy_rows:
            pending.copy_logits(self.ws.logits, copy_rows, cfg.n_vocab)
        if samples:
            pending.host_ids = ids[:R]
        self._prev_sampled = R if samples else 0
        if later:
            pending.deferred = (Rb, d.cur)
        else:
            pending.finish(self.ws.sampled)
        return pending

    def sample(self, pending: PendingStep, masks: np.ndarray) -> None:
        """Queue the sampling of a step submitted with masks_later, with its masks (u32 [M, words]:
        row r's allowed ids are masks[mask_idx[r]], as SamplingRows): the masks' copy, the sampling
        kernel, the copy of the ids back. Before any later step is submitted (stream order is what
        lets the next step feed from these ids)."""
        if pending.deferred is None:
            raise RuntimeError("sample(): the step was not submitted with masks_later, or is sampled already")
        (Rb, buf), d = pending.deferred, self._binding.desc
        d.upload_masks(buf, masks)
        self._plans.run(("sample", Rb), lambda: self.launches.sample(Rb, d), False)  # a few launches: no graph
        pending.deferred = None
        pending.finish(self.ws.sampled)

    def greedy(self, batch: Batch, kv: KVPool, validate: bool = True) -> np.ndarray:
        """The greedy next token of each logits row (argmax on the device, ties to the lowest id)."""
        return self.forward(batch, kv, validate, SamplingRows.greedy(len(batch.logits_rows))).sampled

    def set_slot_bias(self, slot: int, row: np.ndarray) -> None:
        """Slot `slot`'s logit_bias row (ops.sampling.bias_row), sent when a request takes the slot."""
        self.slots.set_bias(slot, row)

    # -- the buffers, grown on demand until frozen, and the KV pool they are bound to ---------------
    def _allocate(self, cap: StepCapacity, slots: SlotState | None = None) -> None:
        """The step buffers for `cap` and everything that points at them; `slots` (the per-slot state
        of the buffers before) moves over, its slots still held. workspace_bytes() counts them all."""
        be, cfg = self.backend, self.cfg
        self.capacity = cap
        self.ws = Workspace(be, cfg, cap, self.choice)
        self.step_kernels = StepKernels(be, cfg, self.choice, self.ws)
        self.slots = SlotState.alloc(be, cfg.n_vocab, cap.rows, slots)
        self.launches = StepLaunches(be, cfg, self.weights, self.step_kernels, self.ws, self.slots)
        self.shapes = AttentionShapes(self.step_kernels, cfg.context_length)
        self.dry_run = DryRun(be, cfg, self.launches, cap)
        self._prev_sampled = 0  # rows of the last step's sampled ids in ws.sampled (none in new buffers)
        self.token_ladder, self.row_ladder = bucket_ladder(cap.tokens), bucket_ladder(cap.rows)

    def _fit(self, need: StepCapacity) -> None:
        """Grow the buffers to hold a step of `need` (plans and the descriptor go with the old ones)."""
        if self.capacity.covers(need):
            return
        if self.frozen:
            raise BackendError(f"step of {need} exceeds the frozen capacity {self.capacity} (the engine sizes it "
                               "from max_num_batched_tokens and max_num_seqs: a bug if you see this)")
        grown = StepCapacity(*(_next_pow2(getattr(need, f)) for f in ("tokens", "seqs", "rows", "history")))
        self.release_plans()
        self._allocate(self.capacity.union(grown), self.slots)

    def release_plans(self) -> None:
        """Drop plans, graphs and the descriptor (they hold the KV pool's and the buffers' memory)."""
        self._binding.release()
        self._plans.clear()
        self.shapes.clear()  # ($SHARPINF_ATTENTION_MODE may have changed)

    def _bind(self, kv: KVPool, width: int) -> StepDescriptor:
        """The descriptor for steps over `kv` with tables `width` wide (step/binding.py); a new one
        drops the plans over the old."""
        d = self._binding.current(kv, width, self.frozen)
        if d is None:
            self.release_plans()
            d = self._binding.bind(kv, width, self.capacity)
        return d

    def with_own_buffers(self, capacity: StepCapacity = DEFAULT_CAPACITY, kernels: Any = None) -> "ForwardPass":
        """Another ForwardPass over the same uploaded weights, with its own step buffers and
        plans, unfrozen (the oracles run a lone sequence beside a frozen engine's), in the same
        kernel variants or in `kernels`."""
        other = copy.copy(self)
        other.frozen, other.use_graphs = False, True
        if kernels is not None:
            other.kernels, other.choice = kernels, resolve_kernels(kernels, self.cfg, self.backend, self.model)
        other._plans, other._binding = PlanCache(self.backend), PoolBinding(self.backend, self.cfg)
        other._allocate(capacity)
        if kernels is not None:
            other.dry_run.check_dispatch(other.kv_dtype)
        return other

    def freeze(self) -> None:
        """No more growth: graphs and plans may hold every buffer's address from now on."""
        self.frozen = True

    # -- views --------------------------------------------------------------------------------------
    @property
    def plans(self) -> dict:
        """The recorded plans: ("body", Nb, attention shapes) or ("head", Rb, samples) -> list of Launch."""
        return self._plans.plans

    @property
    def graphs(self) -> dict:
        """The captured graphs, keyed like plans."""
        return self._plans.graphs

    @property
    def graph_replays(self) -> int:
        """Plans run from a captured graph so far (two a step: body and head)."""
        return self._plans.replays

    @property
    def descriptor(self) -> StepDescriptor | None:
        """The step descriptor of the bound KV pool (host staging + device copy)."""
        return self._binding.desc

    def workspace_bytes(self) -> int:
        return self.ws.nbytes + self.slots.nbytes + self._binding.nbytes

    def step_shapes(self, batch: Batch, N: int, kv_dtype: str, d: StepDescriptor) -> tuple[str, ...]:
        """The attention's launch shapes for `batch` run as a step of N tokens (its bucket): what submit
        keys the body by (StepKernels.shapes for launches made by hand)."""
        return self.shapes.for_step(batch, N, kv_dtype, d)

    # -- what a step launches: compiled ahead, counted, captured ------------------------------------
    def kernels_used(self, kv_dtype: str) -> list[tuple[str, str]]:
        """(file, entry point) of every kernel a step runs with KV in kv_dtype (DryRun.kernels_used)."""
        return self.dry_run.kernels_used(kv_dtype)

    def launches_per_layer(self) -> int:
        """Kernel launches of one transformer layer in the chosen variants."""
        return self.dry_run.launches_per_layer(self.kv_dtype)

    def graph_launches(self) -> int:
        """Kernel launches the graphs of capture_graphs() hold (for the memory estimate)."""
        return self.dry_run.graph_launches(self.kv_dtype, len(self.token_ladder), len(self.row_ladder))

    def compile_kernels(self, kv_dtype: str, wanted: list[tuple[str, str]] | None = None) -> dict:
        """Compile ahead every kernel a step needs (only those entry points; disk-cached)."""
        self.compile_report = compile_ahead(self.backend, wanted if wanted is not None else self.kernels_used(kv_dtype))
        return self.compile_report

    def capture_graphs(self, kv: KVPool) -> dict:
        """Freeze, then capture a graph for every token bucket (body) and row bucket (head with
        sampling) of the capacity, over `kv`. Returns {"graphs", "seconds", "bytes"}."""
        self.freeze()
        d = self._bind(kv, 1)
        return capture_buckets(self._plans, self.launches, self.shapes, self.token_ladder, self.row_ladder, kv, d)
