"""The "timed" matmul (the `tuned` set's): each launch shape on whichever of its candidates this GPU runs fastest, timed
the first time a step of that shape is planned. The candidates -- dp4a, gemv (steps of <= 8 tokens),
mmq and mmq_narrow (quantized weights, steps of >= 16 tokens) -- give the same bits (one reduction
order for every kernel and every N: dp4a.cuh), so which one a shape gets changes no result, only its
time: the choice needs no rule fitted to one GPU's figures (best's, matmul_mmq.py), and it may differ
between runs and machines without a token's logits noticing.

A shape is (linear or gate_up, weight type, rows, n_in, tokens). Its candidates run where the step's
plan is being recorded (backend.eager: a plan is recorded before it first runs, so the step buffers
they write are written again by the plan before anything reads them), each timed by the device's
clock (backend.device_seconds: its launches alone, the median of REPEATS, with L2 overwritten before
each run -- a step reads each weight once, from memory; timed warm, a matrix that fits in L2 would
favour whichever kernel L2 suits); the fastest is kept for the backend's life (best's pick where it is
within CLOSE of it). Where there is no device
clock (the emulator, the trace backend) the shape takes best's rule. tuned_choices(be) lists what was
measured and chosen (every bench suite's JSON carries it: "matmul_tuned").

It launches the candidates' own files, not one of its own: `sharpinf kernels new matmul X --like tuned`
would make a copy that never runs its file (the registry's dispatch check refuses it); copy a candidate."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from sharpinf.ops import matmul_gemv as gemv
from sharpinf.ops import matmul_mmq as mmq
from sharpinf.ops.matmul_dp4a import gate_up_dp4a, matmul_dp4a

REPEATS = 5  # timed runs a candidate (after one untimed): the median
CLOSE = 1.03  # the rule's pick stays unless another candidate beats it by more than 3%: run-to-run noise
# must not flip a shape's kernel between runs of the same bench


@dataclass
class Choice:
    """One shape's candidates' times (seconds a launch; None: not timed) and the one it runs."""

    name: str
    seconds: dict[str, float | None] = field(default_factory=dict)


_CHOICES: "weakref.WeakKeyDictionary[Any, dict[tuple, Choice]]" = weakref.WeakKeyDictionary()
_FLUSH: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def reserve(be):
    """The buffer the timing overwrites to empty L2 (twice its size; None where the backend has none),
    allocated with a forward pass's workspace -- before the KV pool takes the free memory -- and
    shared by every forward pass on the backend."""
    if be not in _FLUSH:
        n = 2 * be.l2_bytes()
        _FLUSH[be] = be.empty((n,), np.uint8) if n > 0 else None
    return _FLUSH[be]


def l2_flush_scratch(be, cfg, cap) -> dict:
    """The registry's scratch of matmul=timed: the L2 flush buffer (none where the backend has none)."""
    flush = reserve(be)
    return {} if flush is None else {"l2_flush": flush}


def tuned_choices(be) -> dict[tuple, Choice]:
    """{(kind, qtype, rows, n_in, tokens): Choice} for the shapes this backend has planned."""
    return dict(_CHOICES.get(be, {}))


# each kind's candidates: dp4a, gemv, mmq, mmq_narrow
LINEAR = (matmul_dp4a, gemv.matmul_gemv, mmq.matmul_mmq, mmq.matmul_mmq_narrow)
GATE_UP = (gate_up_dp4a, gemv.gate_up_gemv, mmq.gate_up_mmq, mmq.gate_up_mmq_narrow)


def _candidates(kind: tuple, qtype: int, n_tokens: int) -> dict[str, Callable[..., None]]:
    """The kernels of `kind` that serve a step of n_tokens with qtype weights, by name."""
    dp4a, gemv_fn, mmq_fn, narrow_fn = kind
    out: dict[str, Callable[..., None]] = {"dp4a": dp4a}
    if n_tokens <= gemv.MAX_TOKENS and gemv.supports(qtype):
        out["gemv"] = gemv_fn
    if n_tokens >= mmq.MIN_TOKENS and mmq.supports(qtype):
        out["mmq"], out["mmq_narrow"] = mmq_fn, narrow_fn
    return out


