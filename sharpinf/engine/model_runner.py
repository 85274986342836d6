"""ModelRunner: scheduled chunks -> one packed Batch -> ForwardPass -> sampled token ids.

Only the chosen ids (one int per sampling sequence) come back to the host each step;
logits stay on the device, where the sampling kernel reads them. A request with a
repetition, presence or frequency penalty or a logit_bias holds a slot on the device while it
runs: each step sends only the ids it has not sent yet (its prompt once, then one token a
step), never the history; the kernel counts the ids it picks itself, so the generated counts
cross only when a re-admitted request rebuilds its slot; the logit_bias is sent once, when the
request takes the slot.
A request that asks for logprobs has its logits row copied back (that row only), which
engine/logprobs.py turns into TokenLogprobs. A request with n > 1 choices samples its first token
n times from its one logits row (the row listed n times, each choice with its own seed and, with a
penalty, its own history slot); the engine then forks the extra choices (engine/fork.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from sharpinf.step.batch import Batch, SeqChunk
from sharpinf.engine.logprobs import TokenLogprobs
from sharpinf.engine.scheduler import ScheduledChunk
from sharpinf.engine.sequence import Sequence
from sharpinf.engine.grammar import fill_masks
from sharpinf.ops.sampling import bias_row, choice_seed, history_words
from sharpinf.step.forward import ForwardPass
from sharpinf.step.kv_pool import KVPool
from sharpinf.step.buffers import SamplingRows

I32 = np.int32


@dataclass
class ForkRows:
    """The first tokens of choices 1..n-1 of `seq` (its first sample), with their history slots
    (-1: no penalty) and logprobs."""

    seq: Sequence
    tokens: list[int]
    slots: list[int]
    logprobs: list[TokenLogprobs | None]


@dataclass
class ModelRunner:
    fp: ForwardPass
    pool: KVPool
    validate: bool = True  # check every batch (vectorized; cheap next to a step)
    steps_run: int = 0
    tokens_run: int = 0
    last_batch: Batch | None = field(default=None, repr=False)
    free_slots: list[int] = field(init=False)
    last_logprobs: dict[str, TokenLogprobs] = field(default_factory=dict, repr=False)  # Sequence.key -> this step's
    last_forks: list["ForkRows"] = field(default_factory=list, repr=False)  # this step's extra choices

    def __post_init__(self):
        self.free_slots = list(range(self.fp.capacity.rows - 1, -1, -1))

    def release(self, seq: Sequence) -> None:
        """seq left the running set (finished or preempted): its history slot is free again."""
        if seq.sample_slot >= 0:
            self.free_slots.append(seq.sample_slot)
        seq.sample_slot, seq.seen_synced = -1, 0

    def run(self, chunks: list[ScheduledChunk]) -> list[int | None]:
        """Run one step; for each chunk the sampled token, or None if it did not reach the end.
        The extra choices' first tokens are in last_forks."""
        seq_chunks = []
        for c in chunks:
            s = c.seq
            seq_chunks.append(SeqChunk(s.tokens[s.num_computed : s.num_computed + c.n_tokens], s.num_computed,
                                       s.block_table, want_logits=c.samples))
        batch = Batch.build(seq_chunks, self.pool.block_size)
        samplers = [c for c in chunks if c.samples]
        forking = [(r, c.seq) for r, c in enumerate(samplers) if c.seq.forks > 0]
        if forking:  # each forking request's row again for each extra choice, after the others
            extra = [batch.logits_rows[r] for r, s in forking for _ in range(s.forks)]
            batch = replace(batch, logits_rows=np.concatenate([batch.logits_rows, np.asarray(extra, I32)]))
        self.last_batch = batch
        rows = self.sampling_rows(samplers, [s for _, s in forking]) if samplers else None
        out = self.fp.forward(batch, self.pool, validate=self.validate, sampling=rows)
        self.steps_run += 1
        self.tokens_run += batch.n_tokens
        self.last_logprobs, self.last_forks = {}, []
        if out.sampled is None:
            return [None] * len(chunks)
        ids = out.sampled.tolist()
        row_seqs = [c.seq for c in samplers] + [s for _, s in forking for _ in range(s.forks)]
        lps = [self._logprobs(out, r, s, ids[r]) for r, s in enumerate(row_seqs)]
        for r, c in enumerate(samplers):
            if lps[r] is not None:
                self.last_logprobs[c.seq.key] = lps[r]
        at = len(samplers)
        for _, s in forking:
            span = slice(at, at + s.forks)
            self.last_forks.append(ForkRows(s, ids[span], list(rows.slots[span]), lps[span]))
            at += s.forks
        chosen = iter(ids)
        return [next(chosen) if c.samples else None for c in chunks]

    def _logprobs(self, out, r: int, seq: Sequence, token: int) -> TokenLogprobs | None:
        k = seq.params.logprobs
        if k is None:
            return None
        row = self.fp.backend.download(out.logits[r : r + 1])[0]
        return TokenLogprobs.of(row, token, k)

    def sampling_rows(self, chunks: list[ScheduledChunk], forking: list[Sequence] = ()) -> SamplingRows:
        """One row per sampling chunk, then for each forking sequence one per extra choice (its
        seed choice_seed(seed, i); with a penalty or bias a fresh slot holding the prompt)."""
        seqs = [c.seq for c in chunks]
        extra = [(s, i) for s in forking for i in range(1, s.forks + 1)]
        R = len(seqs) + len(extra)
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
        for r, (s, _) in enumerate(extra, start=len(seqs)):
            if s.penalised:  # the choice's own slot from its first token: the prompt, sent once
                slots[r], clear[r] = self.free_slots.pop(), 1
                self.fp.set_slot_bias(slots[r], bias_row(s.params))
                adds.append(s.tokens)
                n += len(s.tokens)
            off[r + 1] = n
        all_seqs = seqs + [s for s, _ in extra]
        # structured output: each constrained row's allowed ids, computed here on the host (one call);
        # a forking request's extra rows start from the same grammar state as its own row
        mask_idx, masks = fill_masks([s.grammar for s in all_seqs], history_words(self.fp.cfg.n_vocab))
        return SamplingRows(
            params=np.array([s.sampling_row for s in all_seqs], np.float32),
            top_k=np.fromiter((s.top_k for s in all_seqs), I32, R),
            seeds=np.array([s.seed for s in seqs] + [choice_seed(s.seed, i) for s, i in extra], np.uint64),
            steps=np.fromiter((len(s.tokens) - len(s.prompt_ids) for s in all_seqs), I32, R),
            slots=slots, clear=clear, add_off=off,
            add_ids=np.fromiter((t for a in adds for t in a), I32, n) if n else np.zeros(0, I32),
            count_n=count_n,
            mask_idx=mask_idx, masks=masks,
        )
