"""ModelRunner: scheduled chunks -> one packed Batch -> ForwardPass -> sampled token ids.

Only the chosen ids (one int per sampling sequence) come back to the host each step;
logits stay on the device, where the sampling kernel reads them. A request with a
repetition, presence or frequency penalty or a logit_bias holds a slot on the device while it
runs: each step sends only the ids it has not sent yet (its prompt once, then one token a
step), never the history; the kernel counts the ids it picks itself, so the generated counts
cross only when a re-admitted request rebuilds its slot; the logit_bias is sent once, when the
request takes the slot.
A request that asks for logprobs has its logits row copied back (that row only), which
engine/logprobs.py turns into TokenLogprobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sharpinf.step.batch import Batch, SeqChunk
from sharpinf.engine.logprobs import TokenLogprobs
from sharpinf.engine.scheduler import ScheduledChunk
from sharpinf.engine.sequence import Sequence
from sharpinf.engine.grammar import fill_masks
from sharpinf.ops.sampling import bias_row, history_words
from sharpinf.step.forward import ForwardPass
from sharpinf.step.kv_pool import KVPool
from sharpinf.step.buffers import SamplingRows

I32 = np.int32


@dataclass
class ModelRunner:
    fp: ForwardPass
    pool: KVPool
    validate: bool = True  # check every batch (vectorized; cheap next to a step)
    steps_run: int = 0
    tokens_run: int = 0
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
        seq_chunks = []
        for c in chunks:
            s = c.seq
            seq_chunks.append(SeqChunk(s.tokens[s.num_computed : s.num_computed + c.n_tokens], s.num_computed,
                                       s.block_table, want_logits=c.samples))
        batch = Batch.build(seq_chunks, self.pool.block_size)
        self.last_batch = batch
        samplers = [c for c in chunks if c.samples]
        rows = self.sampling_rows(samplers) if samplers else None
        out = self.fp.forward(batch, self.pool, validate=self.validate, sampling=rows)
        self.steps_run += 1
        self.tokens_run += batch.n_tokens
        if out.sampled is None:
            return [None] * len(chunks)
        ids = out.sampled.tolist()
        self.last_logprobs = {}
        for r, c in enumerate(samplers):
            k = c.seq.params.logprobs
            if k is not None:
                row = self.fp.backend.download(out.logits[r : r + 1])[0]
                self.last_logprobs[c.seq.request_id] = TokenLogprobs.of(row, ids[r], k)
        chosen = iter(ids)
        return [next(chosen) if c.samples else None for c in chunks]

    def sampling_rows(self, chunks: list[ScheduledChunk]) -> SamplingRows:
        seqs = [c.seq for c in chunks]
        R = len(seqs)
        slots, clear, off, adds = np.full(R, -1, I32), np.zeros(R, I32), np.zeros(R + 1, I32), []
        count_n = np.zeros(R, I32)
        n = 0
        for r, s in enumerate(seqs):
            if s.penalised:
                if s.sample_slot < 0:  # (re)admitted: a fresh slot, cleared on the device
                    s.sample_slot, s.seen_synced, clear[r] = self.free_slots.pop(), 0, 1
                    count_n[r] = len(s.tokens) - len(s.prompt_ids)  # generated before a preemption
                    self.fp.set_slot_bias(s.sample_slot, bias_row(s.params))
                new = s.tokens[s.seen_synced :]  # everything fed up to this step, sent once
                s.seen_synced = len(s.tokens)
                slots[r] = s.sample_slot
                adds.append(new)
                n += len(new)
            off[r + 1] = n
        # structured output: each constrained row's allowed ids, computed here on the host (one call)
        mask_idx, masks = fill_masks([s.grammar for s in seqs], history_words(self.fp.cfg.n_vocab))
        return SamplingRows(
            params=np.array([s.sampling_row for s in seqs], np.float32),
            top_k=np.fromiter((s.top_k for s in seqs), I32, R),
            seeds=np.fromiter((s.seed for s in seqs), np.uint64, R),
            steps=np.fromiter((len(s.tokens) - len(s.prompt_ids) for s in seqs), I32, R),
            slots=slots, clear=clear, add_off=off,
            add_ids=np.fromiter((t for a in adds for t in a), I32, n) if n else np.zeros(0, I32),
            count_n=count_n,
            mask_idx=mask_idx, masks=masks,
        )
