"""The buffers a step runs in, allocated once: the activations (Workspace) and the step
descriptor (StepDescriptor), so a step allocates nothing and crosses to the device in one copy.

    token_ids, positions, slot_mapping   i32 [T]       the batch's tokens, then padding
    feed_rows                            i32 [T]       -1, or the row of the previous step's sampled ids
                                                       that is this token (scheduled before it was known)
    cu_seqlens                           i32 [S+1]     S = seqs + 1: the last sequence holds the padding
    logits_rows                          i32 [R]
    sampling: params f32 [R,6], top_k, steps, slots, clear, count_n, mask_idx i32 [R],
              add_off i32 [R+1], seeds u64 [R]
    add_ids                              i32 [H]       ids new to the repetition-penalty history
    block_tables                         i32 [S, W]    last, so the copy stops after the live rows

Allowed-token masks (structured output) are not in that copy: a step with M masked rows packs
their bits into rows 0..M-1 of a pinned [R, words] staging buffer (two, used in turn as the
descriptor's) and sends those rows with a second copy before the descriptor's (mask_idx[r]
names row r's); a step without one sends none.

The host side is two pinned staging buffers with the same layout, used in turn, each with its
own marker: a step writes its fields into one and `upload` sends [0, end of the last live
block-table row) with one async copy, so packing step n+1 never waits for step n's copy (only
for step n-1's, long done). The device copy is one buffer: stream order protects it, and the
captured graphs hold its addresses. The sampled ids come back into two pinned buffers in turn.
Padding: a step padded from N to Nb tokens (its graph's size) gives tokens N..Nb-1 id 0,
position 0 and the slot of position 0 of the scratch block, in sequence S-1 whose block
table is the scratch block; rows R..Rb-1 take row 0, greedy, no history. Padding reads and
writes only the scratch block and rows nobody reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sharpinf.step.batch import Batch
from sharpinf.model.config import ModelConfig
from sharpinf.errors import SharpinfError
from sharpinf.ops.moe import MoeScratch
from sharpinf.ops.quant_act import Q8Act
from sharpinf.ops.sampling import N_PARAMS
from sharpinf.ops.variants import KernelChoice, ops_of
from sharpinf.runtime.backend import Backend

I32, F32, U64 = np.int32, np.float32, np.uint64
ALIGN = 16  # bytes: every field starts on a 16-byte boundary (vector loads, u64 fields)


@dataclass(frozen=True)
class StepCapacity:
    """The most one step holds: tokens, sequences, rows wanting logits, new history ids."""

    tokens: int
    seqs: int
    rows: int
    history: int

    def covers(self, other: "StepCapacity") -> bool:
        return all(getattr(self, f) >= getattr(other, f) for f in ("tokens", "seqs", "rows", "history"))

    def union(self, other: "StepCapacity") -> "StepCapacity":
        return StepCapacity(*(max(getattr(self, f), getattr(other, f)) for f in ("tokens", "seqs", "rows", "history")))


@dataclass
class SamplingRows:
    """Per row of logits_rows: how to pick its token (host arrays, packed by the model runner).

    The history fields keep each penalised request's seen ids on the device across steps:
    slots[r] (-1: no slot), clear[r] (the slot is new to this request), and the ids new
    since its last step, add_ids[add_off[r]:add_off[r+1]], of which the last count_n[r] are
    generated ids the slot's counts must be rebuilt with (a fresh slot of a re-admitted request).
    mask_idx[r]: -1, or the row of `masks` (u32 [M, words], host) that holds row r's allowed ids."""

    params: np.ndarray  # f32 [R, 6]: temperature, top_p, min_p, repetition, presence, frequency penalties
    top_k: np.ndarray  # i32 [R]
    seeds: np.ndarray  # u64 [R]
    steps: np.ndarray  # i32 [R]
    slots: np.ndarray  # i32 [R]
    clear: np.ndarray  # i32 [R]
    add_off: np.ndarray  # i32 [R+1]
    add_ids: np.ndarray  # i32 [n]
    count_n: np.ndarray | None = None  # i32 [R]; None: zeros
    mask_idx: np.ndarray | None = None  # i32 [R]; None: no row masked
    masks: np.ndarray | None = None  # u32 [M, words]

    @property
    def n_rows(self) -> int:
        return len(self.top_k)

    @classmethod
    def greedy(cls, R: int) -> "SamplingRows":
        """Argmax for every row (ties to the lowest id), no history."""
        return cls(np.zeros((R, N_PARAMS), F32), np.zeros(R, I32), np.zeros(R, U64), np.zeros(R, I32),
                   np.full(R, -1, I32), np.zeros(R, I32), np.zeros(R + 1, I32), np.zeros(0, I32))


