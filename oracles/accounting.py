"""The accounting oracle: the engine does each piece of work once and gives everything back.

`ledger(engine)` records, from now on, every (request, position) whose K/V a step computes.
`check_accounting(engine, ledger, seqs)` then asserts, once the engine is idle:
  once      a position is computed exactly once -- or never, when the prefix cache served it --
            unless its sequence was preempted (then at most once per admission);
  complete  every position a finished request fed (all but its last sampled token) has K/V;
  blocks    every block is free again and every reference count is back to 0;
  metrics   finished, rejected, generated and prompt token counts agree with the outcomes.
"""

from __future__ import annotations

from collections import Counter


def ledger(engine) -> Counter:
    counts: Counter = Counter()
    run = engine.runner.run

    def recording(chunks):
        for c in chunks:
            rid, start = c.seq.request_id, c.seq.num_computed
            for p in range(start, start + c.n_tokens):
                counts[(rid, p)] += 1
        return run(chunks)

    engine.runner.run = recording
    return counts


def check_accounting(engine, counts: Counter, seqs: dict, rejected_at_submit: int = 0) -> list[str]:
    """seqs: request id -> its Sequence (as the engine had it), for every request queued."""
    problems = []
    for rid, seq in seqs.items():
        cached = seq.metrics.cached_prompt_tokens
        pre = seq.metrics.preemptions
        fed = len(seq.tokens) - (1 if seq.output_ids else 0)  # the last sampled token is never fed
        finished_normally = seq.finish_reason in ("stop", "length", "context")
        for p in range(len(seq.tokens)):
            n = counts.get((rid, p), 0)
            if n > pre + 1:
                problems.append(f"{rid}: position {p} computed {n} times with {pre} preemptions")
            elif pre == 0 and p < cached and n:
                problems.append(f"{rid}: position {p} computed though the prefix cache served it")
            elif pre == 0 and p >= cached and p < fed and finished_normally and n != 1:
                problems.append(f"{rid}: position {p} computed {n} times")
            elif finished_normally and p < fed and n == 0 and p >= cached:
                problems.append(f"{rid}: position {p} never computed")
    b = engine.blocks
    if b.num_free != b.num_blocks or any(b.ref):
        problems.append(f"blocks: {b.num_free}/{b.num_blocks} free, {sum(1 for r in b.ref if r)} still referenced")
    m = engine.metrics
    outcomes = Counter(s.finish_reason for s in seqs.values())
    ended = sum(v for k, v in outcomes.items() if k != "rejected")
    if m.finished != ended:
        problems.append(f"metrics: finished {m.finished} != {ended} requests that ended")
    if m.rejected != outcomes.get("rejected", 0) + rejected_at_submit:
        problems.append(f"metrics: rejected {m.rejected} != {outcomes.get('rejected', 0)} + {rejected_at_submit} at submit")
    gen = sum(len(s.output_ids) for s in seqs.values())
    if m.generated_tokens != gen:
        problems.append(f"metrics: generated {m.generated_tokens} != {gen} output tokens")
    if m.prompt_tokens != sum(len(s.prompt_ids) for s in seqs.values()):
        problems.append("metrics: prompt tokens disagree")
    return problems
