"""The accounting oracle: the engine does each piece of work once and gives everything back.

`ledger(engine)` records, from now on, every (request, position) whose K/V a step computes --
read from the Batch the forward pass is actually given (its cu_seqlens and positions; padding is
added inside the forward pass, never in the Batch), not from what the scheduler's chunks claim,
so a step that feeds extra tokens, or starts a chunk before num_computed, is seen. Each fed token
id is checked against the sequence's token at that position too; a token fed on the device from
the previous step's sampled ids (async scheduling: a placeholder in the Batch) is checked one step
later, from the step's token_ids on the device, which the embedding kernel wrote the fed id into.
`check_accounting(engine, ledger, seqs)` then asserts, once the engine is idle:
  fed       every batch sequence is a scheduled chunk's, every fed id is its sequence's token there,
            and no position lies outside its sequence's tokens;
  once      a position is computed exactly once -- or never, when the prefix cache served it --
            unless its sequence was preempted (then at most once per admission);
  complete  every position a finished request fed (all but its last sampled token) has K/V;
  ahead     its last token is computed only under async scheduling, by a step submitted before a
            stop id or string ended it (once); never after max_tokens or the context (known ahead);
  total     a request computed exactly prompt + generated - 1 - cached tokens (+ that last one, + what
            its preemptions threw away: the tokens each admission had computed), and the whole run
            the sum of those (so no work is attributed to nobody, and none is done twice);
  rolled    what speculation computed for a guess and threw away (engine/speculative.py) is left out
            of once, total and counted: the engine names those positions (SeqMetrics.rolled_back);
  counted   the engine's own count of the work -- each request's `computed_tokens`, the run's
            `tokens_computed` (the metrics' tokens_computed_total) -- equals what the batches held;
  blocks    every block is free again and every reference count is back to 0;
  metrics   finished, rejected, generated and prompt token counts agree with the outcomes.
The ledger also keeps every sequence the scheduler was given (requests and forked choices) and the
engine's metrics when it started, so an engine that ran other requests before is checked on the
run's own deltas.
"""

from __future__ import annotations

from collections import Counter


METRICS = ("finished", "rejected", "generated_tokens", "prompt_tokens", "tokens_computed")


class Ledger(Counter):
    """(request id, position) -> times computed, plus what did not add up as it was recorded."""

    def __init__(self):
        super().__init__()
        self.problems: list[str] = []
        self.tokens = 0  # every token the forward pass was given
        self.fed_later: list = []  # (fp, [(seq, position, batch index)]) of the last step that fed ids on the device
        self.seqs: dict = {}  # Sequence.key -> every Sequence the scheduler was given since the ledger started
        self.start: dict[str, int] = {k: 0 for k in METRICS}  # the engine's metrics then
        self.detach = lambda: None  # puts the engine's own runner and scheduler methods back (ledger sets it)

    def check_fed(self) -> None:
        """The device-fed ids of the last recorded step, read back from its token_ids (synchronizes)."""
        if not self.fed_later:
            return
        fp, fed = self.fed_later
        self.fed_later = []
        ids = fp.backend.download(fp.descriptor.d["token_ids"])
        for seq, q, t in fed:
            if q < len(seq.tokens) and seq.tokens[q] != int(ids[t]):  # q past the end: aborted, dropped
                self.problems.append(f"{seq.key}: position {q} was fed id {int(ids[t])} on the device, "
                                     f"but its token is {seq.tokens[q]}")


class _RecordingForward:
    """Stands in for the model runner's ForwardPass: records each Batch, then runs it."""

    def __init__(self, fp, counts: Ledger):
        self._fp, self._counts, self.chunks = fp, counts, []

    def __getattr__(self, name):
        return getattr(self._fp, name)

    def forward(self, batch, *args, **kwargs):
        self._counts.check_fed()
        record(self._counts, self.chunks, batch)
        return self._fp.forward(batch, *args, **kwargs)

    def submit(self, batch, *args, feed_rows=None, **kwargs):
        self._counts.check_fed()  # the previous step's device-fed ids, before this upload replaces them
        fed = record(self._counts, self.chunks, batch, feed_rows)
        pending = self._fp.submit(batch, *args, feed_rows=feed_rows, **kwargs)
        if fed:
            self._counts.fed_later = [self._fp, fed]
        return pending


