"""The scheduler's rules, checked at every step of a real engine run.

`watch(engine)` wraps engine.scheduler.schedule; after every call it asserts, against the
state just before the call:
  budget      the step's tokens fit max_num_batched_tokens (with chunked prefill off, one whole
              prompt may run over it, beside decodes only)
  seqs        at most max_num_seqs sequences run, and no sequence gets two chunks
  decodes     the sequences that were decoding come before every prefill chunk
  fcfs        the sequences admitted this step are the head of the waiting queue, in order
  disjoint    no sequence is both running and waiting; statuses agree with the lists
  oldest      the oldest running sequence is scheduled, unless decodes took the whole budget (or
              its pending token already reaches max_tokens: async scheduling ends it without a step)
  chunks      every chunk feeds >= 1 token and stops at the end of its sequence
A broken rule raises AssertionError naming the step and the rule.
"""

from __future__ import annotations

from sharpinf.engine.sequence import Status


class ScheduleViolation(AssertionError):
    pass


def watch(engine) -> "list[int]":
    """Check every schedule() of `engine` from now on; returns a list the checker appends each
    step's token count to (so a test can see it ran)."""
    sch, cfg = engine.scheduler, engine.config
    original = sch.schedule
    seen: list[int] = []

    def checked():
        waiting0 = list(sch.waiting)
        running0 = list(sch.running)
        decoding0 = {id(s) for s in running0 if s.remaining == 1}
        progress0 = {id(s): s.num_computed for s in running0 + waiting0}
        chunks = original()
        step = sch.step_index

        def fail(rule: str, what: str):
            shown = ", ".join(f"{c.seq.key}:{c.n_tokens}{'d' if id(c.seq) in decoding0 else ''}" for c in chunks)
            raise ScheduleViolation(f"step {step}: {rule}: {what} (chunks {shown}; d = was decoding)")

        kinds = [id(c.seq) in decoding0 for c in chunks]  # True: a sequence that was decoding
        first_other = next((i for i, k in enumerate(kinds) if not k), len(kinds))
        if any(kinds[first_other:]):
            fail("decodes", "a prefill chunk came before a decode")
        total = sum(c.n_tokens for c in chunks)
        seen.append(total)
        if total > cfg.max_num_batched_tokens:  # allowed: one whole prompt beside decodes, chunking off
            prefills = [c for c in chunks if id(c.seq) not in decoding0]
            if cfg.enable_chunked_prefill or len(prefills) != 1:
                fail("budget", f"{total} tokens > {cfg.max_num_batched_tokens}")
        ids = [id(c.seq) for c in chunks]
        if len(set(ids)) != len(ids):
            fail("seqs", "a sequence got two chunks")
        if len(sch.running) > cfg.max_num_seqs or len(chunks) > cfg.max_num_seqs:
            fail("seqs", f"{len(sch.running)} running, {len(chunks)} scheduled > {cfg.max_num_seqs}")
        admitted = [c.seq for c in chunks if all(c.seq is not s for s in running0)]
        if [id(s) for s in admitted] != [id(s) for s in waiting0[: len(admitted)]]:
            fail("fcfs", "admitted out of queue order")
        run_ids, wait_ids = {id(s) for s in sch.running}, {id(s) for s in sch.waiting}
        if run_ids & wait_ids:
            fail("disjoint", "a sequence is both running and waiting")
        if any(s.status is not Status.RUNNING for s in sch.running) or any(s.status is not Status.WAITING for s in sch.waiting):
            fail("disjoint", "a status disagrees with its list")
        alive = [s for s in running0 if s.status is Status.RUNNING and not s.out_of_room]
        if alive:
            oldest = min(alive, key=lambda s: s.admitted_at)
            decode_tokens = sum(c.n_tokens for c, k in zip(chunks, kinds) if k)
            if id(oldest) not in ids and not (id(oldest) not in decoding0 and decode_tokens >= cfg.max_num_batched_tokens):
                fail("oldest", f"the oldest running sequence {oldest.key} was not scheduled")
        for c in chunks:
            if c.n_tokens < 1 or c.seq.num_computed + c.n_tokens > len(c.seq.tokens):
                fail("chunks", f"{c.seq.key}: {c.n_tokens} tokens from {c.seq.num_computed} of {len(c.seq.tokens)}")
            if id(c.seq) in progress0 and c.seq.num_computed < progress0[id(c.seq)] and c.seq.metrics.preemptions == 0:
                fail("chunks", f"{c.seq.key} went back without a preemption")
        return chunks

    sch.schedule = checked
    return seen
