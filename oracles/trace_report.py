"""The op-by-op trace's findings (oracles/trace.py): a record per op, and the report that says where the
kernel path first leaves the reference -- describe() in one paragraph, to_json() for `sharpinf verify`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np


@dataclass
class OpRecord:
    """One op of the traced step: its error against the reference fed its own input."""

    layer: int | None  # None: the embedding and the head
    op: str
    kernels: list[str]  # "file:entry" of each launch that wrote this op's output
    err: float  # the worst element's error in the metric's unit (inf: non-finite)
    bound: float
    metric: str  # what err measures
    max_abs_err: float  # largest |kernel - reference| over the finite elements
    where: tuple[int, int] | None  # (token, column) of the worst element (the first non-finite one)
    column: str  # what that column is ("K head 1, dim 3")
    got: float | None  # the kernel's value there
    want: float | None  # the reference's value there
    finite: bool  # every element of the kernel's output is finite
    inputs_finite: bool  # the kernel path's input to this op was finite
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.finite and self.err <= self.bound

    @property
    def name(self) -> str:
        return self.op if self.layer is None else f"layer {self.layer} {self.op}"

    def at(self) -> str:
        if self.where is None:
            return "-"
        return f"token {self.where[0]}, {self.column}"

    def to_json(self) -> dict:
        d = asdict(self)
        d["where"] = list(self.where) if self.where is not None else None
        for k in ("err", "max_abs_err"):  # JSON has no inf
            if not np.isfinite(d[k]):
                d[k] = None
        d["passed"] = self.passed
        return d


@dataclass
class TraceReport:
    model: str
    kernels: str
    kv_dtype: str
    n_tokens: int
    block_size: int
    records: list[OpRecord] = field(default_factory=list)

    @property
    def first_divergence(self) -> OpRecord | None:
        """The first op (in step order) out of its bound or with a non-finite output."""
        return next((r for r in self.records if not r.passed), None)

    @property
    def first_nonfinite(self) -> OpRecord | None:
        """The first op whose output holds a non-finite value: where it appeared."""
        return next((r for r in self.records if not r.finite), None)

    @property
    def passed(self) -> bool:
        return self.first_divergence is None

    def by_op(self) -> list[OpRecord]:
        """One record per op name (step order): its first layer out of bound, else the layer where
        its error sits closest to its bound."""
        pick: dict[str, OpRecord] = {}
        for r in self.records:
            cur = pick.get(r.op)
            if cur is None or (cur.passed and (not r.passed or _ratio(r) > _ratio(cur))):
                pick[r.op] = r
        return list(pick.values())

    def describe(self) -> str:
        """The one-paragraph answer: where the kernel path first leaves the reference."""
        intro = (f"Traced one {self.n_tokens}-token prefill step of {self.model} ({self.kernels} kernels, "
                 f"KV {self.kv_dtype}) op by op, each op fed the kernel path's own input: ")
        fd, fn = self.first_divergence, self.first_nonfinite
        if fd is None:
            worst = max(self.records, key=_ratio)
            return (intro + f"all {len(self.records)} ops within their bounds; the closest is {worst.name} "
                    f"({_kernels(worst)}), error {_num(worst.err)} {worst.metric} against a bound of "
                    f"{_num(worst.bound)}.")
        parts = []
        if fd.finite:
            parts.append(f"the first op out of its bound is {fd.name} ({_kernels(fd)}): error {_num(fd.err)} "
                         f"{fd.metric} against a bound of {_num(fd.bound)}, worst at {fd.at()} (kernel "
                         f"{_num(fd.got)}, reference {_num(fd.want)})" + (f"; {fd.detail}" if fd.detail else ""))
        if fn is not None:
            origin = ("from a finite input: this op made it" if fn.inputs_finite
                      else "but its input was already non-finite (a weight?)")
            parts.append(f"the first non-finite value appears in {fn.name} ({_kernels(fn)}) at {fn.at()}, {origin}")
        text = intro + "; ".join(parts) + "."
        later = [r for r in self.records if not r.passed and r is not fd and r is not fn]
        own = [r for r in later if r.inputs_finite]
        if own:
            ops = list(dict.fromkeys(r.op for r in own))
            layers = sorted({r.layer for r in own if r.layer is not None})
            kernels = list(dict.fromkeys(k for r in own for k in r.kernels))
            where = (f" in layers {layers[0]}-{layers[-1]}" if len(layers) > 1
                     else f" in layer {layers[0]}" if layers else "")
            text += (f" Also out of bound on their own input: {len(own)} later op(s), {_first(ops, 6)}{where} "
                     f"({_first(kernels, 3)}).")
        carried = len(later) - len(own)
        if carried:
            text += f" {carried} later op(s) were fed non-finite values."
        return text

    def to_json(self) -> dict:
        fd, fn = self.first_divergence, self.first_nonfinite
        return {"model": self.model, "kernels": self.kernels, "kv_dtype": self.kv_dtype, "n_tokens": self.n_tokens,
                "block_size": self.block_size, "passed": self.passed,
                "first_divergence": None if fd is None else fd.to_json(),
                "first_nonfinite": None if fn is None else fn.to_json(),
                "description": self.describe(), "records": [r.to_json() for r in self.records]}


def _first(names: list[str], n: int) -> str:
    return ", ".join(names[:n]) + (", ..." if len(names) > n else "")


def _kernels(r: OpRecord) -> str:
    return ", ".join(r.kernels) or "no launch"


def _ratio(r: OpRecord) -> float:
    if not r.finite or not np.isfinite(r.err):
        return np.inf
    return r.err / r.bound if r.bound > 0 else (np.inf if r.err > 0 else 0.0)


def _num(v: float | None) -> str:
    if v is None:
        return "-"
    if not np.isfinite(v) or v == 0:
        return str(v) if v else "0"
    return f"{v:.3g}" if 1e-3 <= abs(v) < 1e4 else f"{v:.2e}"
