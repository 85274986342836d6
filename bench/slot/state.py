"""What a slot has done so far, saved after every run (atomically: a cut command never leaves half a file),
so that the next command resumes: runs done, failed or cut stay so; runs skipped for want of time are tried
again; the seconds spent count against GPU_SLOT_S across every command. It lives in the work folder
(git-ignored), which the device machine keeps between calls while it is warm -- $OUT is emptied."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

FINAL = ("done", "failed", "cut", "refused")  # a run in one of these is not run again


@dataclass
class RunRecord:
    status: str  # done | failed | cut (its limit reached: finished rows kept) | refused (excluded variant) | skipped
    seconds: float = 0.0
    rc: int | None = None
    note: str = ""
    stage: str = ""


@dataclass
class SlotState:
    slot_s: float
    run_name: str  # the result folder's name, <gpu>-<date>
    spent_s: float = 0.0  # over every command of this slot
    calls: int = 0
    runs: dict[str, RunRecord] = field(default_factory=dict)
    stage_notes: dict[str, str] = field(default_factory=dict)  # why a stage was skipped, last said
    excluded: dict[str, list[str]] = field(default_factory=dict)  # {op: [variant]} the gate failed
    gate_notes: list[str] = field(default_factory=list)

    def final(self, run_id: str) -> bool:
        r = self.runs.get(run_id)
        return r is not None and r.status in FINAL

    def passed(self, run_id: str) -> bool:
        r = self.runs.get(run_id)
        return r is not None and r.status == "done"

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1) + "\n")
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> "SlotState":
        d = json.loads(path.read_text())
        d["runs"] = {k: RunRecord(**v) for k, v in d.get("runs", {}).items()}
        return cls(**d)
