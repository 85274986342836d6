"""Choices (SamplingParams.n > 1): one prompt, n sequences, the prompt computed once.

A request of n choices runs as one sequence until its first sample. That step samples the one
logits row n times (engine/model_runner.py: choice i seeded choice_seed(seed, i), with its own
history slot when penalised); then ChoiceForker.fork makes choices 1..n-1 new running sequences that
share every KV block of choice 0 (BlockManager.fork: reference counts, no copy), before choice 0's
token is appended (which may end it and free its blocks). From there each choice is an ordinary
sequence: scheduled, preempted and finished on its own; the first time one appends into a block
another still holds, that block is copied first (copy on write, BlockManager.reserve). Their
outputs carry the request id and their index; the request is over when every choice is
(RequestOutput.request_finished, Sequence.all_finished).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from sharpinf.engine.block_manager import BlockManager
from sharpinf.engine.logprobs import TokenLogprobs
from sharpinf.engine.model_runner import ForkRows, SlotPool
from sharpinf.engine.scheduler import Scheduler
from sharpinf.engine.sequence import Sequence
from sharpinf.ops.sampling import choice_seed
from sharpinf.params import SamplingParams
from sharpinf.textgen import StopChecker


@dataclass
class ChoiceForker:
    """Makes a request's extra choices once its first sample is collected. Its collaborators are
    named: the block manager (the shared blocks), the scheduler (the new sequences), the runner's
    sampling slots, the engine's stop rules for a prompt (params, prompt length) and its table of
    unfinished requests."""

    blocks: BlockManager
    scheduler: Scheduler
    slots: SlotPool
    stop_rules: Callable[[SamplingParams, int], StopChecker]
    live: dict[str, Sequence]

    def fork(self, rows: ForkRows, now: float) -> list[tuple[Sequence, int, TokenLogprobs | None]]:
        """Choices 1..n-1 of rows.seq, sharing its blocks (running) -- or, when it was preempted while
        its first sample was in flight (async scheduling), waiting to recompute; with the first token
        each is to append and its logprobs."""
        parent = rows.seq
        assert not parent.is_finished and parent.forks_inflight == len(rows.tokens), "a choice forks once, when collected"
        parent.forks_inflight = 0
        held = bool(parent.block_table)  # False: preempted since its fork step was submitted
        computed = len(parent.prompt_ids)  # what the fork step computed: the prompt
        group, out = [parent], []
        p = parent.params
        for i, (token, slot, lp) in enumerate(zip(rows.tokens, rows.slots, rows.logprobs), start=1):
            child = Sequence(parent.request_id, parent.prompt_ids, p, choice_seed(parent.seed, i),
                             self.stop_rules(p, len(parent.prompt_ids)), index=i)
            child.metrics.arrival = parent.metrics.arrival
            if parent.grammar is not None:  # its own matcher, in the state the first sample saw
                child.grammar = parent.grammar.copy()
            if held:
                child.metrics.cached_prompt_tokens = computed  # served by the fork, not computed
                self.blocks.fork(parent, child, computed)
                if slot >= 0:  # its slot holds the prompt and, set by the kernel, its first token
                    child.sample_slot, child.seen_synced = slot, computed + 1
            elif slot >= 0:  # it recomputes into a fresh slot when admitted
                self.slots.give(slot)
            self.scheduler.add_forked(child, running=held)
            self.live[child.key] = child
            group.append(child)
            out.append((child, token, lp))
        for s in group:
            s.choices = group
        return out

    def cancel(self, rows: ForkRows) -> None:
        """A forking request ended before its fork step was collected: no choices, their slots free."""
        rows.seq.forks_inflight = 0
        for s in rows.slots:
            if s >= 0:
                self.slots.give(s)