class Workspace:
    """The activations of one step, [tokens or rows, width], sized for a capacity, in the form the
    chosen variants read them (float rows, their q8_1 copies), and the scratch each chosen variant
    declares (its registry `scratch`: split attention's partial states, radix sampling's accumulators,
    mmq's split-K group sums, the cooperative kernels' grid barrier, ...), each as ws.<name>."""

    def __init__(self, be: Backend, cfg: ModelConfig, cap: StepCapacity, choice: KernelChoice = KernelChoice()):
        T, R = cap.tokens, cap.rows
        qkv_w = cfg.q_dim + 2 * cfg.kv_dim
        self.x = be.empty((T, cfg.n_embd), F32)  # the residual stream
        self.qkv = be.empty((T, qkv_w), F32)
        self.att = be.empty((T, cfg.q_dim), F32)
        if not cfg.is_moe:  # an MoE layer's FFN runs in self.moe
            self.gate = be.empty((T, cfg.n_ff), F32)
            self.up = be.empty((T, cfg.n_ff), F32)
        self.sel = be.empty((R, cfg.n_embd), F32)  # the rows that want logits
        self.logits = be.empty((R, cfg.n_vocab), F32)
        self.sample_scratch = be.empty((R, 2 * cfg.n_vocab), F32)
        self.sampled = be.empty((R,), I32)
        if choice.q8_activations:  # what the dp4a matmuls read: the normed x, attention out, SwiGLU out
            self.xq, self.attq = Q8Act.empty(be, T, cfg.n_embd), Q8Act.empty(be, T, cfg.q_dim)
            self.selq = Q8Act.empty(be, R, cfg.n_embd)
            if not cfg.is_moe:
                self.ffq = Q8Act.empty(be, T, cfg.n_ff)
            if cfg.post_norms or cfg.has_attn_out_bias:  # a sublayer's output, before its post-norm (gemma3)
                self.proj = be.empty((T, cfg.n_embd), F32)  # or its bias (gpt-oss) joins and x adds it
        else:  # the float matmuls' input and output (the residual add is its own kernel)
            self.h, self.proj = be.empty((T, cfg.n_embd), F32), be.empty((T, cfg.n_embd), F32)
        if cfg.is_moe:  # the routing and the (token, expert) pairs; the FFN norm writes what the moe variant reads
            moe_q8 = choice.of("moe").activations == "q8_1"
            self.moe = MoeScratch.alloc(be, T, cfg.n_expert_used, cfg.n_ff_exp, cfg.n_embd, cfg.n_expert, moe_q8,
                                        cfg.n_layer)
            if moe_q8 and not hasattr(self, "xq"):
                self.xq = Q8Act.empty(be, T, cfg.n_embd)
            if not moe_q8 and not hasattr(self, "h"):
                self.h = be.empty((T, cfg.n_embd), F32)
        own = set(vars(self))
        self.scratch_of: dict[str, str] = {}  # ws.<name> -> the variant whose scratch it is (the first that gave it)
        for op in ops_of(cfg):  # reserved now, with the workspace: never inside a graph capture
            v = choice.of(op)
            for make in v.scratch:
                for name, buf in make(be, cfg, cap).items():
                    if name in own:
                        raise SharpinfError(f"{v.label}: its scratch {make.__name__} gives {name!r}, a buffer the "
                                            "workspace holds itself: name it otherwise")
                    if name not in self.scratch_of:  # a name two variants give is one buffer (the grid barrier)
                        self.scratch_of[name] = v.label
                        setattr(self, name, buf)

    @property
    def nbytes(self) -> int:
        def size(a) -> int:
            return int(a.nbytes) if hasattr(a, "nbytes") else sum(size(v) for v in vars(a).values() if hasattr(v, "nbytes"))

        return sum(size(a) for name, a in vars(self).items() if name != "scratch_of")


@dataclass
class _Field:
    offset: int  # bytes
    dtype: np.dtype
    count: int


