"""matmul=timed (ops/matmul_tuned.py) on the emulator, with a stand-in for the device's clock: each
candidate it times runs as the real clock runs it (once untimed, then REPEATS times), and takes the
seconds the test gives it. Whichever wins, the output is dp4a's bits; a residual is added once; a
plan being recorded times its shapes once and then runs only the chosen kernel; without a clock a
shape takes best's rule. (The GPU's own clock: bench/gpu_slot.sh's runs of matmul=timed.)"""

from __future__ import annotations

import numpy as np
import pytest

from sharpinf.model import quants
from sharpinf.ops import matmul_tuned as tuned
from sharpinf.ops.matmul_dp4a import gate_up_dp4a, matmul_dp4a
from asserts import assert_bits
from test_kernels_matmul_dp4a import _act, _raw, _rng

N_OUT, N_IN = 40, 512


@pytest.fixture
def clock(emu, monkeypatch):
    """clock(seconds): from now on the emulator times each shape's candidates (in the order the tuner
    lists them: dp4a, gemv, mmq, mmq_narrow -- those that serve the shape) as `seconds` says."""
    tuned.forget(emu)
    state = {"seconds": [], "timed": 0}

    def device_seconds(fn, repeats=5, flush=None):
        for _ in range(1 + repeats):
            fn()
        state["timed"] += 1
        return state["seconds"][(state["timed"] - 1) % len(state["seconds"])]

    def set_clock(seconds):
        state["seconds"], state["timed"] = list(seconds), 0
        monkeypatch.setattr(emu, "can_time", lambda: emu._recording is None, raising=False)
        monkeypatch.setattr(emu, "device_seconds", device_seconds, raising=False)
        return state

    yield set_clock
    tuned.forget(emu)


def _case(be, n_tokens, qtype=quants.Q4_K):
    rng = _rng("tuned", n_tokens, qtype)
    raw, raw2 = _raw(rng, qtype, N_OUT, N_IN), _raw(rng, qtype, N_OUT, N_IN)
    X, *_ = _act(be, rng, n_tokens, N_IN)
    return be.upload(raw), be.upload(raw2), X, rng


# (tokens, the candidates' seconds in the tuner's order, the one that must win)
WINNERS = [(1, [2e-6, 1e-6], "gemv"), (1, [1e-6, 2e-6], "dp4a"),
           (19, [3e-6, 1e-6, 2e-6], "mmq"), (19, [3e-6, 2e-6, 1e-6], "mmq_narrow"),
           (19, [1.02e-6, 1e-6, 2e-6], "dp4a")]  # within 3% of the fastest, best's rule (dp4a at 19) stays


@pytest.mark.parametrize("n_tokens, seconds, winner", WINNERS)
def test_the_fastest_candidate_runs_and_gives_dp4as_bits(emu, clock, n_tokens, seconds, winner):
    W, W2, X, rng = _case(emu, n_tokens)
    bias = emu.upload(rng.standard_normal(N_OUT).astype(np.float32))
    state = clock(seconds)
    want = emu.empty((n_tokens, N_OUT), np.float32)
    matmul_dp4a(emu, W, quants.Q4_K, X, want, n_tokens, N_OUT, N_IN, bias)
    got = emu.empty((n_tokens, N_OUT), np.float32)
    tuned.matmul_tuned(emu, W, quants.Q4_K, X, got, n_tokens, N_OUT, N_IN, bias)
    assert state["timed"] == len(seconds)
    choice = tuned.tuned_choices(emu)[("linear", quants.Q4_K, N_OUT, N_IN, n_tokens)]
    assert choice.name == winner and list(choice.seconds.values()) == seconds
    assert_bits(emu.download(got), emu.download(want), err_msg=winner)
    # gate+up: the same candidates, the same winner, gate_up_dp4a's bits
    gu_want, gu_got = (emu.empty((n_tokens, N_OUT), np.float32) for _ in range(2))
    gate_up_dp4a(emu, W, W2, quants.Q4_K, X, gu_want, n_tokens, N_OUT, N_IN)
    tuned.gate_up_tuned(emu, W, W2, quants.Q4_K, X, gu_got, n_tokens, N_OUT, N_IN)
    assert tuned.tuned_choices(emu)[("gate_up", quants.Q4_K, N_OUT, N_IN, n_tokens)].name == winner
    assert_bits(emu.download(gu_got), emu.download(gu_want), err_msg=f"gate_up {winner}")


def test_a_residual_is_added_once_however_often_the_candidates_ran(emu, clock):
    """Timing runs every candidate four times into Y; with accumulate the residual is put back first."""
    W, _, X, rng = _case(emu, 19)
    x0 = rng.standard_normal((19, N_OUT)).astype(np.float32)
    want, got = emu.upload(x0), emu.upload(x0)
    matmul_dp4a(emu, W, quants.Q4_K, X, want, 19, N_OUT, N_IN, accumulate=True)
    clock([3e-6, 1e-6, 2e-6])
    tuned.matmul_tuned(emu, W, quants.Q4_K, X, got, 19, N_OUT, N_IN, accumulate=True)
    assert_bits(emu.download(got), emu.download(want))


