"""ModelRunner: scheduled chunks -> one packed Batch -> ForwardPass -> sampled token ids.

Only the chosen ids (one int per sampling sequence) come back to the host each step;
logits stay on the device, where the sampling kernel reads them. A request with a
repetition, presence or frequency penalty or a logit_bias holds a slot on the device while it
runs: the host sends its prompt once (all its tokens again after a preemption, and then the
generated ids' counts too); each id it generates the sampling kernel sets and counts in the slot
itself, so a step can be sent before the last one's ids are back; the logit_bias is sent once,
when the request takes the slot.
A request that asks for logprobs has its logits row copied back (that row only, within its
step, before a later step overwrites it), which engine/logprobs.py turns into TokenLogprobs.
A request with n > 1 choices samples its first token n times from its one logits row (the row
listed n times, each choice with its own seed and, with a penalty or bias, its own slot); the
engine then forks the extra choices (engine/fork.py).
A step is submit() then collect(): the engine may submit the next step in between (async
scheduling), whose decode tokens are then fed from this step's ids on the device. A row with a
grammar whose last token is that one cannot have its mask yet: such a step is submitted with its
masks to come (the device runs its body meanwhile), and finish() sends them and queues its
sampling once the step before it is collected (which advances the grammars).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from sharpinf.engine.grammar import fill_masks, mask_index
from sharpinf.engine.logprobs import TokenLogprobs
from sharpinf.engine.scheduler import ScheduledChunk
from sharpinf.engine.sequence import PENDING, Sequence
from sharpinf.ops.sampling import bias_row, choice_seed, history_words
from sharpinf.step.batch import Batch, SeqChunk
from sharpinf.step.buffers import SamplingRows
from sharpinf.step.forward import ForwardPass
from sharpinf.step.kv_pool import KVPool
from sharpinf.step.pending import PendingStep

I32 = np.int32


@dataclass
class ForkRows:
    """The first tokens of choices 1..n-1 of `seq` (its first sample), with their slots (-1: none)
    and logprobs."""

    seq: Sequence
    tokens: list[int]
    slots: list[int]
    logprobs: list[TokenLogprobs | None]


@dataclass
class RunnerStep:
    """A submitted step: its chunks, the ones that sample (row r = samplers[r], then the forking
    sequences' extra rows), its PendingStep."""

    chunks: list[ScheduledChunk]
    samples: list[bool]  # per chunk, as it was at submission (ScheduledChunk.samples reads the live sequence)
    samplers: list[ScheduledChunk]
    forking: list[tuple[Sequence, int, list[int]]]  # (sequence, extra rows' first row, their slots)
    pending: PendingStep
    logprob_rows: list[int]  # rows whose logits the step copied back (PendingStep.logits_host, in order)
    row_seqs: list[Sequence]  # the sequence of every row
    masks_later: list | None = None  # every row's grammar, when its masks wait for finish()
    first_row: list[int] = field(default_factory=list)  # per sampler, its first row
    drafts: list[int] = field(default_factory=list)  # per sampler, the guesses it verifies (rows: 1 + that)


class SlotPool:
    """The device's per-request sampling slots (history bits, counts, logit_bias) not held by a
    running request: taken when a penalised request (or a forked choice) first samples, given back
    when it leaves the running set."""

    def __init__(self, n: int):
        self._free = list(range(n - 1, -1, -1))  # popped from the end: slot 0 first

    def take(self) -> int:
        return self._free.pop()

    def give(self, slot: int) -> None:
        self._free.append(slot)

    def __len__(self) -> int:
        return len(self._free)


@dataclass
class ModelRunner:
    fp: ForwardPass
    pool: KVPool
    validate: bool = True  # check every batch (vectorized; cheap next to a step)
    steps_run: int = 0
    tokens_fed: int = 0  # tokens fed on the device from the previous step's ids (async scheduling)
    last_batch: Batch | None = field(default=None, repr=False)
    slots: SlotPool = field(init=False)
    last_logprobs: dict[str, TokenLogprobs] = field(default_factory=dict, repr=False)  # Sequence.key -> this step's
    last_forks: list[ForkRows] = field(default_factory=list, repr=False)  # the collected step's extra choices

    def __post_init__(self):
        self.slots = SlotPool(self.fp.capacity.rows)

    def release(self, seq: Sequence) -> None:
        """seq left the running set (finished or preempted): its slot is free again."""
        if seq.sample_slot >= 0:
            self.slots.give(seq.sample_slot)
        seq.sample_slot, seq.seen_synced = -1, 0

    def run(self, chunks: list[ScheduledChunk]) -> list[int | None]:
        """Run one step; for each chunk the sampled token, or None if it did not reach the end."""
        return self.collect(self.submit(chunks))

    def submit(self, chunks: list[ScheduledChunk]) -> RunnerStep:
        """Pack and queue one step (ForwardPass.submit); returns before its ids are back. A chunk
        that ends at a PENDING token (sampled by the step submitted just before) feeds it from that
        step's sampled-ids row on the device."""
        seq_chunks, fed = [], []
        for i, c in enumerate(chunks):
            s = c.seq
            toks = s.tokens[s.num_computed : s.num_computed + c.n_tokens]
            if toks[-1] == PENDING:  # only the last token can be: the scheduler never admits it mid-flight
                assert s.pending == 1 and s.feed_row >= 0 and c.samples, f"{s.key}: a pending token fed out of place"
                toks = toks[:-1] + [0]  # a valid id in the batch; the device puts the real one in
                fed.append((i, s.feed_row))
            assert not s.drafts or PENDING not in toks, f"{s.key}: guesses verified after a pending token"
            seq_chunks.append(SeqChunk(toks, s.num_computed, s.block_table, want_logits=c.samples,
                                       n_logits=1 + s.drafts))
        batch = Batch.build(seq_chunks, self.pool.block_size)
        feed = None
        if fed:
            feed = np.full(batch.n_tokens, -1, I32)
            for i, row in fed:
                feed[batch.cu_seqlens[i + 1] - 1] = row
        samplers = [c for c in chunks if c.samples]
        first = np.cumsum([0] + [1 + c.seq.drafts for c in samplers])  # a speculative chunk: a row a token
        forks = [(int(first[r]), c.seq) for r, c in enumerate(samplers) if c.seq.forks > 0]
        if forks:  # each forking request's row again for each extra choice, after the others
            extra = [batch.logits_rows[r] for r, s in forks for _ in range(s.forks)]
            batch = replace(batch, logits_rows=np.concatenate([batch.logits_rows, np.asarray(extra, I32)]))
        self.last_batch = batch
        rows = self.sampling_rows(samplers, [s for _, s in forks]) if samplers else None
        row_seqs = [c.seq for c in samplers for _ in range(1 + c.seq.drafts)] + [s for _, s in forks for _ in range(s.forks)]
        lp_rows = [r for r, s in enumerate(row_seqs) if s.params.logprobs is not None]
        later = rows is not None and rows.mask_idx is not None and rows.masks is None
        pending = self.fp.submit(batch, self.pool, validate=self.validate, sampling=rows, feed_rows=feed,
                                 copy_rows=lp_rows, masks_later=later)
        forking, at = [], int(first[-1])
        for _, s in forks:
            forking.append((s, at, [int(x) for x in rows.slots[at : at + s.forks]]))
            at += s.forks
        self.steps_run += 1
        self.tokens_fed += len(fed)
        return RunnerStep(list(chunks), [c.samples for c in chunks], samplers, forking, pending, lp_rows, row_seqs,
                          [s.grammar for s in row_seqs] if later else None, [int(r) for r in first[:-1]],
                          [c.seq.drafts for c in samplers])

    def finish(self, step: RunnerStep) -> None:
        """A step whose masks waited (submit): its grammars have their last tokens now (the step
        before it was collected), so compute the masks and queue its sampling. A row whose request
        ended meanwhile gets any id (its sample is discarded). Before any later submit."""
        if step.masks_later is None:
            return
        _, masks = fill_masks(step.masks_later, history_words(self.fp.cfg.n_vocab),
                              ended=[s.is_finished for s in step.row_seqs])
        self.fp.sample(step.pending, masks)
        step.masks_later = None

    def collect(self, step: RunnerStep) -> list[int | list[int] | None]:
        """Wait for a submitted step's ids: for each chunk the sampled token, or None, or for a chunk
        verifying m guesses the target's m + 1 picks; the forking sequences' extra choices in last_forks."""
        out = step.pending.result()
        self.last_logprobs, self.last_forks = {}, []
        if out.sampled is None:
            return [None] * len(step.chunks)
        ids = out.sampled.tolist()
        lps: dict[int, TokenLogprobs] = {}
        for i, r in enumerate(step.logprob_rows):
            lps[r] = TokenLogprobs.of(step.pending.logits_host[i], ids[r], step.row_seqs[r].params.logprobs)
        picks = []  # per sampler: its token, or a speculative chunk's picks (a list: one a row)
        for c, r, m in zip(step.samplers, step.first_row, step.drafts):
            picks.append(ids[r] if not m else ids[r : r + m + 1])
            if r in lps:
                self.last_logprobs[c.seq.key] = lps[r] if not m else [lps[r + i] for i in range(m + 1)]
        for s, at, slots in step.forking:
            span = range(at, at + len(slots))
            self.last_forks.append(ForkRows(s, [ids[r] for r in span], slots, [lps.get(r) for r in span]))
        chosen = iter(picks)
        return [next(chosen) if samples else None for samples in step.samples]

    def sampling_rows(self, chunks: list[ScheduledChunk], forking: list[Sequence] = ()) -> SamplingRows:
        """One row per sampling chunk, then for each forking sequence one per extra choice (its
        seed choice_seed(seed, i); with a penalty or bias a fresh slot holding the prompt)."""
        seqs = [c.seq for c in chunks for _ in range(1 + c.seq.drafts)]  # a speculative chunk: a row a token
        at = [i for c in chunks for i in range(1 + c.seq.drafts)]  # the row's place in its chunk's picks
        extra = [(s, i) for s in forking for i in range(1, s.forks + 1)]
        R = len(seqs) + len(extra)
        slots, clear, off, adds = np.full(R, -1, I32), np.zeros(R, I32), np.zeros(R + 1, I32), []
        count_n = np.zeros(R, I32)
        n = 0
        for r, s in enumerate(seqs):
            if s.penalised:  # never speculates: one row
                if s.sample_slot < 0:  # (re)admitted: a fresh slot, cleared on the device
                    s.sample_slot, s.seen_synced, clear[r] = self.slots.take(), 0, 1
                    count_n[r] = len(s.tokens) - len(s.prompt_ids)  # generated before a preemption
                    self.fp.set_slot_bias(s.sample_slot, bias_row(s.params))
                # every id fed up to this step, sent once (a PENDING one, the kernel already set);
                # the id this row samples, the kernel sets and counts too
                new = [t for t in s.tokens[s.seen_synced :] if t != PENDING]
                s.seen_synced = len(s.tokens) + 1
                slots[r] = s.sample_slot
                adds.append(new)
                n += len(new)
            off[r + 1] = n
        for r, (s, _) in enumerate(extra, start=len(seqs)):
            if s.penalised:  # the choice's own slot from its first token: the prompt, sent once
                slots[r], clear[r] = self.slots.take(), 1
                self.fp.set_slot_bias(slots[r], bias_row(s.params))
                adds.append(list(s.prompt_ids))
                n += len(s.prompt_ids)
            off[r + 1] = n
        all_seqs = seqs + [s for s, _ in extra]
        # structured output: each constrained row's allowed ids, computed here on the host (one call);
        # a forking request's extra rows start from the same grammar state as its own row. A grammar
        # whose last token is still in flight has no mask yet: all masks then wait for finish()
        grammars = [s.grammar for s in all_seqs]
        if any(g is not None and s.pending for s, g in zip(all_seqs, grammars)):
            mask_idx, masks = mask_index(grammars), None
        else:
            mask_idx, masks = fill_masks(grammars, history_words(self.fp.cfg.n_vocab))
        return SamplingRows(
            params=np.array([s.sampling_row for s in all_seqs], np.float32),
            top_k=np.fromiter((s.top_k for s in all_seqs), I32, R),
            seeds=np.array([s.seed for s in seqs] + [choice_seed(s.seed, i) for s, i in extra], np.uint64),
            # the draw is keyed by the tokens generated before the row's, as in plain decoding
            steps=np.fromiter((len(s.tokens) - s.drafts - len(s.prompt_ids) + i
                               for s, i in zip(all_seqs, at + [0] * len(extra))), I32, R),
            slots=slots, clear=clear, add_off=off,
            add_ids=np.fromiter((t for a in adds for t in a), I32, n) if n else np.zeros(0, I32),
            count_n=count_n,
            mask_idx=mask_idx, masks=masks,
        )
