"""ModelRunner: scheduled chunks -> one packed Batch -> ForwardPass -> sampled token ids.

Only the chosen ids (one int per sampling sequence) come back to the host each step;
logits stay on the device, where the sampling kernel reads them. A request with a
repetition penalty holds a history slot on the device while it runs: the host sends its prompt
once (all its tokens again after a preemption); each id it generates the sampling kernel sets
in the slot itself, so a step can be sent before the last one's ids are back.
A request that asks for logprobs has its logits row copied back (that row only, within its
step, before a later step overwrites it), which engine/logprobs.py turns into TokenLogprobs.
A step is submit() then collect(): the engine may submit the next step in between (async
scheduling), whose decode tokens are then fed from this step's ids on the device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sharpinf.step.batch import Batch, SeqChunk
from sharpinf.engine.logprobs import TokenLogprobs
from sharpinf.engine.scheduler import ScheduledChunk
from sharpinf.engine.sequence import PENDING, Sequence
from sharpinf.step.forward import ForwardPass, PendingStep
from sharpinf.step.kv_pool import KVPool
from sharpinf.step.buffers import SamplingRows

I32 = np.int32


@dataclass
class RunnerStep:
    """A submitted step: its chunks, the ones that sample (row r = samplers[r]), its PendingStep."""

    chunks: list[ScheduledChunk]
    samples: list[bool]  # per chunk, as it was at submission (ScheduledChunk.samples reads the live sequence)
    samplers: list[ScheduledChunk]
    pending: PendingStep
    logprob_rows: list[int]  # rows whose logits the step copied back (PendingStep.logits_host, in order)


@dataclass
class ModelRunner:
    fp: ForwardPass
    pool: KVPool
    validate: bool = True  # check every batch (vectorized; cheap next to a step)
    steps_run: int = 0
    tokens_run: int = 0
    tokens_fed: int = 0  # tokens fed on the device from the previous step's ids (async scheduling)
    last_batch: Batch | None = field(default=None, repr=False)
    free_slots: list[int] = field(init=False)
    last_logprobs: dict[str, TokenLogprobs] = field(default_factory=dict, repr=False)  # request id -> this step's

    def __post_init__(self):
        self.free_slots = list(range(self.fp.capacity.rows - 1, -1, -1))

    def release(self, seq: Sequence) -> None:
        """seq left the running set (finished or preempted): its history slot is free again."""
        if seq.sample_slot >= 0:
            self.free_slots.append(seq.sample_slot)
        seq.sample_slot, seq.seen_synced = -1, 0

    def run(self, chunks: list[ScheduledChunk]) -> list[int | None]:
        """Run one step; for each chunk the sampled token, or None if it did not reach the end."""
        return self.collect(self.submit(chunks))

    def submit(self, chunks: list[ScheduledChunk]) -> "RunnerStep":
        """Pack and queue one step (ForwardPass.submit); returns before its ids are back. A chunk
        that ends at a PENDING token (sampled by the step submitted just before) feeds it from that
        step's sampled-ids row on the device."""
        seq_chunks, fed = [], []
        for i, c in enumerate(chunks):
            s = c.seq
            toks = s.tokens[s.num_computed : s.num_computed + c.n_tokens]
            if toks[-1] == PENDING:  # only the last token can be: the scheduler never admits it mid-flight
                assert s.pending == 1 and s.feed_row >= 0 and c.samples, f"{s.request_id}: a pending token fed out of place"
                toks = toks[:-1] + [0]  # a valid id in the batch; the device puts the real one in
                fed.append((i, s.feed_row))
            seq_chunks.append(SeqChunk(toks, s.num_computed, s.block_table, want_logits=c.samples))
        batch = Batch.build(seq_chunks, self.pool.block_size)
        feed = None
        if fed:
            feed = np.full(batch.n_tokens, -1, I32)
            for i, row in fed:
                feed[batch.cu_seqlens[i + 1] - 1] = row
        self.last_batch = batch
        samplers = [c for c in chunks if c.samples]
        rows = self.sampling_rows(samplers) if samplers else None
        lp_rows = [r for r, c in enumerate(samplers) if c.seq.params.logprobs is not None]
        pending = self.fp.submit(batch, self.pool, validate=self.validate, sampling=rows, feed_rows=feed,
                                 copy_rows=lp_rows)
        self.steps_run += 1
        self.tokens_run += batch.n_tokens
        self.tokens_fed += len(fed)
        return RunnerStep(list(chunks), [c.samples for c in chunks], samplers, pending, lp_rows)

    def collect(self, step: "RunnerStep") -> list[int | None]:
        """Wait for a submitted step's ids: for each chunk the sampled token, or None."""
        out = step.pending.result()
        self.last_logprobs = {}
        if out.sampled is None:
            return [None] * len(step.chunks)
        ids = out.sampled.tolist()
        for i, r in enumerate(step.logprob_rows):
            seq = step.samplers[r].seq
            self.last_logprobs[seq.request_id] = TokenLogprobs.of(step.pending.logits_host[i], ids[r],
                                                                  seq.params.logprobs)
        chosen = iter(ids)
        return [next(chosen) if samples else None for samples in step.samples]

    def sampling_rows(self, chunks: list[ScheduledChunk]) -> SamplingRows:
        seqs = [c.seq for c in chunks]
        R = len(seqs)
        slots, clear, off, adds = np.full(R, -1, I32), np.zeros(R, I32), np.zeros(R + 1, I32), []
        n = 0
        for r, s in enumerate(seqs):
            if s.penalised:
                if s.sample_slot < 0:  # (re)admitted: a fresh slot, cleared on the device
                    s.sample_slot, s.seen_synced, clear[r] = self.free_slots.pop(), 0, 1
                # every id fed up to this step, sent once (a PENDING one, the kernel already set);
                # the id this row samples, the kernel sets too
                new = [t for t in s.tokens[s.seen_synced :] if t != PENDING]
                s.seen_synced = len(s.tokens) + 1
                slots[r] = s.sample_slot
                adds.append(new)
                n += len(new)
            off[r + 1] = n
        return SamplingRows(
            params=np.array([s.sampling_row for s in seqs], np.float32),
            top_k=np.fromiter((s.top_k for s in seqs), I32, R),
            seeds=np.fromiter((s.seed for s in seqs), np.uint64, R),
            steps=np.fromiter((len(s.tokens) - len(s.prompt_ids) for s in seqs), I32, R),
            slots=slots, clear=clear, add_off=off,
            add_ids=np.fromiter((t for a in adds for t in a), I32, n) if n else np.zeros(0, I32),
        )
