"""The registry is the one source of what a variant is (sharpinf/ops/variants.toml): each entry
declares its scratch, rounding, requirements and token range, and everything reads them there -- the
Workspace allocates the declared scratch, the tolerance follows the declared rounding, a choice that
breaks a requirement is refused in one line (a named set never can), the token ranges are the
launchers' own constants, and the docs' variant tables are the registry rendered. Every problem in the
file is one line naming the entry."""

from __future__ import annotations

import functools
from pathlib import Path
from types import SimpleNamespace

import pytest

from sharpinf.errors import SharpinfError
from sharpinf.ops import variants as V
from sharpinf.ops.registry_file import load_registry
from sharpinf.ops.variant_table import BEGIN, END, markdown_table, with_table

ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def _model(arch: str):
    from sharpinf.model.loader import load_model
    from sharpinf.model.synth import synthetic_model

    return load_model(synthetic_model(arch, "Q4_K", n_embd=256))


def test_every_named_set_meets_its_variants_requirements():
    """Consistent by construction: each set's choice breaks no requirement, and names no variant after a set."""
    assert list(V.SETS) == ["simple", "fast", "tensor", "tuned"]
    variant_names = {n for op in V.OP_NAMES for n in V.REGISTRY[op]}
    assert not variant_names & set(V.SETS)  # a set name is never a variant name
    for name, ops in V.SETS.items():
        assert V.broken(ops) == [], name
        assert V.KernelChoice.parse(name).name == name
    assert V.KernelChoice.parse("simple") == V.KernelChoice()  # the baselines


def _registry(tmp_path, text: str) -> Path:
    path = tmp_path / "variants.toml"
    path.write_text(V.REGISTRY_FILE.read_text() + text)
    return path


@pytest.mark.parametrize("extra,needle", [
    ('\n[[variant]]\nop = "attention"\nname = "mine"\nlike = "split"\nfiles = ["attention_split.cu"]\nsummary = "x"\n'
     'scracth = "sharpinf.ops.attention:split_scratch"\n', "variant 24 (attention=mine): unknown key(s) scracth"),
    ('\n[[variant]]\nop = "attention"\nname = "mine"\nlike = "split"\nfiles = ["attention_split.cu"]\nsummary = "x"\n'
     'scratch = "sharpinf.ops.attention:no_such"\n', "scratch = 'sharpinf.ops.attention:no_such' names nothing"),
    ('\n[[variant]]\nop = "attention"\nname = "mine"\nlike = "split"\nfiles = ["attention_split.cu"]\nsummary = "x"\n'
     'requires = ["rope_kv=fusde"]\n', "attention=mine requires rope_kv=fusde: no rope_kv variant (separate, fused) meets it"),
    ('\n[[variant]]\nop = "attention"\nname = "mine"\nlike = "split"\nfiles = ["attention_split.cu"]\nsummary = "x"\n'
     'requires = ["rope=fused"]\n', "requirement 'rope=fused': write OP=NAME or OP.KEY=VALUE"),
    ('\n[[variant]]\nop = "attention"\nname = "mine"\nlike = "split"\nfiles = ["attention_split.cu"]\nsummary = "x"\n'
     'rounding = "f8"\n', "rounding 'f8'; choose f32, f16_operands"),
    ('\n[[variant]]\nop = "matmul"\nname = "mine"\nlike = "mmq"\nfiles = ["matmul_mmq.cu"]\nsummary = "x"\n'
     'min_tokens = "sharpinf.ops.matmul_mmq:BEST_MIN_TOKENZ"\n', "min_tokens = 'sharpinf.ops.matmul_mmq:BEST_MIN_TOKENZ' names nothing"),
    ('\n[[variant]]\nop = "matmul"\nname = "mine"\nlike = "mmq"\nfiles = ["matmul_mmq.cu"]\nsummary = "x"\nbits = "dp4b"\n',
     "matmul=mine: bits = 'dp4b' is no matmul variant"),
    ('\n[[variant]]\nop = "ffn"\nname = "fast"\nlike = "fused"\nfiles = ["ffn_dp4a.cu"]\nsummary = "x"\n',
     "'fast' names a kernel set; choose another name"),
    ('\n[set.mine]\nlink = "layer"\n', "set mine: link=layer requires matmul.activations=q8_1 (the choice has matmul=float)"),
    ('\n[set.mine]\nattention = "tiled"\n', "set mine: unknown attention variant 'tiled'"),
])
def test_a_bad_registry_entry_is_one_line_naming_it(tmp_path, extra, needle):
    try:
        with pytest.raises(SharpinfError) as e:
            load_registry(_registry(tmp_path, extra))
        assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)
    finally:
        load_registry()
    assert "mine" not in V.SETS and "mine" not in V.REGISTRY["attention"]