def record(counts: Ledger, chunks, batch, feed_rows=None) -> list:
    """Count batch sequence s's positions for chunks[s]'s request (the runner packs in chunk order);
    returns the tokens fed on the device, [(seq, position, batch index)], checked later."""
    cu, pos, ids = batch.cu_seqlens, batch.positions, batch.token_ids
    counts.tokens += batch.n_tokens
    fed = []
    if batch.n_seqs != len(chunks):
        counts.problems.append(f"a batch of {batch.n_seqs} sequences for {len(chunks)} scheduled chunks")
    for s, c in enumerate(chunks[: batch.n_seqs]):
        seq, p, t = c.seq, pos[cu[s] : cu[s + 1]].tolist(), ids[cu[s] : cu[s + 1]].tolist()
        for q in p:
            counts[(seq.key, q)] += 1
        if feed_rows is not None:  # a device-fed token: its placeholder id says nothing; checked later
            for i in range(cu[s], cu[s + 1]):
                if feed_rows[i] >= 0:
                    fed.append((seq, int(pos[i]), i))
                    t[i - cu[s]] = seq.tokens[pos[i]] if 0 <= pos[i] < len(seq.tokens) else None
        if t != [seq.tokens[q] if 0 <= q < len(seq.tokens) else None for q in p]:
            counts.problems.append(f"{seq.key}: fed ids {t} at positions {p} are not its tokens there "
                                   f"({len(seq.tokens)} tokens)")
    return fed


def ledger(engine) -> Ledger:
    """Record every step of `engine` from now on: its model runner's ForwardPass is wrapped (the
    engine's own `fp`, which the oracles copy for lone runs, is left as it is)."""
    counts = Ledger()
    counts.start = {k: getattr(engine.metrics, k) for k in METRICS}
    runner, sch = engine.runner, engine.scheduler
    rec = _RecordingForward(runner.fp, counts)
    submit, add, add_forked = runner.submit, sch.add, sch.add_forked

    def recording(chunks):
        rec.chunks = list(chunks)  # batch sequence s is chunk s
        return submit(chunks)

    def adding(seq):
        counts.seqs[seq.key] = seq
        return add(seq)

    def adding_forked(child, running=True):
        counts.seqs[child.key] = child
        return add_forked(child, running)

    own = (runner.fp, runner.__dict__.get("submit"), sch.__dict__.get("add"), sch.__dict__.get("add_forked"))

    def detach():
        runner.fp = own[0]
        for obj, name, was in ((runner, "submit", own[1]), (sch, "add", own[2]), (sch, "add_forked", own[3])):
            if was is None:
                obj.__dict__.pop(name, None)  # the class's method again
            else:
                setattr(obj, name, was)

    runner.fp, runner.submit, sch.add, sch.add_forked = rec, recording, adding, adding_forked
    counts.detach = detach
    return counts


def accounted(engine, run):
    """(run()'s result, the accounting oracle's problems over what it did): the engine's steps are
    recorded only while run() runs, and checked once it returns (the engine idle)."""
    counts = ledger(engine)
    try:
        out = run()
    finally:
        counts.detach()
    return out, check_accounting(engine, counts)


def _ahead(rid: str, seq, counts: Counter) -> int:
    """Times the last sampled token was computed: by a step submitted before the stop rule saw it."""
    return counts.get((rid, len(seq.tokens) - 1), 0) if seq.output_ids else 0


def _per_request(rid: str, seq, counts: Counter, total: int, problems: list[str], async_scheduling: bool = False) -> None:
    cached = seq.metrics.cached_prompt_tokens
    pre = seq.metrics.preemptions
    fed = len(seq.tokens) - (1 if seq.output_ids else 0)  # the last sampled token is never fed...
    ahead = _ahead(rid, seq, counts)  # ...unless a step in flight fed it
    if ahead and not (async_scheduling and seq.finish_reason in ("stop", "aborted") and ahead <= pre + 1):
        problems.append(f"{rid}: its last token (finish {seq.finish_reason}) computed {ahead} times"
                        + ("" if async_scheduling else " without async scheduling"))
    finished_normally = seq.finish_reason in ("stop", "length", "context")
    computed = seq.metrics.computed_tokens - len(getattr(seq.metrics, "rolled_back", ()))
    if computed != total:
        problems.append(f"{rid}: the engine counted {computed} tokens computed (less those rolled back), its "
                        f"batches held {total}")
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
    thrown = seq.metrics.discarded_tokens  # what its preemptions threw away (0 when never preempted)
    if pre == 0 and thrown:
        problems.append(f"{rid}: never preempted, yet {thrown} tokens counted as thrown away")
    # the last admission's work, unless it ended while waiting (preempted with its last token in flight)
    last = fed - cached + ahead if seq.metrics.admissions > pre else 0
    if finished_normally and total != last + thrown:
        problems.append(f"{rid}: {total} tokens computed for {len(seq.prompt_ids)} prompt + {len(seq.output_ids)} "
                        f"generated - 1 - {cached} cached + {ahead} ahead + {thrown} thrown away by {pre} "
                        f"preemptions = {last + thrown}")