def _choose(be, key: tuple, runs: dict[str, Callable[[], None]], rule: str, keep=None) -> str:
    """The candidate `key` runs: known, timed now, or `rule` where nothing can be timed. Inside
    backend.collecting(): the rule's pick (or the one known) stands for the launch, the others' kernels
    are wanted too (compiled ahead, not counted: backend.also_wanted). `keep`: a buffer the runs add
    into (a residual): put back as it was after the timing, so the chosen run adds once."""
    if be.collecting_now:
        known = _CHOICES.get(be, {}).get(key)
        pick = known.name if known is not None else (rule if rule in runs else "dp4a")
        with be.also_wanted():
            for name, run in runs.items():
                if name != pick:
                    run()
        return pick
    known = _CHOICES.setdefault(be, {})
    if key in known:
        return known[key].name
    seconds: dict[str, float | None] = {}
    if len(runs) > 1:
        with be.eager():
            saved = None
            if keep is not None and be.can_time():
                saved = be.empty(keep.shape, keep.dtype)
                be.copy_device(keep, saved)
            for name, run in runs.items():
                seconds[name] = be.device_seconds(run, REPEATS, flush=_FLUSH.get(be))
            if saved is not None:
                be.copy_device(saved, keep)
    timed = {n: s for n, s in seconds.items() if s is not None}
    rule = rule if rule in runs else "dp4a"
    name = rule
    if len(timed) == len(runs):
        fastest = min(timed, key=timed.__getitem__)
        name = rule if timed[rule] <= CLOSE * timed[fastest] else fastest
    known[key] = Choice(name, seconds)
    return name


def matmul_tuned(be, W_dev, qtype: int, X, Y_dev, n_tokens: int, n_out: int, n_in: int, bias_dev=None,
                 accumulate: bool = False, y_stride: int | None = None, y_col: int = 0, file: str = "") -> None:
    """Y (=, or += with accumulate) X W^T (+ bias) on the fastest candidate for this shape: matmul_dp4a's
    arguments and bits. (`file`: the registry's; each candidate launches its own.)"""
    cands = _candidates(LINEAR, qtype, n_tokens)
    kw = dict(bias_dev=bias_dev, accumulate=accumulate, y_stride=y_stride, y_col=y_col)
    runs = {n: (lambda fn=fn: fn(be, W_dev, qtype, X, Y_dev, n_tokens, n_out, n_in, **kw)) for n, fn in cands.items()}
    rule = "mmq" if mmq.mmq_takes(be, qtype, n_tokens, n_out) else "dp4a"
    runs[_choose(be, ("linear", int(qtype), n_out, n_in, n_tokens), runs, rule, Y_dev if accumulate else None)]()


def gate_up_tuned(be, Wg_dev, Wu_dev, qtype: int, X, out_dev, n_tokens: int, n_ff: int, n_in: int,
                  act: str = "silu") -> None:
    """out = act(X Wg^T) * (X Wu^T) on the fastest candidate for this shape: gate_up_dp4a's arguments and bits."""
    cands = _candidates(GATE_UP, qtype, n_tokens)
    runs = {n: (lambda fn=fn: fn(be, Wg_dev, Wu_dev, qtype, X, out_dev, n_tokens, n_ff, n_in, act=act))
            for n, fn in cands.items()}
    rule = "mmq" if mmq.mmq_takes(be, qtype, n_tokens, n_ff) else "dp4a"
    runs[_choose(be, ("gate_up", int(qtype), n_ff, n_in, n_tokens), runs, rule)]()


def forget(be) -> None:
    """Drop what this backend measured: the next plan of each shape times its candidates again."""
    _CHOICES.pop(be, None)


def tuned_report(be) -> list[dict]:
    """What this backend measured, a row a shape (the bench suites' JSON carries it): the shape, the
    candidates' microseconds a launch (None: not timed) and the one chosen."""
    from sharpinf.model.quants import qtype_name

    return [{"kind": kind, "type": qtype_name(qtype), "rows": rows, "n_in": n_in, "tokens": tokens, "chose": c.name,
             "us": {n: None if s is None else round(s * 1e6, 2) for n, s in c.seconds.items()}}
            for (kind, qtype, rows, n_in, tokens), c in sorted(tuned_choices(be).items())]