@dataclass
class StepDescriptor:
    """One step's description: pinned host staging (two buffers, used in turn) + the device copy,
    with typed views of each."""

    be: Backend
    cap: StepCapacity
    width: int  # W: block-table entries per sequence
    block_size: int
    scratch_block: int
    mask_words: int = 1  # u32 words of one allowed-token mask: ceil(vocab / 32)
    fields: dict[str, _Field] = field(init=False)
    nbytes: int = field(init=False)

    def __post_init__(self):
        T, S, R, H, W = self.cap.tokens, self.cap.seqs + 1, self.cap.rows, self.cap.history, self.width
        layout = [("token_ids", I32, T), ("positions", I32, T), ("slot_mapping", I32, T), ("feed_rows", I32, T),
                  ("cu_seqlens", I32, S + 1),
                  ("logits_rows", I32, R), ("params", F32, R * N_PARAMS), ("top_k", I32, R), ("steps", I32, R),
                  ("slots", I32, R), ("clear", I32, R), ("count_n", I32, R), ("mask_idx", I32, R),
                  ("add_off", I32, R + 1), ("seeds", U64, R),
                  ("add_ids", I32, max(1, H)), ("block_tables", I32, S * W)]
        self.fields, at = {}, 0
        for name, dt, n in layout:
            self.fields[name] = _Field(at, np.dtype(dt), n)
            at += -(-(n * np.dtype(dt).itemsize) // ALIGN) * ALIGN
        self.nbytes = at
        self.device = self.be.zeros((at,), np.uint8)
        self.d = {n: self._view(self.device, f) for n, f in self.fields.items()}  # device views
        self.d["params"] = self.d["params"].reshape(R, N_PARAMS)
        self.hosts = [self.be.host_buffer(at) for _ in range(2)]  # staging, used in turn
        self._h = [self._host_views(b) for b in self.hosts]
        self._copied = [self.be.marker() for _ in range(2)]  # the end of each buffer's last upload
        self._ids = [self.be.host_buffer(R * 4).view(I32) for _ in range(2)]  # sampled ids come back here
        self._done = [self.be.marker() for _ in range(2)]  # the end of the step that used each buffer
        self._owner: list[Any] = [None, None]  # that step (a PendingStep)
        self.cur, self._sent = 0, False  # the buffer pack() writes; whether it was uploaded since
        # allowed-token masks: their own staging, in turn with the descriptor's, and one device copy
        self._mask_hosts = [self.be.host_buffer(R * self.mask_words * 4).view(np.uint32).reshape(R, self.mask_words)
                            for _ in range(2)]
        self.masks = self.be.zeros((R, self.mask_words), np.uint32)
        self._mask_rows = 0  # rows of the mask staging this step sends
        # the padding sequence's table (row S-1) never changes and is past every copy: set it once
        for i in range(2):
            self._h[i]["block_tables"].reshape(S, W)[S - 1, :] = self.scratch_block
            self._h[i]["feed_rows"][:] = -1  # no token is fed until a step says so
        self.be.copy_to_device(self.host, self.device)
        self.be.synchronize()

    def _host_views(self, buf: Any) -> dict[str, Any]:
        h = {n: self._view(buf, f) for n, f in self.fields.items()}
        h["params"] = h["params"].reshape(self.cap.rows, N_PARAMS)
        return h

    # the staging buffer of the step being packed (or last packed): host bytes, typed views, tables
    @property
    def host(self) -> Any:
        return self.hosts[self.cur]

    @property
    def h(self) -> dict[str, Any]:
        return self._h[self.cur]

    @property
    def mask_host(self) -> Any:
        return self._mask_hosts[self.cur]

    @property
    def tables(self) -> Any:
        return self._h[self.cur]["block_tables"].reshape(self.cap.seqs + 1, self.width)

    def claim(self, step: Any) -> tuple[Any, Any]:
        """(host_ids, done marker) of the current staging buffer, handed to `step` (a PendingStep);
        a step that still owns them (two submits with no result() between) takes its ids out first,
        so none is overwritten unread."""
        prev = self._owner[self.cur]
        if prev is not None and prev is not step:
            prev.result()
        self._owner[self.cur] = step
        return self._ids[self.cur], self._done[self.cur]

    @staticmethod
    def _view(buf: Any, f: _Field) -> Any:
        return buf[f.offset : f.offset + f.count * f.dtype.itemsize].view(f.dtype)

    @property
    def pad_seq(self) -> int:
        return self.cap.seqs

    def pack(self, batch: Batch, n_tokens: int, n_rows: int, sampling: SamplingRows | None,
             feed_rows: np.ndarray | None = None) -> int:
        """Write the batch padded to n_tokens tokens and n_rows rows into the staging buffer not in
        flight; returns the bytes to upload. feed_rows [N]: per token, -1 or the row of the previous
        step's sampled ids to take its id from (its token_ids entry is then a placeholder)."""
        if self._sent:  # the other buffer: its last copy (two steps ago) has long left it
            self.cur, self._sent = self.cur ^ 1, False
        self.be.wait(self._copied[self.cur])
        self._mask_rows = 0
        h, N, S, R = self.h, batch.n_tokens, batch.n_seqs, len(batch.logits_rows)
        h["token_ids"][:N] = batch.token_ids
        h["token_ids"][N:n_tokens] = 0
        h["feed_rows"][:N] = -1 if feed_rows is None else feed_rows
        h["feed_rows"][N:n_tokens] = -1
        h["positions"][:N] = batch.positions
        h["positions"][N:n_tokens] = 0
        h["slot_mapping"][:N] = batch.slot_mapping
        h["slot_mapping"][N:n_tokens] = self.scratch_block * self.block_size
        cu = h["cu_seqlens"]
        cu[: S + 1] = batch.cu_seqlens
        cu[S + 1 : self.pad_seq + 1] = N  # empty sequences up to the padding sequence
        cu[self.pad_seq + 1] = n_tokens
        h["logits_rows"][:R] = batch.logits_rows
        h["logits_rows"][R:n_rows] = 0
        if sampling is not None:
            h["params"][:R] = sampling.params
            h["params"][R:n_rows] = 0.0  # padding rows: greedy
            h["top_k"][:R] = sampling.top_k
            h["steps"][:R] = sampling.steps
            h["seeds"][:R] = sampling.seeds
            h["slots"][:R] = sampling.slots
            h["slots"][R:n_rows] = -1  # padding rows hold no history...
            h["clear"][:R] = sampling.clear
            h["count_n"][:R] = 0 if sampling.count_n is None else sampling.count_n
            h["mask_idx"][:R] = -1 if sampling.mask_idx is None else sampling.mask_idx
            h["mask_idx"][R:n_rows] = -1
            for k in ("top_k", "steps", "seeds", "clear", "count_n"):  # ...and carry nothing of an earlier step's rows
                h[k][R:n_rows] = 0
            if sampling.masks is not None and len(sampling.masks):
                self._mask_rows = M = len(sampling.masks)
                self.mask_host[:M] = sampling.masks
            h["add_off"][: R + 1] = sampling.add_off
            h["add_off"][R + 1 : n_rows + 1] = sampling.add_off[R]
            h["add_ids"][: len(sampling.add_ids)] = sampling.add_ids
        w = batch.block_tables.shape[1]
        self.tables[:S, :w] = batch.block_tables
        return self.fields["block_tables"].offset + S * self.width * 4

    def retire(self) -> None:
        """Before the buffers go: the last copies out of (and into) the pinned buffers must have finished (a
        freed pinned block can be handed out again at once)."""
        for m in self._copied + self._done:  # the uploads, and the ids' copies back
            self.be.wait(m)

    def upload_masks(self, buf: int, masks: np.ndarray) -> None:
        """A step's masks after its descriptor (ForwardPass.submit's masks_later): into staging buffer
        `buf`'s mask rows (the step's own: no later step has packed into it yet), then the device's;
        the buffer's marker is recorded again, so the next pack into it waits for this copy too."""
        M = len(masks)
        if M:
            self._mask_hosts[buf][:M] = masks
            self.be.copy_to_device(self._mask_hosts[buf][:M], self.masks[:M])
            self.be.record(self._copied[buf])

    def upload(self, nbytes: int) -> None:
        M = self._mask_rows
        if M:  # before the descriptor's copy, so its marker covers both of this buffer's copies
            self.be.copy_to_device(self.mask_host[:M], self.masks[:M])
        self.be.copy_to_device(self.host[:nbytes], self.device[:nbytes])
        self.be.record(self._copied[self.cur])
        self._sent = True
