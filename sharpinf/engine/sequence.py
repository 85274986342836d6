"""Sequence: one request's state as it moves waiting -> running -> finished.

tokens = prompt + generated. num_computed counts the tokens whose K/V sit in the cache;
a step feeds tokens[num_computed : num_computed + chunk], and when that reaches the end
the step's last logits give the next token. Decode is the case of one token left;
a preempted sequence drops its cache (num_computed = 0) and is fed again, prompt and
generated tokens alike, which its caller never sees.

With async scheduling a step is submitted before the previous one's ids are back: a token a
submitted step will sample is appended at once as PENDING (the scheduler sees a decode), and
`feed_row` says which row of that step's sampled ids holds it (the next step's embedding takes
it from there on the device); collecting the step puts the real id in its place.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from sharpinf.ops.sampling import needs_slot, param_row
from sharpinf.params import SamplingParams
from sharpinf.textgen import StopChecker

PENDING = -1  # a token sampled by a step still in flight (never fed as such: see feed_row)


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class SeqMetrics:
    arrival: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished: float | None = None
    preemptions: int = 0
    cached_prompt_tokens: int = 0  # served by the prefix cache at (last) admission
    computed_tokens: int = 0  # tokens the forward pass computed for it (prompt, fed tokens; recomputation too)
    discarded_tokens: int = 0  # of those, the ones its preemptions threw away (each admission's work)
    admissions: int = 0  # times it entered the running set (1 + preemptions, or as many if it ended waiting)
    rolled_back: list[int] = field(default_factory=list)  # positions a verification computed and threw away

    def to_json(self) -> dict:
        itl = [b - a for a, b in zip(self.token_times, self.token_times[1:])]
        return {
            "ttft_s": None if self.first_token is None else self.first_token - self.arrival,
            "mean_itl_s": sum(itl) / len(itl) if itl else None,
            "max_itl_s": max(itl) if itl else None,
            "e2e_s": None if self.finished is None else self.finished - self.arrival,
            "preemptions": self.preemptions,
            "cached_prompt_tokens": self.cached_prompt_tokens,
        }


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    stop: StopChecker
    tokens: list[int] = field(init=False)
    status: Status = Status.WAITING
    num_computed: int = 0
    block_table: list[int] = field(default_factory=list)  # SLID (-1) for blocks freed by a sliding window
    slid_blocks: int = 0  # leading blocks of block_table already freed because every window has left them
    finish_reason: str | None = None
    error: str | None = None  # why the engine rejected it after admission to the queue
    metrics: SeqMetrics = field(default_factory=SeqMetrics)
    admitted_at: int = -1  # scheduler step of (last) admission: LIFO preemption order
    sample_slot: int = -1  # the device slot of its penalties and logit_bias (-1: none held)
    seen_synced: int = 0  # tokens[:seen_synced] are in that slot
    registered_blocks: int = 0  # leading full blocks already offered to the prefix cache
    last_block_hash: int | None = None  # the chained hash of the last of them
    grammar: Any = None  # engine/grammar.Grammar: the structured output's matcher (None: unconstrained)
    sent_chars: int = 0  # characters of stop.text already given out as deltas (final ones only)
    index: int = 0  # which choice of its request (n > 1: 0 .. n-1; engine/fork.py)
    choices: list["Sequence"] = field(default_factory=list, repr=False)  # choice 0's: every choice, once forked
    pending: int = 0  # trailing PENDING tokens (at most 2: the steps in flight)
    feed_row: int = -1  # the last submitted step's sampled-ids row that holds tokens[-1] (if PENDING)
    guesses: list[int] = field(default_factory=list)  # speculative: its proposer's guesses for this step
    drafts: int = 0  # trailing tokens that are guesses the scheduled step verifies (engine/speculative.py)

    def __post_init__(self):
        self.tokens = list(self.prompt_ids)
        p = self.params
        # what the sampling kernel reads for this request, packed once
        self.sampling_row = param_row(p)
        self.top_k = min(p.top_k, 2**31 - 1)
        self.penalised = needs_slot(p)  # holds a device slot: history bits, generated counts, logit_bias
        self.forks = p.n - 1 if self.index == 0 else 0  # choices still to fork at the first sample
        self.forks_inflight = 0  # choices its submitted first sample forks when collected

    @property
    def key(self) -> str:
        """The engine's name for this sequence: the request id, and #index for choices after the first."""
        return self.request_id if self.index == 0 else f"{self.request_id}#{self.index}"

    @property
    def all_finished(self) -> bool:
        """The request is over: every choice finished (a request that never forked: this one)."""
        return all(s.is_finished for s in self.choices) if self.choices else self.is_finished

    @property
    def output_ids(self) -> list[int]:
        return self.tokens[len(self.prompt_ids):]

    @property
    def remaining(self) -> int:
        """Tokens still to feed before the next token can be sampled."""
        return len(self.tokens) - self.num_computed

    @property
    def out_of_room(self) -> bool:
        """Its tokens, pending ones included, already reach max_tokens or the context: the step
        that samples the last of them ends it, so it needs no further step."""
        n, p = len(self.tokens) - len(self.prompt_ids), self.params
        return (p.max_tokens is not None and n >= p.max_tokens) or n >= self.stop.context_left

    def drop_pending(self) -> None:
        """It ended: tokens of steps still in flight are never emitted."""
        if self.pending:
            del self.tokens[len(self.tokens) - self.pending :]
        self.pending, self.feed_row = 0, -1

    @property
    def guess_room(self) -> int:
        """Guesses a step could verify before max_tokens or the context ends it (their K/V stays in its
        room; more would be thrown away)."""
        n, p = len(self.tokens) - self.drafts - len(self.prompt_ids), self.params
        r = self.stop.context_left - n - 1
        return r if p.max_tokens is None else min(r, p.max_tokens - n - 1)

    def drop_drafts(self) -> None:
        """Its guesses leave its tokens (verified, or never run: it was preempted)."""
        if self.drafts:
            del self.tokens[len(self.tokens) - self.drafts :]
        self.drafts = 0

    @property
    def speculates(self) -> bool:
        """May it verify guesses? Not with a row that depends on its earlier tokens on the device (a
        penalty's or logit_bias's slot) or on the host (a grammar's mask), nor before its first
        token (its prefill samples that) or with choices still to fork."""
        return not self.penalised and self.grammar is None and self.forks == 0 and len(self.tokens) > len(self.prompt_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED
