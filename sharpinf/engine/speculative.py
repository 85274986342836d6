"""Speculative decoding that never changes an output.

A decoding sequence's proposer (n-gram lookup in its own tokens, or a draft model) guesses its
next k tokens; the scheduler feeds its last token and the guesses as one chunk of the packed step,
with logits at every position; the sampling kernel picks the target's token at each of them, each
row's draw keyed by the tokens generated before it, as plain decoding keys it. Acceptance keeps
guesses while each equals the target's own pick and ends with the target's pick at the first
mismatch (or after the last guess): every kept token is the one plain decoding would have drawn,
because a token's logits do not depend on what else is in the step (batch invariance), and the
K/V of a kept guess is the K/V of that token. So greedy and seeded outputs and their logprobs equal
plain decoding's bit for bit; speculation only changes how many target passes they take.

A sequence whose next row depends on the tokens before it on the device (repetition, presence or
frequency penalties, logit_bias: its sampling slot) or on the host (a grammar's mask) decodes
plainly; so does a request's first token (its prefill samples it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sharpinf.engine.spec_config import METHODS, SpeculativeConfig  # noqa: F401 (imported from here too)


def accept(guesses: list[int], picks: list[int]) -> list[int]:
    """The tokens a verified chunk emits: the guesses while each equals the target's pick at its
    position, then the target's pick where the first differs (or after the last): picks[:j + 1]."""
    assert len(picks) == len(guesses) + 1, "one pick per guess, and one after the last"
    j = 0
    while j < len(guesses) and guesses[j] == picks[j]:
        j += 1
    return picks[: j + 1]


@dataclass
class SpecMetrics:
    """What speculation did: guesses verified and kept, verification chunks, and every chunk that
    sampled a token (spec or plain) against the tokens generated: target passes per output token."""

    draft_tokens: int = 0  # guesses fed for verification
    accepted_tokens: int = 0  # of those, kept
    verify_chunks: int = 0  # chunks that verified >= 1 guess
    sampling_chunks: int = 0  # every chunk that sampled (a verified one counts once)
    emitted_tokens: int = 0  # tokens those chunks gave out
    plain_chunks: int = 0  # sampling chunks with no guess (a first token, no match, a penalised request)
    per_position: list[int] = field(default_factory=list)  # kept guesses at position i of a chunk

    def chunk(self, guesses: int, kept: int, emitted: int) -> None:
        self.sampling_chunks += 1
        self.emitted_tokens += emitted
        if not guesses:
            self.plain_chunks += 1
            return
        self.verify_chunks += 1
        self.draft_tokens += guesses
        self.accepted_tokens += kept
        self.per_position += [0] * (guesses - len(self.per_position))
        for i in range(kept):
            self.per_position[i] += 1

    def to_json(self) -> dict:
        return {
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "acceptance_rate": self.accepted_tokens / self.draft_tokens if self.draft_tokens else None,
            # tokens a verification gives out: the kept guesses and the target's own pick
            "mean_accepted_length": ((self.accepted_tokens + self.verify_chunks) / self.verify_chunks
                                     if self.verify_chunks else None),
            "target_passes_per_token": (self.sampling_chunks / self.emitted_tokens if self.emitted_tokens else None),
            "verify_chunks": self.verify_chunks,
            "plain_chunks": self.plain_chunks,
            "accepted_per_position": list(self.per_position),
        }


class Speculator:
    """The engine's side of speculation: guesses before a step is scheduled, and after it the
    verified chunk's tokens, with the K/V of the rejected guesses rolled back."""

    def __init__(self, config: SpeculativeConfig, engine):
        self.config = config
        self.metrics = SpecMetrics()
        if config.method == "ngram":
            from sharpinf.engine.ngram import NgramProposer

            self.proposer = NgramProposer(config.prompt_lookup_max, config.prompt_lookup_min)
        else:
            from sharpinf.engine.draft import DraftProposer

            self.proposer = DraftProposer(config.model, engine)

    def propose(self, running) -> None:
        """Guesses for each running sequence the next step decodes and that may speculate (the
        scheduler takes what its budget and the sequence's room allow)."""
        seqs = [s for s in running if s.remaining == 1 and not s.out_of_room and s.speculates]
        if not seqs:
            return
        k = self.config.num_speculative_tokens
        for s, g in zip(seqs, self.proposer.propose(seqs, [k] * len(seqs))):
            s.guesses = list(g[:k])

    def to_json(self) -> dict:
        """The config and the metrics; a draft model's own steps too (its cost, beside the target's passes)."""
        runner = getattr(self.proposer, "runner", None)
        return {**self.config.to_json(), **self.metrics.to_json(),
                **({"draft_steps": runner.steps_run} if runner is not None else {})}

    def release(self, seq) -> None:
        """seq left the running set: a proposer's per-sequence state goes."""
        self.proposer.release(seq)

    def settle(self, seq, picks: list[int], blocks) -> list[int]:
        """A verified chunk's outcome: its guesses leave its tokens, the tokens to emit are returned
        (accept), and what the step computed for rejected guesses is rolled back: num_computed to the
        last kept position, the blocks past it freed (never cached: no rejected token is)."""
        m = seq.drafts
        guesses = seq.tokens[len(seq.tokens) - m :]
        seq.drop_drafts()
        out = accept(guesses, picks)
        kept = seq.num_computed - (m - (len(out) - 1))
        seq.metrics.rolled_back += range(kept, seq.num_computed)
        seq.num_computed = kept
        blocks.truncate(seq, seq.num_computed)
        self.metrics.chunk(m, len(out) - 1, len(out))
        return out