def _without_rolled_back(counts: Counter, seqs: dict, problems: list[str]) -> tuple[Counter, int]:
    """The counts less the positions speculation computed and threw away (`SeqMetrics.rolled_back`:
    a rejected guess, or a kept one after a stop), which the engine computes again or never needs;
    a position claimed rolled back more often than computed is a problem. Returns (counts, how many)."""
    out, n = Counter(counts), 0
    for rid, seq in seqs.items():
        for q in getattr(seq.metrics, "rolled_back", ()):
            out[(rid, q)] -= 1
            n += 1
            if out[(rid, q)] < 0:
                problems.append(f"{rid}: position {q} rolled back more often than computed")
    for k in [k for k, v in out.items() if v == 0 and counts.get(k, 0)]:
        del out[k]  # computed only for a rolled-back guess
    return out, n


def check_accounting(engine, counts: Counter, seqs: dict | None = None, rejected_at_submit: int = 0) -> list[str]:
    """seqs: Sequence.key -> its Sequence (as the engine had it), for every request queued and
    every choice forked (a forked choice's shared prompt counts as served, like the prefix cache's);
    None: the ones the ledger saw the scheduler given."""
    if seqs is None:
        seqs = counts.seqs
    if hasattr(counts, "check_fed"):
        counts.check_fed()
    problems = list(getattr(counts, "problems", []))
    counts, rolled = _without_rolled_back(counts, seqs, problems)
    asy = engine.config.async_scheduling
    totals: Counter = Counter()
    for (rid, _), n in counts.items():
        totals[rid] += n
    for rid, seq in seqs.items():
        _per_request(rid, seq, counts, totals[rid], problems, asy)
    strays = sorted(k for k in counts if k[0] not in seqs or not 0 <= k[1] < len(seqs[k[0]].tokens))
    if strays:
        problems.append(f"positions computed outside every request's tokens: {strays[:5]}")
    if all(s.finish_reason in ("stop", "length", "context") for s in seqs.values()):
        want = sum(s.metrics.discarded_tokens + (len(s.tokens) - (1 if s.output_ids else 0) - s.metrics.cached_prompt_tokens
                                                  + _ahead(rid, s, counts) if s.metrics.admissions > s.metrics.preemptions
                                                  else 0) for rid, s in seqs.items())
        if sum(counts.values()) != want or getattr(counts, "tokens", want + rolled) - rolled != want:
            problems.append(f"run: {sum(counts.values())} positions recorded, {getattr(counts, 'tokens', '?')} tokens "
                            f"given to the forward pass, for {want} prompt + generated - 1 - cached + thrown away "
                            "over requests")
    b = engine.blocks
    if b.num_free != b.num_blocks or any(b.ref):
        problems.append(f"blocks: {b.num_free}/{b.num_blocks} free, {sum(1 for r in b.ref if r)} still referenced")
    start = getattr(counts, "start", {k: 0 for k in METRICS})
    m = {k: getattr(engine.metrics, k) - start[k] for k in METRICS}  # this run's share
    if m["tokens_computed"] - rolled != sum(counts.values()):
        problems.append(f"metrics: tokens_computed {m['tokens_computed']} != {sum(counts.values())} positions the "
                        "batches held")
    outcomes = Counter(s.finish_reason for s in seqs.values())
    ended = sum(v for k, v in outcomes.items() if k != "rejected")
    if m["finished"] != ended:
        problems.append(f"metrics: finished {m['finished']} != {ended} requests that ended")
    if m["rejected"] != outcomes.get("rejected", 0) + rejected_at_submit:
        problems.append(f"metrics: rejected {m['rejected']} != {outcomes.get('rejected', 0)} + {rejected_at_submit} at submit")
    gen = sum(len(s.output_ids) for s in seqs.values())
    if m["generated_tokens"] != gen:
        problems.append(f"metrics: generated {m['generated_tokens']} != {gen} output tokens")
    if m["prompt_tokens"] != sum(len(s.prompt_ids) for s in seqs.values() if s.index == 0):  # once per request
        problems.append("metrics: prompt tokens disagree")
    return problems