def test_the_token_ranges_are_the_launchers_own_numbers():
    """min_tokens / max_tokens name the launcher module's constant: one number, one place."""
    from sharpinf.ops import matmul_dp4a, matmul_gemv, matmul_mma, matmul_mmq, moe

    got = {v.label: (v.min_tokens, v.max_tokens) for op in V.OP_NAMES for v in V.REGISTRY[op].values()}
    assert got["matmul=mma"] == (matmul_mma.MIN_TOKENS, None)
    assert got["matmul=mmq"] == got["matmul=mmq_narrow"] == (matmul_mmq.MIN_TOKENS, None)
    assert got["matmul=gemv"] == (1, matmul_gemv.MAX_TOKENS)
    assert got["moe=mmq"] == (moe.MMQ_MIN_TOKENS, None) and moe.MMQ_MIN_TOKENS is matmul_mmq.MIN_TOKENS
    assert got["moe=gemv"] == (1, moe.GEMV_MAX_TOKENS) and moe.GEMV_MAX_TOKENS is matmul_gemv.MAX_TOKENS
    assert got["ffn=fused"] == got["link=layer"] == (1, matmul_dp4a.TILE_TOKENS)
    text = V.REGISTRY_FILE.read_text()
    assert "min_tokens = 16" not in text and "max_tokens = 8" not in text


def test_the_tolerance_and_the_trace_follow_the_declared_rounding():
    from oracles.tolerances import ATTENTION_ROUNDING_BOUND, TRACE_BOUNDS, kernel_vs_reference

    assert set(ATTENTION_ROUNDING_BOUND) == set(V.ROUNDINGS)  # every rounding a variant may declare has its bound
    assert {f"attention_{r}" for r in V.ROUNDINGS if r != "f32"} <= set(TRACE_BOUNDS)
    assert V.variant("attention", "flash").rounding == "f16_operands"
    assert {V.variant("attention", n).rounding for n in ("warp", "split")} == {"f32"}
    f32, f16 = (kernel_vs_reference("f16", attention_rounding=r) for r in ("f32", "f16_operands"))
    assert f16.max_abs_dlogit > f32.max_abs_dlogit and "operands in f16" in f16.why and "operands" not in f32.why


def test_a_broken_requirement_is_refused_where_a_choice_is_made(emu):
    from sharpinf.step.forward import ForwardPass

    with pytest.raises(SharpinfError, match=r"^kernels ffn=fused: ffn=fused requires matmul.activations=q8_1 "
                                            r"\(the choice has matmul=float\)$"):
        V.check_kernels("ffn=fused")  # before anything loads: the CLI's check
    with pytest.raises(SharpinfError, match="link=layer requires rope_kv=fused"):
        ForwardPass(_model("llama"), emu, kernels="matmul=gemv,link=layer", compile_ahead=False)
    assert V.with_requirements("link", "layer") == {"matmul": "dp4a", "link": "layer", "rope_kv": "fused"}


def test_a_set_drops_a_variant_whose_requirement_its_fallback_breaks(monkeypatch, capsys):
    """A named set takes the baseline where a variant does not fit the model -- and then of a variant that
    required the one dropped, with a note each (never a choice that breaks a requirement)."""
    monkeypatch.setenv("SHARPINF_PROGRESS", "1")
    needs_split = V.Variant("sample", "needs_split", ("sampling.cu",), V.baseline("sample").launcher, "a test's",
                            requires=(V.Requirement.parse("attention=split"),))
    V.register(needs_split)
    try:
        monkeypatch.setitem(V.SETS, "odd", {**V.SETS["fast"], "sample": "needs_split"})
        assert V.resolve_kernels("odd", SimpleNamespace(head_dim=64)).sample == "needs_split"
        got = V.resolve_kernels("odd", SimpleNamespace(head_dim=48))  # split is compiled for other head_dims
        assert (got.attention, got.sample) == ("warp", "block") and not V.broken(got.to_json())
        err = capsys.readouterr().err
        assert "head_dim" in err and "it requires attention=split: using the baseline sample=block" in err
    finally:
        V.unregister("sample", "needs_split")


