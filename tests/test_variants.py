"""The kernel-variant registry (sharpinf/ops/variants.py) and its wiring into the forward pass:
choices parse or fail with one clear line, "fast" falls back per op where a model's shapes do
not fit, each choice runs the kernels it names (launches per layer), mixed choices pass the
kernel-vs-reference oracle, and the ptxas report of the fast kernels shows no spills."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np
import pytest

from oracles import paths
from sharpinf.errors import SharpinfError
from sharpinf.step.forward import ForwardPass
from sharpinf.model.loader import load_model
from sharpinf.model.synth import synthetic_model
from sharpinf.ops.variant_table import declares, describe_variants
from sharpinf.ops.variants import FAST, KernelChoice, choices_for, resolve_kernels, variant_names
from asserts import assert_bits


def test_parse_every_spelling():
    assert KernelChoice.parse("simple") == KernelChoice() and KernelChoice().name == "simple"
    assert KernelChoice.parse(" FAST ") == KernelChoice(**FAST)
    assert KernelChoice.parse("fast").name == "fast" and KernelChoice.parse("fast").q8_activations
    mixed = KernelChoice.parse("matmul=dp4a, attention=warp")
    assert (mixed.matmul, mixed.attention, mixed.rope_kv, mixed.ffn) == ("dp4a", "warp", "separate", "separate")
    assert mixed.name == "matmul=dp4a" and KernelChoice.parse(mixed.name) == mixed  # the name parses back
    assert KernelChoice.parse({"attention": "split"}) == KernelChoice(attention="split")
    assert KernelChoice.parse(mixed) is mixed
    # in no set: on their own, with what each requires (the matmul that reads q8_1, the fused rope)
    assert choices_for("all") == ["simple", "fast", "tensor", "tuned", "matmul=dp4a", "matmul=mma",
                                  "matmul=mmq_narrow", "matmul=gemv", "matmul=dp4a,ffn=fused",
                                  "matmul=dp4a,link=layer,rope_kv=fused", "moe=gemv"]
    dense, moe = SimpleNamespace(head_dim=64, is_moe=False), SimpleNamespace(head_dim=64, is_moe=True)
    assert choices_for("all", dense) == choices_for("all")[:-1]  # a dense model runs no moe kernel
    assert "matmul=dp4a,ffn=fused" not in choices_for("all", moe)  # ... an MoE model no dense FFN
    assert KernelChoice.parse("tensor") == KernelChoice(matmul="mmq", attention="flash", rope_kv="fused", moe="mmq",
                                                        sample="radix")
    assert KernelChoice.parse("matmul=mmq,attention=flash,rope_kv=fused,moe=mmq,sample=radix").name == "tensor"
    assert choices_for("auto") == ["auto"]
    rows = describe_variants()
    names = variant_names()
    assert len(rows) == sum(len(v) for v in names.values()) and sum(r["baseline"] for r in rows) == len(names)


@pytest.mark.parametrize("spec,needle", [
    ("matmul=fastest", "unknown matmul variant 'fastest'"),
    ("attention=simple", "unknown attention variant 'simple': choose warp, split, flash"),  # the old names
    ("matmul=tuned", "unknown matmul variant 'tuned'"), ("moe=fast", "unknown moe variant 'fast'"),
    ("matmul=ffn", "unknown matmul variant 'ffn'"),  # the FFN's strategy is its own op now: ffn=fused
    ("link=layer", "link=layer requires matmul.activations=q8_1 (the choice has matmul=float)"),
    ("matmul=dp4a,link=layer", "link=layer requires rope_kv=fused (the choice has rope_kv=separate)"),
    ("softmax=split", "unknown op(s) softmax"),
    ("matmul", "is not op=variant"),
    ({"rope": "fused"}, "unknown op(s) rope"),
    (3, "kernels must be"),
    ("auto", "depends on the backend"),  # parse alone cannot resolve it; resolve_kernels can
])
def test_bad_choices_are_one_clear_line(spec, needle):
    with pytest.raises(SharpinfError, match=None) as e:
        KernelChoice.parse(spec)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_fast_falls_back_per_op_where_the_model_does_not_fit(capsys, monkeypatch):
    monkeypatch.setenv("SHARPINF_PROGRESS", "1")  # notes show (off by default when stderr is no terminal)
    odd = SimpleNamespace(head_dim=48)  # split attention is compiled for 16, 32, 64, 128, 256
    got = resolve_kernels("fast", odd)
    assert (got.matmul, got.attention, got.rope_kv) == ("best", "warp", "fused")
    assert "head_dim" in capsys.readouterr().err
    with pytest.raises(SharpinfError, match="head_dim"):
        resolve_kernels("attention=split", odd)
    assert resolve_kernels("fast", SimpleNamespace(head_dim=64)) == KernelChoice(**FAST)


def test_auto_is_fast_on_a_gpu_and_simple_on_the_emulator(emu):
    from sharpinf.runtime.trace_backend import TraceBackend

    cfg = SimpleNamespace(head_dim=64)
    assert resolve_kernels("auto", cfg, TraceBackend()).name == "fast"  # shapes launches as a GPU does
    assert resolve_kernels(None, cfg, emu).name == resolve_kernels("AUTO", cfg, emu).name == "simple"
    assert resolve_kernels("auto", SimpleNamespace(head_dim=48), TraceBackend()).attention == "warp"
    assert ForwardPass(_model("llama"), emu, compile_ahead=False).choice.name == "simple"


@functools.cache
def _model(arch: str, qtype: str = "Q8_0"):
    return load_model(synthetic_model(arch, qtype, n_embd=128))


@pytest.mark.parametrize("arch,kernels,per_layer", [
    ("llama", "simple", 14), ("qwen3", "simple", 16), ("llama", "fast", 9), ("qwen3", "fast", 9),
    ("llama", "matmul=dp4a", 12),  # q8_1 norms, dp4a matmuls; attention output and SwiGLU quantized apart
    ("llama", "attention=split,rope_kv=fused", 12), ("qwen3", "tensor", 9),
    # MoE: norm, route, gate+up, down, combine (simple); q8_1 norm, route, sort, gate+up, quantize, down, combine
    ("qwen3moe", "simple", 15), ("qwen3moe", "fast", 12),
])
def test_launches_per_layer(emu, arch, kernels, per_layer):
    fp = ForwardPass(_model(arch), emu, kernels=kernels, compile_ahead=False)
    assert fp.launches_per_layer() == per_layer


def test_workspace_holds_what_the_choice_needs(emu):
    simple = ForwardPass(_model("llama"), emu, kernels="simple", compile_ahead=False)
    fast = simple.with_own_buffers(kernels="fast")
    assert fast.layers is simple.layers and fast.choice.name == "fast" and simple.choice.name == "simple"
    assert hasattr(simple.ws, "h") and not hasattr(simple.ws, "xq") and not hasattr(simple.ws, "split")
    assert hasattr(fast.ws, "xq") and hasattr(fast.ws, "split") and not hasattr(fast.ws, "h")
    assert fast.workspace_bytes() > 0 and simple.workspace_bytes() > 0
    # an MoE model: the routing scratch, grouped (sort order, tiles, q8_1 pairs) only for the fast moe
    moe = ForwardPass(_model("qwen3moe"), emu, kernels="matmul=dp4a,moe=warp", compile_ahead=False)
    assert moe.ws.moe.tiles is None and hasattr(moe.ws, "h") and not hasattr(moe.ws, "gate")
    assert moe.with_own_buffers(kernels="moe=grouped").ws.moe.tiles is not None


@pytest.mark.parametrize("kernels,arch,qtype", [
    *((k, a, q) for k in ("matmul=dp4a", "attention=split,rope_kv=fused", "matmul=dp4a,attention=split")
      for a, q in (("qwen3", "Q4_0"), ("qwen2", "Q5_1"))),
    # the MoE FFN's norm writes what the moe variant reads, whatever the matmuls read
    ("matmul=dp4a,moe=warp", "qwen3moe", "Q4_0"), ("moe=grouped", "qwen3moe", "Q5_1"),
])
def test_mixed_choices_pass_the_oracles(emu, kernels, arch, qtype):
    fp = ForwardPass(_model(arch, qtype), emu, kernels=kernels)
    toks = list(range(5, 35))
    for kv in ("f16", "q8_0"):
        r = paths.oracle_kernel_vs_reference(fp, toks, kv, 4)
        assert r.passed and kernels.split(",")[0] in r.case, r
    r = paths.oracle_chunked_vs_whole(fp, toks, "f16", 4, chunks=[1, 12, 17])
    assert r.passed and r.max_abs_dlogit == 0.0, r


# The step sizes each variant's own kernels serve, cut so every compiled tile size runs: mma and mmq
# from 16 tokens (both tile edges), gemv up to 8 (its 1-, 2-, 4- and 8-token kernels), best at its
# threshold (64: mmq; below: dp4a).
CHUNKS = {"mma": [1, 15, 16, 17, 51], "mmq": [1, 15, 16, 17, 51], "mmq_narrow": [1, 15, 16, 17, 51],
          "gemv": [1, 2, 3, 5, 8, 81], "best": [1, 63, 36]}
OWN_FILE = {"best": "mmq"}  # best runs mmq's kernels (and dp4a's)
ARCHS = [("llama", "Q4_K"), ("qwen2", "Q5_1"), ("qwen3", "Q6_K")]


# best runs dp4a's and mmq's kernels, mmq_narrow mmq's code in other blocks: one model each (every type:
# test_kernels_matmul_mma.py)
@pytest.mark.parametrize("arch,qtype,name", [(a, q, n) for n in ("mma", "mmq", "gemv") for a, q in ARCHS]
                         + [("llama", "Q4_K", "best"), ("qwen3", "Q6_K", "mmq_narrow")])
def test_matmul_variants_steps_equal_dp4a_steps_bit_for_bit(emu, arch, qtype, name):
    """matmul=mma / mmq / mmq_narrow (int8 tensor cores for steps of >= 16 tokens), gemv (steps of <= 8) and best
    (mmq or dp4a by the step's size) give dp4a's logits bit for bit, so prefill and decode agree
    whichever kernel runs a step; the oracles hold as they do for dp4a."""
    n_embd = 256 if qtype in ("Q4_K", "Q6_K") else 128
    model = load_model(synthetic_model(arch, qtype, n_embd=n_embd))
    base = dict(attention="split", rope_kv="fused")
    dp4a = ForwardPass(model, emu, kernels={"matmul": "dp4a", **base})
    other = dp4a.with_own_buffers(kernels={"matmul": name, **base})
    assert other.launches_per_layer() == dp4a.launches_per_layer()
    own = OWN_FILE.get(name, name)
    used = {e for f, e in other.kernels_used("f16") if f == f"matmul_{own}.cu"}
    assert any(e.startswith(f"matmul_{own}_{qtype.lower()}") for e in used), used
    toks = list(range(7, 107))  # 100 tokens: one step (mmq: a 64-token tile and a partial one; gemv: dp4a's)
    nb = paths.blocks_for([len(toks)], 16)
    got, want = (paths.fresh_runner(fp, "f16", nb, 16, 0).prefill_chunks(toks, [100]) for fp in (other, dp4a))
    assert_bits(np.asarray(got), np.asarray(want))
    r = paths.oracle_chunked_vs_whole(other, toks, "f16", 4, chunks=CHUNKS[name])
    assert r.passed and r.max_abs_dlogit == 0.0, r


def test_moe_gemv_steps_equal_the_fast_sets_bit_for_bit(emu):
    """moe=gemv (the experts of steps of <= 8 tokens on gemv's row stream, larger ones on fast's dp4a
    tiles) in the fast set: a qwen3moe model's logits are fast's bit for bit, step by step, for a prompt
    cut into steps of 1, 2, 3, 5, 8 and 21 tokens (gemv's 1-, 2-, 4- and 8-pair tiles; the last step
    fast's kernels on both sides) -- so the workspace's tiles hold gemv's sort -- and the chunked-vs-whole
    oracle holds exactly on gemv. n_embd 512: the experts' gate+up run the compiled-G entries (_g16)."""
    model = load_model(synthetic_model("qwen3moe", "Q4_K", n_embd=512))
    fast = ForwardPass(model, emu, kernels=dict(FAST))
    gemv = fast.with_own_buffers(kernels={**FAST, "moe": "gemv"})
    assert {e for f, e in gemv.kernels_used("f16") if f == "moe_gemv.cu"} >= {
        f"moe_gate_up_gemv_q4_k_t{n}_g16" for n in (1, 2, 4, 8)}
    toks, chunks = list(range(7, 47)), [1, 2, 3, 5, 8, 21]
    nb = paths.blocks_for([len(toks)], 16)
    got, want = (paths.fresh_runner(fp, "f16", nb, 16, 0).prefill_chunks(toks, chunks) for fp in (gemv, fast))
    assert_bits(np.asarray(got), np.asarray(want))
    r = paths.oracle_chunked_vs_whole(gemv, toks, "f16", 4, chunks=chunks)
    assert r.passed and r.max_abs_dlogit == 0.0, r


@pytest.mark.parametrize("arch,qtype", [("llama", "Q4_K"), ("qwen2", "Q5_1")])
def test_the_fused_ffn_fuses_the_decode_ffn_and_keeps_dp4a_bits(emu, arch, qtype):
    """ffn=fused (with matmul=dp4a): a decode step's FFN (<= 8 tokens) is one cooperative launch (two
    fewer a layer), larger steps take dp4a's three; every step gives dp4a's logits bit for bit."""
    n_embd = 256 if qtype in ("Q4_K", "Q6_K") else 128
    model = load_model(synthetic_model(arch, qtype, n_embd=n_embd))
    base = dict(attention="split", rope_kv="fused")
    dp4a = ForwardPass(model, emu, kernels={"matmul": "dp4a", **base})
    other = dp4a.with_own_buffers(kernels={"matmul": "dp4a", "ffn": "fused", **base})
    assert other.launches_per_layer() == dp4a.launches_per_layer() - 2
    assert any(f == "ffn_dp4a.cu" and e == f"ffn_dp4a_{qtype.lower()}" for f, e in other.kernels_used("f16"))
    toks = list(range(7, 47))
    nb = paths.blocks_for([len(toks)], 16)
    got, want = (paths.fresh_runner(fp, "f16", nb, 16, 0).prefill_chunks(toks, [40]) for fp in (other, dp4a))
    assert_bits(np.asarray(got), np.asarray(want))
    r = paths.oracle_chunked_vs_whole(other, toks, "f16", 4, chunks=[1, 2, 3, 5, 8, 21])
    assert r.passed and r.max_abs_dlogit == 0.0, r


def test_engine_and_llm_take_kernels():
    from sharpinf.llm import LLM

    llm = LLM(synthetic_model("llama", "Q8_0", n_embd=128), backend="emu", kernels="simple", num_blocks=16)
    assert llm.engine.fp.choice.name == "simple"
    with pytest.raises(SharpinfError, match="unknown attention variant"):
        LLM(synthetic_model("llama", "Q8_0", n_embd=128), backend="emu", kernels="attention=paged")


def test_ptxas_log_parsing():
    from sharpinf.runtime.ptxas_report import parse_ptxas_log

    log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k_a' for 'sm_90'
ptxas info    : Function properties for k_a
ptxas         .     16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 4096 bytes smem
ptxas info    : Compiling entry function 'k_b' for 'sm_90'
ptxas info    : Function properties for k_b
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers"""
    a, b = parse_ptxas_log(log, "x.cu")
    assert (a.entry, a.registers, a.spill_stores, a.spill_loads, a.stack_bytes, a.smem_bytes) == ("k_a", 255, 8, 12, 16, 4096)
    assert a.spills and not b.spills and b.registers == 32 and b.smem_bytes == 0


def _throwaway(name: str, files: tuple[str, ...], honest: bool = True):
    """A variant registered for one test: the baseline attention launcher, run on the variant's file
    (honest) or ignoring it and launching attention.cu whatever it is given (a launcher bug)."""
    from sharpinf.ops import attention as attn_ops
    from sharpinf.ops.variants import Variant, register

    def launches_the_baseline(*args, file=None, **kw):
        return attn_ops.attention(*args, **kw)

    fn = attn_ops.attention if honest else launches_the_baseline
    return register(Variant("attention", name, files, fn, "a test's throwaway variant"))


def test_a_variant_whose_launcher_runs_another_kernel_fails_at_construction(emu):
    """Registered, chosen by name, but its launcher dispatches the baseline's kernel: the step would run
    attention.cu under the name `mine`. The ForwardPass refuses it in one line."""
    from sharpinf.ops.variants import unregister

    _throwaway("mine", ("attention_split.cu",), honest=False)  # claims split's file, launches attention.cu
    try:
        with pytest.raises(SharpinfError) as e:
            ForwardPass(_model("llama"), emu, kernels="attention=mine", compile_ahead=False)
        msg = str(e.value)
        assert "attention=mine launched none of its own kernels (attention_split.cu)" in msg, msg
        assert "attention.cu" in msg and "\n" not in msg
        fp = ForwardPass(_model("llama"), emu, kernels="simple", compile_ahead=False)
        with pytest.raises(SharpinfError, match="attention=mine launched none"):
            fp.with_own_buffers(kernels="attention=mine")
        assert "attention=mine" in choices_for("all")  # every registered variant is in --kernels all
    finally:
        unregister("attention", "mine")
    with pytest.raises(SharpinfError, match="unknown attention variant 'mine'"):
        KernelChoice.parse("attention=mine")
    _throwaway("gone", ("attention_gone.cu",))  # honest, but its file is nowhere
    try:
        with pytest.raises(SharpinfError, match="attention=gone: its kernel file attention_gone.cu is not in "):
            ForwardPass(_model("llama"), emu, kernels="attention=gone", compile_ahead=False)
    finally:
        unregister("attention", "gone")


def test_a_variant_is_dispatched_from_the_registry(emu):
    """A registered variant runs its own launcher: the step's kernels come from the table."""
    from sharpinf.ops.variants import unregister

    _throwaway("again", ("attention.cu",))
    try:
        fp = ForwardPass(_model("llama"), emu, kernels="attention=again", compile_ahead=False)
        assert fp.choice.of("attention").name == "again"
        assert {f for f, _ in fp.kernels_used("f16")} >= {"attention.cu"}
    finally:
        unregister("attention", "again")


def test_a_matmul_variant_brings_the_norm_it_declares(emu):
    """StepKernels runs the norm the matmul entry declares (nothing inferred from its name or files);
    an entry that leaves out its activations or norm, or another op's that declares them, fails."""
    from sharpinf.ops import attention as attn_ops
    from sharpinf.ops import basic
    from sharpinf.ops import matmul as mm_ops
    from sharpinf.ops.variants import Variant, register, unregister

    rows = []

    def norm(be, x, w, y, n_rows, n, eps):
        rows.append(n_rows)
        basic.rmsnorm(be, x, w, y, n_rows, n, eps)

    register(Variant("matmul", "mine", ("matmul.cu",), mm_ops.matmul, "a test's", activations="f32", norm=norm))
    try:
        fp = ForwardPass(_model("llama"), emu, kernels="matmul=mine", compile_ahead=False)
        assert declares(fp.choice.of("matmul")) == "f32 activations, norm norm" and not fp.choice.q8_activations
        assert rows  # the dry run of the step's dispatch called it: two norms a layer, then the head's
    finally:
        unregister("matmul", "mine")
    with pytest.raises(SharpinfError, match="matmul=bad: a matmul variant declares its activations"):
        Variant("matmul", "bad", ("matmul.cu",), mm_ops.matmul, "no norm", activations="f32")
    with pytest.raises(SharpinfError, match="matmul=bad: a matmul variant declares its activations"):
        Variant("matmul", "bad", ("matmul.cu",), mm_ops.matmul, "int4?", activations="q4", norm=basic.rmsnorm)
    with pytest.raises(SharpinfError, match="attention=bad: activations, norm and gate_up are a matmul"):
        Variant("attention", "bad", ("attention.cu",), attn_ops.attention, "a norm?", norm=basic.rmsnorm)


def test_a_variant_without_a_launcher_or_files_fails_when_declared():
    from sharpinf.ops.variants import Variant

    with pytest.raises(SharpinfError, match="attention=bad: no launcher"):
        Variant("attention", "bad", ("attention_bad.cu",), None, "no launcher")
    with pytest.raises(SharpinfError, match="files must name"):
        Variant("attention", "bad", (), print, "no files")
    with pytest.raises(SharpinfError, match="unknown op 'softmax'"):
        Variant("softmax", "bad", ("softmax.cu",), print, "no such op")


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_a_decode_step_of_the_fast_set_launches_at_most_9_a_layer_and_6_more(emu, arch):
    """The launch floor a decode step pays (each launch a few us on a GPU): on the fast set at most 9
    a layer, plus at most 6 for the embedding and the head (gather, norm, LM head, sampling) -- a
    variant or a set change that adds launches fails here before it meets a GPU. Counted by the dry
    run (the launches a one-token step records, nothing run) the project's step makes."""
    fp = ForwardPass(_model(arch), emu, kernels="fast", compile_ahead=False)
    body, head = fp.dry_run.launch_names(fp.kv_dtype, tokens=1)
    per_layer, n_layer = fp.launches_per_layer(), fp.cfg.n_layer
    assert per_layer <= 9, per_layer
    assert len(body) + len(head) - per_layer * n_layer <= 6, [n for _, n in head]
