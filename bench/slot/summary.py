"""summary.md: which stages ran, which were skipped and why, the gate's verdict, and every figure beside the
previous committed run's on the same GPU model; and the plan table (stage, budget, expected seconds) the
runbook prints before and after it spends the slot."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from bench.slot.figures import beside, figures, previous_run
from bench.slot.plan import Stage
from bench.slot.state import SlotState


def _stage_row(st: Stage, state: SlotState) -> tuple[str, float, str]:
    """(status, seconds spent, runs by status) of a stage."""
    recs = [state.runs[r.id] for r in st.runs if r.id in state.runs]
    counts = Counter(r.status for r in recs)
    spent = sum(r.seconds for r in recs)
    if not recs:
        status = "to do"
    elif counts["done"] == len(st.runs):
        status = "done"
    elif counts["done"] or counts["cut"] or counts["failed"]:
        status = "partial"
    else:
        status = "skipped" if counts["skipped"] else "refused"
    return status, spent, ", ".join(f"{n} {k}" for k, n in counts.items())


def plan_table(stages: tuple[Stage, ...], state: SlotState) -> str:
    lines = [f"{'stage':<10} {'budget s':>8} {'expected s':>10} {'spent s':>8}  {'status':<8} runs",
             f"{'-' * 10} {'-' * 8} {'-' * 10} {'-' * 8}  {'-' * 8} ----"]
    for st in stages:
        status, spent, runs = _stage_row(st, state)
        lines.append(f"{st.name + ('*' if st.optional else ''):<10} {st.budget_s:>8.0f} {st.expected_s:>10.0f} "
                     f"{spent:>8.0f}  {status:<8} {runs or len(st.runs)}")
    req = [s for s in stages if not s.optional]
    lines.append(f"required stages: budget {sum(s.budget_s for s in req):.0f} s, expected "
                 f"{sum(s.expected_s for s in req):.0f} s; slot {state.slot_s:.0f} s (* only with time left)")
    return "\n".join(lines)


def summary(stages: tuple[Stage, ...], state: SlotState, run_dir: Path, gpu_slug: str, facts: str) -> str:
    out = [f"# GPU slot {state.run_name}", "",
           f"{facts}. Slot {state.slot_s:.0f} s, {state.spent_s:.0f} s spent in {state.calls} command(s).", "",
           "## Stages", "", "| stage | budget s | expected s | spent s | status | runs | why |",
           "| --- | ---: | ---: | ---: | --- | --- | --- |"]
    for st in stages:
        status, spent, runs = _stage_row(st, state)
        out.append(f"| {st.name} | {st.budget_s:.0f} | {st.expected_s:.0f} | {spent:.0f} | {status} | {runs or '-'} "
                   f"| {state.stage_notes.get(st.name, '')} |")
    out += ["", "## Runs", "", "| run | stage | status | seconds | exit | note |", "| --- | --- | --- | ---: | ---: | --- |"]
    for rid, r in state.runs.items():
        out.append(f"| {rid} | {r.stage} | {r.status} | {r.seconds:.0f} | {'-' if r.rc is None else r.rc} | "
                   f"{r.note.replace('|', '/')} |")
    out += ["", "## Gate", ""]
    ex = "; ".join(f"{op}: {', '.join(v)}" for op, v in state.excluded.items())
    out.append(f"Failed variants, left out of the timed stages: {ex or 'none'}.")
    out += [f"- {n}" for n in state.gate_notes]
    prev = previous_run(gpu_slug, state.run_name)
    now, before = figures(run_dir), figures(prev) if prev else {}
    out += ["", f"## Figures beside the previous run ({prev.name if prev else 'none on this GPU model'})", ""]
    out += beside(now, before) if now else ["No figures yet."]
    return "\n".join(out) + "\n"