def test_the_workspace_allocates_each_chosen_variants_declared_scratch(emu):
    """ws.<name> for each name a chosen variant's scratch gives (a name two give is one buffer: the grid
    barrier of the fused FFN and the link), nothing for the others; a throwaway variant's own scratch
    function is called with (be, cfg, cap) -- no Workspace code knows it."""
    from sharpinf.ops import attention as attn_ops
    from sharpinf.step.forward import ForwardPass

    fp = ForwardPass(_model("qwen3"), emu, kernels="simple", compile_ahead=False)
    assert fp.ws.scratch_of == {}
    fast = fp.with_own_buffers(kernels="fast")
    assert fast.ws.scratch_of == {"mmq_split": "matmul=best", "split": "attention=split"}
    tensor = fp.with_own_buffers(kernels="tensor")
    assert tensor.ws.scratch_of["sample_acc"] == "sample=radix"
    both = fp.with_own_buffers(kernels="matmul=dp4a,ffn=fused,attention=split,rope_kv=fused")
    assert both.ws.scratch_of == {"grid_bar": "ffn=fused", "split": "attention=split"}
    linked = fp.with_own_buffers(kernels="matmul=dp4a,link=layer,rope_kv=fused")
    assert linked.ws.scratch_of == {"grid_bar": "link=layer", "linkq": "link=layer"}
    calls = []

    def scratch(be, cfg, cap):
        calls.append((cfg.n_head, cap.tokens))
        return {"mine": be.zeros((cap.tokens,), "float32"), **attn_ops.split_scratch(be, cfg, cap)}

    V.register(V.Variant("attention", "mine", ("attention_split.cu",), attn_ops.attention_split, "a test's",
                         shape=attn_ops.split_shape, writes_q8=True, scratch=(scratch,)))
    try:
        mine = fp.with_own_buffers(kernels="attention=mine")
        assert mine.ws.scratch_of == {"mine": "attention=mine", "split": "attention=mine"}
        assert calls and calls[-1] == (fp.cfg.n_head, mine.capacity.tokens) and mine.ws.mine.shape == (calls[-1][1],)
        V.unregister("attention", "mine")

        def clashes(be, cfg, cap):
            return {"x": None}

        V.register(V.Variant("attention", "mine", ("attention_split.cu",), attn_ops.attention_split, "a test's",
                             scratch=(clashes,)))
        with pytest.raises(SharpinfError, match="attention=mine: its scratch clashes gives 'x', a buffer the workspace"):
            fp.with_own_buffers(kernels="attention=mine")
    finally:
        V.unregister("attention", "mine")


def test_same_bits_follows_the_declared_bits():
    fast, tensor, tuned = (V.KernelChoice.parse(s) for s in ("fast", "tensor", "tuned"))
    assert fast.same_bits(tuned) and fast.same_bits(V.KernelChoice(**{**V.SETS["fast"], "matmul": "mma"}))
    assert not fast.same_bits(tensor)  # flash attention's bits are its own
    assert not fast.same_bits(V.KernelChoice.parse("simple"))
    assert V.bits_of(V.variant("moe", "mmq")) == "grouped" and V.bits_of(V.variant("link", "layer")) == "separate"


def test_the_docs_variant_tables_are_the_registry_rendered():
    """README.md's and ARCHITECTURE.md's tables between the markers are what the registry renders;
    regenerate with `sharpinf kernels list --markdown --write README.md --write ARCHITECTURE.md`."""
    table = markdown_table()
    assert table.count("\n") == 2 + sum(len(v) for v in V.REGISTRY.values())
    for doc in ("README.md", "ARCHITECTURE.md"):
        text = (ROOT / doc).read_text()
        assert text.count(BEGIN) == text.count(END) == 1, doc
        assert with_table(text, doc) == text, (f"{doc}'s variant table is not the registry's: run sharpinf kernels "
                                               "list --markdown --write " + doc)
    stale = (ROOT / "README.md").read_text().replace("| `radix` |", "| `radix_old` |")
    assert with_table(stale) != stale  # the check sees a stale copy
    with pytest.raises(SharpinfError, match="no variant table markers"):
        with_table("no table here")
