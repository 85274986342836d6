"""Watchdog: the engine never loops forever. Every step makes progress, or soon it raises EngineStuck.

Progress, read from the engine's state: a step samples a token, or a request ended (finished,
rejected or aborted) since the last step. A correct engine never goes long without it: each
step runs the oldest running sequence, at least one token of it, unless decodes took the whole
budget (and decodes sample); no younger sequence can preempt it; so it samples once it has
(re)computed its tokens -- at most token_limit of them, one step each at worst. `limit` allows
twice that many quiet steps with requests pending; more is a bug (a thrash, a sequence that is
scheduled but never advances), said in one line naming the pending requests.

A request that is neither finished nor waiting nor running was lost by the scheduler: the
engine says so at the first step it shows (len(live) != waiting + running, an O(1) check).
"""

from __future__ import annotations

from dataclasses import dataclass

from sharpinf.engine.sequence import Sequence
from sharpinf.errors import EngineStuck


def describe(seqs: list[Sequence], most: int = 4) -> str:
    """'id (status, computed/tokens computed, n generated, p preemptions), ...' for a message."""
    parts = [f"{s.key} ({s.status.value}, {s.num_computed}/{len(s.tokens)} computed, "
             f"{len(s.output_ids)} generated, {s.metrics.preemptions} preemptions)" for s in seqs[:most]]
    more = f" and {len(seqs) - most} more" if len(seqs) > most else ""
    return ", ".join(parts) + more


@dataclass
class Watchdog:
    bound: int  # the most quiet steps a correct schedule takes: the engine's token_limit
    quiet: int = 0  # consecutive steps with requests pending and no progress
    longest: int = 0  # the longest such run so far (tests hold it under the bound)
    ended_seen: int = 0  # requests ended as of the last step

    @property
    def limit(self) -> int:
        """Quiet steps allowed with requests pending: twice the bound, a margin for the argument."""
        return 2 * self.bound

    def after_step(self, sampled: int, ended: int, live: dict[str, Sequence]) -> None:
        """Count this step (sampled: tokens it sampled; ended: the engine's count of ended
        requests; live: the unfinished ones); raise EngineStuck past the limit."""
        progress = sampled > 0 or ended != self.ended_seen
        self.ended_seen = ended
        self.quiet = 0 if progress or not live else self.quiet + 1
        self.longest = max(self.longest, self.quiet)
        if self.quiet > self.limit:
            raise EngineStuck(f"engine stuck: {self.quiet} steps without a sampled token or an ended request "
                              f"(a correct schedule needs at most {self.bound}) with {len(live)} pending: "
                              f"{describe(list(live.values()))} (a bug)")


def check_none_lost(live: dict[str, Sequence], waiting, running) -> None:
    """Every unfinished request is waiting or running, exactly once; else EngineStuck names the lost."""
    if len(live) == len(waiting) + len(running):
        return
    queued = {id(s) for s in waiting} | {id(s) for s in running}
    lost = [s for s in live.values() if id(s) not in queued]
    what = (f"{len(lost)} request(s) neither finished, waiting nor running: {describe(lost)}" if lost else
            f"{len(waiting) + len(running)} queued entries for {len(live)} unfinished requests (one queued twice)")
    raise EngineStuck(f"engine stuck: the scheduler lost track of requests: {what} (a bug)")
