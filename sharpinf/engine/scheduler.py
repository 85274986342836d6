"""Scheduler: what runs in the next step. One step = one forward call on one packed batch.

Order within a step, under a token budget (max_num_batched_tokens) and max_num_seqs:
  1. running sequences with one token left (decodes), oldest admission first;
  2. running sequences still prefilling, a chunk each, oldest first;
  3. waiting sequences, first come first served, admitted while their first chunk's
     blocks are free (backpressure: a request waits rather than running memory out) and
     max_num_seqs has room for every choice of the request (n > 1: the choices fork from it).
A running sequence whose pending token already reaches max_tokens (or the context) is not
scheduled: async scheduling knows ahead that collecting that token ends it. One with a grammar is
(its next mask depends on the pending token: the model runner sends it once that token is in,
while the device runs the step). A waiting sequence
with a pending token (preempted while its token was in flight) is admitted only once the token
is real (the next step), so the history and hashes it is recomputed from are real ids.
When a running sequence needs a block and none is free, the most recently admitted
running sequence is preempted (LIFO) by recompute: its blocks are released and it goes
back to the front of the waiting queue. The oldest sequence therefore always makes
progress, chunk by chunk, even when its whole recompute exceeds the budget.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from sharpinf.engine.block_manager import BlockManager
from sharpinf.engine.config import EngineConfig
from sharpinf.engine.sequence import Sequence, Status


@dataclass
class ScheduledChunk:
    seq: Sequence
    n_tokens: int  # feed seq.tokens[num_computed : num_computed + n_tokens]

    @property
    def samples(self) -> bool:
        """Does this chunk reach the end of the sequence's tokens (so a token is sampled)?"""
        return self.seq.num_computed + self.n_tokens == len(self.seq.tokens)


@dataclass
class Scheduler:
    config: EngineConfig
    blocks: BlockManager
    waiting: deque = field(default_factory=deque)
    running: list[Sequence] = field(default_factory=list)  # in admission order
    step_index: int = 0
    admissions: int = 0
    preemptions: int = 0
    on_release: Callable[[Sequence], None] | None = None  # a sequence leaves the running set

    def _release(self, seq: Sequence) -> None:
        self.blocks.release(seq)
        if self.on_release is not None:
            self.on_release(seq)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _preempt(self, victim: Sequence) -> None:
        self.running.remove(victim)
        victim.drop_drafts()  # its guesses, scheduled this step, are not run
        # what this admission computed is thrown away (the cache then serves what it still holds)
        victim.metrics.discarded_tokens += victim.num_computed - victim.metrics.cached_prompt_tokens
        self._release(victim)
        victim.status = Status.WAITING
        victim.metrics.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(victim)

    def _make_room(self, seq: Sequence, upto: int, scheduled: list[ScheduledChunk]) -> bool:
        """Reserve blocks for seq up to `upto`, preempting the youngest younger running sequence
        (dropping its chunk if it was already scheduled) as often as needed. False if seq
        itself is the youngest left and had to be preempted."""
        while not self.blocks.reserve(seq, upto):
            younger = [s for s in self.running if s.admitted_at > seq.admitted_at]
            victim = max(younger, key=lambda s: s.admitted_at) if younger else seq
            scheduled[:] = [c for c in scheduled if c.seq is not victim]
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def _guesses(self, seq: Sequence, budget: int) -> int:
        """How many of seq's guesses this step verifies: within the budget, and no more than could be
        emitted before max_tokens or the context ends it (so their K/V stays inside its room)."""
        if not seq.guesses:
            return 0
        return max(0, min(len(seq.guesses), budget - 1, seq.guess_room))

    def _chunk(self, seq: Sequence, budget: int, remaining: int | None = None) -> int:
        remaining = seq.remaining if remaining is None else remaining
        if self.config.enable_chunked_prefill:
            return min(remaining, budget)
        return remaining  # whole: the step runs over budget rather than split a prompt

    def schedule(self) -> list[ScheduledChunk]:
        cfg, budget = self.config, self.config.max_num_batched_tokens
        scheduled: list[ScheduledChunk] = []
        self.step_index += 1

        for seq in [s for s in self.running if s.remaining == 1 and not s.out_of_room]:  # 1. decodes
            if budget <= 0:
                break
            m = self._guesses(seq, budget)
            if seq.status is Status.RUNNING and self._make_room(seq, len(seq.tokens) + m, scheduled):
                if m:  # its last token and m guesses, verified as one chunk (engine/speculative.py)
                    seq.tokens += seq.guesses[:m]
                    seq.drafts = m
                scheduled.append(ScheduledChunk(seq, 1 + m))
                budget -= 1 + m
        for s in self.running:
            s.guesses = []

        prefill = False  # a prefill chunk is in this step (an unchunked prompt over budget waits)
        for seq in [s for s in self.running if s.remaining > 1 and not s.drafts]:  # 2. prefills in progress
            if budget <= 0:
                break
            if seq.status is not Status.RUNNING:  # preempted to make room above
                continue
            n = self._chunk(seq, budget)
            if self._make_room(seq, seq.num_computed + n, scheduled):
                scheduled.append(ScheduledChunk(seq, n))
                budget -= n
                prefill = True

        while self.waiting and budget > 0:  # 3. admissions
            seq = self.waiting[0]
            if self.seats() + 1 + seq.forks > cfg.max_num_seqs:
                break  # a request of n choices waits for room for all n (they run side by side)
            if seq.pending:
                break  # preempted with its last token in flight: admitted once that token is real
            # the first chunk starts after what the prefix cache serves: count only those blocks
            n = self._chunk(seq, budget, len(seq.tokens) - self.blocks.cached_prefix_len(seq))
            if n > budget and prefill:
                break  # unchunked prompt over budget: it gets a step with no other prefill
            if not self.blocks.admit(seq, n):
                break  # backpressure: first come, first served, nobody jumps the queue
            self.waiting.popleft()
            seq.status = Status.RUNNING
            self.admissions += 1
            seq.admitted_at = self.admissions
            seq.metrics.admissions += 1
            self.running.append(seq)
            scheduled.append(ScheduledChunk(seq, n))
            budget -= n
            prefill = True
        return scheduled

    def seats(self) -> int:
        """Running sequences, with the choices they will fork at their first sample (or fork when
        its submitted step is collected)."""
        return len(self.running) + sum(s.forks + s.forks_inflight for s in self.running)

    def add_forked(self, child: Sequence, running: bool = True) -> None:
        """A choice forked from a running sequence runs from now on (the youngest: preempted first);
        from one preempted while its first sample was in flight, it waits at the front to recompute."""
        if not running:
            child.status = Status.WAITING
            self.waiting.appendleft(child)
            return
        child.status = Status.RUNNING
        self.admissions += 1
        child.admitted_at = self.admissions
        child.metrics.admissions += 1
        self.running.append(child)

    def finish(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._release(seq)
        seq.status = Status.FINISHED