def test_a_plan_times_its_shapes_once_and_then_runs_the_chosen_kernel(emu, clock):
    W, _, X, _ = _case(emu, 19)
    Y = emu.empty((19, N_OUT), np.float32)
    state = clock([3e-6, 2e-6, 1e-6])
    with emu.recording() as plan:
        tuned.matmul_tuned(emu, W, quants.Q4_K, X, Y, 19, N_OUT, N_IN)
    assert state["timed"] == 3  # the candidates ran now, outside the plan
    assert {l.kernel.name.split("_q4_k")[0] for l in plan} == {"matmul_mmq_narrow"}
    with emu.recording() as again:
        tuned.matmul_tuned(emu, W, quants.Q4_K, X, Y, 19, N_OUT, N_IN)
    assert state["timed"] == 3 and [l.kernel.name for l in again] == [l.kernel.name for l in plan]
    assert tuned.tuned_report(emu) == [{"kind": "linear", "type": "Q4_K", "rows": N_OUT, "n_in": N_IN, "tokens": 19,
                                        "chose": "mmq_narrow", "us": {"dp4a": 3.0, "mmq": 2.0, "mmq_narrow": 1.0}}]
    with emu.collecting() as wanted:  # compile-ahead: the pick is the launch, the others wanted too
        tuned.matmul_tuned(emu, W, quants.Q4_K, X, Y, 19, N_OUT, N_IN)
    assert {name.split("_q4_k")[0] for _, name in wanted} == {"matmul_mmq_narrow"}
    assert {name.split("_q4_k")[0] for _, name in wanted.also} == {"matmul_dp4a", "matmul_mmq"}


def test_without_a_clock_a_shape_takes_bests_rule(emu):
    tuned.forget(emu)
    W, _, X, _ = _case(emu, 64)
    Y = emu.empty((64, N_OUT), np.float32)
    tuned.matmul_tuned(emu, W, quants.Q4_K, X, Y, 64, N_OUT, N_IN)
    tuned.matmul_tuned(emu, W, quants.Q4_K, X, Y[:8], 8, N_OUT, N_IN)
    choices = tuned.tuned_choices(emu)
    assert choices[("linear", quants.Q4_K, N_OUT, N_IN, 64)].name == "mmq"  # best: mmq from 64 tokens
    assert choices[("linear", quants.Q4_K, N_OUT, N_IN, 8)].name == "dp4a"
    assert all(s is None for c in choices.values() for s in c.seconds.values())
    tuned.forget(emu)


def test_a_forward_pass_on_timed_gives_dp4as_logits_whatever_each_shape_chose(emu, clock):
    """Each shape's candidates timed while the step's plan is recorded, over the step's own buffers (the
    residual's adds included), with a clock whose winners vary from shape to shape: prefill in chunks
    of 1..51 tokens gives dp4a's logits bit for bit."""
    from sharpinf.model.loader import load_model
    from sharpinf.model.synth import synthetic_model
    from oracles import paths
    from sharpinf.step.forward import ForwardPass

    model = load_model(synthetic_model("qwen3", "Q4_K", n_embd=256))
    base = dict(attention="split", rope_kv="fused")
    dp4a = ForwardPass(model, emu, kernels={"matmul": "dp4a", **base})
    fp = dp4a.with_own_buffers(kernels={"matmul": "timed", **base})
    assert fp.workspace_bytes() > 0 and not hasattr(fp.ws, "l2_flush")  # no L2 here to empty
    clock([3e-6, 1e-6, 2e-6, 0.5e-6, 4e-6])
    toks = list(range(7, 107))
    chunks = [1, 15, 16, 17, 51]
    nb = paths.blocks_for([len(toks)], 16)
    got, want = (paths.fresh_runner(f, "f16", nb, 16, 0).prefill_chunks(toks, chunks) for f in (fp, dp4a))
    assert_bits(np.asarray(got), np.asarray(want))
    winners = {c.name for c in tuned.tuned_choices(emu).values()}
    assert len(winners) >= 3, winners  # the clock made several candidates win somewhere
    # a layer launches what the fast set's does; compile-ahead wants every candidate's kernels
    assert fp.launches_per_layer() == dp4a.launches_per_layer()
    assert {f for f, _ in fp.kernels_used("f16")} >= {"matmul_gemv.cu", "gate_up_gemv.cu", "matmul_mmq_narrow.cu"}


@pytest.mark.gpu
def test_on_a_gpu_each_shape_is_timed_by_the_device_and_the_logits_are_dp4as():
    """The device's own clock (CUDA events): every shape a prefill in chunks plans gets a time for each
    candidate, and the logits are dp4a's bit for bit whatever won."""
    from sharpinf.model.loader import load_model
    from sharpinf.model.synth import synthetic_model
    from oracles import paths
    from sharpinf.runtime.cuda_backend import CudaBackend
    from sharpinf.step.forward import ForwardPass

    be = CudaBackend()
    model = load_model(synthetic_model("qwen3", "Q4_K", n_embd=256))
    base = dict(attention="split", rope_kv="fused")
    dp4a = ForwardPass(model, be, kernels={"matmul": "dp4a", **base})
    fp = dp4a.with_own_buffers(kernels={"matmul": "timed", **base})
    toks = list(range(7, 107))
    nb = paths.blocks_for([len(toks)], 16)
    got, want = (paths.fresh_runner(f, "f16", nb, 16, 0).prefill_chunks(toks, [1, 15, 16, 17, 51]) for f in (fp, dp4a))
    assert_bits(np.asarray(got), np.asarray(want))
    choices = tuned.tuned_choices(be)
    assert choices and all(isinstance(s, float) and s > 0 for c in choices.values() for s in c.seconds.values()
                           if len(c.seconds) > 1)
