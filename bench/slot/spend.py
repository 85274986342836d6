"""Spending the slot: the stages in the plan's order, each within its own budget and what is left of the
slot (GPU_SLOT_S, over every command) and of this command (GPU_SLOT_CALL_S, under the device tool's 600 s),
a run that no longer fits skipped with a line saying so; an optional stage waits until no required stage has
a run left to do. The state is saved after every run; `after_stage` (the gate's reading, the pack) after
every stage."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from bench.slot.plan import Stage
from bench.slot.runner import Ctx, leave_out
from bench.slot.state import RunRecord, SlotState

RESERVE_S = 15  # kept at the end of a command: the last pack, the transfer's start


@dataclass
class Budget:
    slot_s: float
    call_s: float
    base_s: float  # spent by the earlier commands of this slot
    clock: object

    def left(self) -> float:
        now = self.clock.now()
        return min(self.slot_s - self.base_s - now, self.call_s - now) - RESERVE_S

    def spent(self) -> float:
        return self.base_s + self.clock.now()


def spend(stages: tuple[Stage, ...], selected: set[str], ctx: Ctx, budget: Budget, state: SlotState,
          state_path: Path, logs: Path, after_stage: Callable[[Stage], None], say: Callable[[str], None]) -> None:
    clock = budget.clock
    for st in stages:
        pending = [r for r in st.runs if not state.final(r.id)]
        if st.name not in selected or not pending:
            if st.name not in selected:
                state.stage_notes[st.name] = "not selected (--stages)"
            continue
        waiting = [s.name for s in stages if not s.optional and s.name in selected
                   and any(not state.final(r.id) for r in s.runs)]
        left = budget.left()
        spent_before = sum(state.runs[r.id].seconds for r in st.runs if r.id in state.runs)
        room = min(st.budget_s - spent_before, left)
        why = (f"waits for {', '.join(waiting)} (optional stages come after the required ones)"
               if st.optional and waiting else
               f"its first run needs ~{pending[0].expected_s:.0f} s, {max(room, 0):.0f} s left"
               if room < pending[0].expected_s else "")
        if why:
            for r in pending:
                state.runs[r.id] = RunRecord("skipped", note="stage skipped", stage=st.name)
            state.stage_notes[st.name] = f"skipped: {why}"
            say(f"[{clock.now():.0f} s] {st.name}: skipped: {why}")
            state.save(state_path)
            continue
        state.stage_notes.pop(st.name, None)
        say(f"[{clock.now():.0f} s] {st.name}: {len(pending)} runs, {room:.0f} s of its {st.budget_s:.0f} s budget")
        end = clock.now() + room
        for r in pending:
            _one(r, st, ctx, budget, state, end, logs, say)
            state.spent_s = budget.spent()
            state.save(state_path)
        after_stage(st)
    state.spent_s = budget.spent()
    state.save(state_path)


def _one(r, st: Stage, ctx: Ctx, budget: Budget, state: SlotState, end: float, logs: Path, say) -> None:
    clock = budget.clock
    failed_first = [q for q in r.requires if state.final(q) and not state.passed(q)]
    if failed_first or any(not state.final(q) for q in r.requires):
        status = "refused" if failed_first else "skipped"
        why = f"needs {', '.join(r.requires)} to pass first" + (f" ({', '.join(failed_first)} did not)"
                                                                if failed_first else "")
        state.runs[r.id] = RunRecord(status, note=why, stage=st.name)
        say(f"[{clock.now():.0f} s] {r.id}: {status}: {why}")
        return
    argv, note = leave_out(r, ctx.fill(r.argv), ctx.excluded)
    if argv is None:
        state.runs[r.id] = RunRecord("refused", note=note, stage=st.name)
        say(f"[{clock.now():.0f} s] {r.id}: refused: {note}")
        return
    avail = min(end - clock.now(), budget.left())
    if avail < r.expected_s:
        why = f"needs ~{r.expected_s:.0f} s, {max(avail, 0):.0f} s left"
        state.runs[r.id] = RunRecord("skipped", note=why, stage=st.name)
        say(f"[{clock.now():.0f} s] {r.id}: skipped: {why}")
        return
    timeout = min(r.limit_s, avail)
    out = clock.execute(r, argv, timeout, logs / f"{r.id}.log")
    status = "cut" if out.cut else "done" if out.rc == 0 else "failed"
    if out.cut:
        note = (note + "; " if note else "") + f"cut at {timeout:.0f} s: its finished rows kept"
    state.runs[r.id] = RunRecord(status, round(out.seconds, 1), out.rc, note, st.name)
    say(f"[{clock.now():.0f} s] {r.id}: {status} (exit {out.rc}) in {out.seconds:.0f} s" + (f"; {note}" if note else ""))
