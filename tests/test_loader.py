"""load_model on synthetic GGUFs of every arch x quant type, checked against gguf-py's reader."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
from gguf import quants as gq

from oracles.reference import Reference
from sharpinf.errors import ModelError
from sharpinf.model import quants
from sharpinf.model.config import ROPE_STYLE, SUPPORTED_ARCHS
from sharpinf.model.loader import LoadedModel, expected_shapes, inspect_model, load_model
from sharpinf.model.rope_scaling import RopeScaling
from sharpinf.model.synth import GEMMA, synthetic_model, write_synthetic_model
from sharpinf.model.tensors import QTensor

QTYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]


def bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def gguf_truth(path) -> dict[str, np.ndarray]:
    """name -> float32 numpy-order array, via gguf-py's own reader and dequantize."""
    out = {}
    for t in gguf.GGUFReader(path).tensors:
        shape = tuple(reversed([int(d) for d in t.shape]))
        data = t.data
        if t.tensor_type == gguf.GGMLQuantizationType.BF16:
            data = data.view(np.uint8)
        out[t.name] = np.asarray(gq.dequantize(data, t.tensor_type), np.float32).reshape(shape)
    return out


@pytest.mark.parametrize("arch", SUPPORTED_ARCHS)
@pytest.mark.parametrize("qtype", QTYPES)
def test_every_arch_and_quant(arch, qtype):
    path = synthetic_model(arch, qtype)
    m = load_model(path)
    c = m.config
    k_quant = qtype.endswith("_K")
    n_embd = 256 if k_quant else 64
    assert (c.arch, c.n_layer, c.n_embd, c.n_head, c.n_head_kv) == (arch, 2, n_embd, 4, 2)
    assert (c.n_ff, c.head_dim, c.n_vocab, c.context_length) == (256 if k_quant else 128, n_embd // 4, 512, 1024)
    assert c.rope_style == ROPE_STYLE[arch] and c.rope_theta == (1e6 if arch == "gemma3" else 10000.0)
    assert c.rms_eps == pytest.approx(1e-5)
    assert c.has_qkv_bias == (arch in ("qwen2", "gpt-oss")) and c.has_qk_norm == (arch in ("qwen3", "gemma3", "qwen3moe"))
    assert c.tied_output == (arch != "gpt-oss") and c.is_moe == (arch in ("qwen3moe", "gpt-oss"))
    windows = {"gemma3": (16, 16), "gemma2": (16, 0), "gpt-oss": (16, 0)}  # gemma2, gpt-oss: every other layer
    assert c.post_norms == (arch in GEMMA) and c.layer_window == windows.get(arch, ())

    in_file = inspect_model(path).tensors  # phi3's fused matrices as the file holds them
    assert set(in_file) == set(expected_shapes(c))
    truth = gguf_truth(path)
    assert set(truth) == set(in_file)
    for name, t in in_file.items():
        assert isinstance(t, QTensor) and t.name == name
        # F32 whatever the file's type, as llama.cpp quantizes: the router, gpt-oss's sinks and biases
        f32 = len(t.shape) == 1 or name.endswith(("ffn_gate_inp.weight", ".bias"))
        experts = arch == "gpt-oss" and "_exps." in name  # MXFP4 by default
        want_type = quants.qtype_from_name("F32" if f32 else "MXFP4" if experts else qtype)
        assert t.qtype == want_type and t.qtype_name == quants.qtype_name(want_type)
        assert t.raw.dtype == np.uint8 and t.raw.ndim == 2 and not t.raw.flags.writeable
        assert t.raw.shape[1] == quants.row_bytes(t.qtype, t.shape[-1]) and t.nbytes == t.raw.nbytes
        assert bits_equal(t.dequantize(), truth[name]), name
    if arch == "phi3":  # the graph's views: Q, K, V's rows of attn_qkv; the gate's then the up's of ffn_up
        qkv, gu = truth["blk.1.attn_qkv.weight"], truth["blk.1.ffn_up.weight"]
        parts = {"attn_q": qkv[: c.q_dim], "attn_k": qkv[c.q_dim : c.q_dim + c.kv_dim],
                 "attn_v": qkv[c.q_dim + c.kv_dim :], "ffn_gate": gu[: c.n_ff], "ffn_up": gu[c.n_ff :]}
        for part, want in parts.items():
            assert bits_equal(m.tensors[f"blk.1.{part}.weight"].dequantize(), want), part
        assert "blk.1.attn_qkv.weight" not in m.tensors


def test_weights_are_what_was_written():
    """The loader returns exactly dequantize(quantize(w)) of the generator's float weights."""
    from sharpinf.model import synth

    m = load_model(synthetic_model("qwen2", "Q5_K"))
    c = m.config
    w = synth._weights("qwen2", 0, c.n_layer, c.n_embd, c.n_ff, c.n_vocab, c.q_dim, c.kv_dim, c.head_dim, True)
    assert list(w) == list(m.tensors)  # same tensors, same file order
    for name, x in w.items():
        qt = m.tensors[name].qtype
        assert bits_equal(m.tensors[name].dequantize(), quants.dequantize(quants.quantize(x, qt), qt, x.shape))
        assert np.abs(m.tensors[name].dequantize() - x).max() <= 0.04 * np.abs(x).max()


def test_metadata_is_plain_python():
    m = load_model(synthetic_model("qwen3", "Q8_0"))
    meta = m.metadata
    assert meta["general.architecture"] == "qwen3"
    assert meta["qwen3.attention.key_length"] == 16 and meta["qwen3.attention.value_length"] == 16
    assert len(meta["tokenizer.ggml.tokens"]) == 512
    assert isinstance(meta["tokenizer.chat_template"], str)
    assert not any(k.startswith("GGUF.") for k in meta)

    def plain(v):
        if isinstance(v, list):
            return all(plain(e) for e in v)
        return type(v) in (str, int, float, bool)

    assert all(plain(v) for v in meta.values())


def test_tied_and_untied_output():
    tied = load_model(synthetic_model("llama", "Q4_0"))
    assert tied.config.tied_output and "output.weight" not in tied.tensors
    assert tied.output_weight() is tied.tensor("token_embd.weight")

    untied = load_model(synthetic_model("llama", "Q4_0", tied=False))
    assert not untied.config.tied_output
    out = untied.output_weight()
    assert out.name == "output.weight" and out.shape == (512, 64) and out.qtype == quants.Q4_0
    assert not np.array_equal(out.dequantize(), untied.tensor("token_embd.weight").dequantize())


def test_accessors():
    m = load_model(synthetic_model("llama", "Q8_0"))
    assert isinstance(m, LoadedModel)
    assert m.layer_tensor(1, "attn_q.weight") is m.tensors["blk.1.attn_q.weight"]
    assert m.layer_tensor(0, "attn_k.weight").shape == (m.config.kv_dim, m.config.n_embd)
    assert m.tensor("output_norm.weight").raw.shape == (1, 64 * 4)
    with pytest.raises(ModelError, match="blk.7.attn_q.weight"):
        m.layer_tensor(7, "attn_q.weight")
    with pytest.raises(ModelError, match="output.weight"):
        m.tensor("output.weight")


def test_deterministic_bytes(tmp_path):
    a = write_synthetic_model(tmp_path / "a.gguf", "qwen2", "Q4_K", seed=3)
    b = write_synthetic_model(tmp_path / "b.gguf", "qwen2", "Q4_K", seed=3)
    c = write_synthetic_model(tmp_path / "c.gguf", "qwen2", "Q4_K", seed=4)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()
    assert synthetic_model("llama", "Q8_0") == synthetic_model("llama", "Q8_0")
    assert synthetic_model("llama", "Q8_0", seed=1) != synthetic_model("llama", "Q8_0")


def test_gemma3_config_as_llama_cpp_reads_it(tmp_path):
    """llama.cpp's gemma3: layers 5, 11, ... global, the others windowed with RoPE base 10000 unscaled;
    linear RoPE scaling on the global layers only; no window key, no windows; sqrt(n_embd) embeddings,
    1/sqrt(head_dim) attention, GeGLU, post-norms, a softcap only when declared."""
    p = write_synthetic_model(tmp_path / "g.gguf", "gemma3", "Q8_0", n_layer=12, sliding_window=32,
                              **{"gemma3.rope.scaling.type": "linear", "gemma3.rope.scaling.factor": 8.0,
                                 "gemma3.final_logit_softcapping": 30.0})
    c = load_model(p).config
    assert c.layer_window == (32,) * 5 + (0,) + (32,) * 5 + (0,) and not c.all_layers_windowed
    lin8 = RopeScaling("linear", 0.125)
    assert c.rope_for(0) == (10000.0, RopeScaling()) and c.rope_for(5) == (1e6, lin8) and c.rope_for(11) == (1e6, lin8)
    assert c.embd_scale == 8.0 and c.kq_scale == 0.25 and c.ffn_act == "gelu_tanh" and c.final_softcap == 30.0
    assert "blk.11.post_ffw_norm.weight" in expected_shapes(c) and "blk.0.post_attention_norm.weight" in expected_shapes(c)
    c = load_model(write_synthetic_model(tmp_path / "n.gguf", "gemma3", "Q8_0", sliding_window=0)).config
    assert c.layer_window == () and c.window(0) == 0 and c.rope_for(0) == (1e6, RopeScaling()) and c.final_softcap == 0.0
    assert load_model(write_synthetic_model(tmp_path / "l.gguf", "gemma3", "Q8_0")).config.all_layers_windowed


def test_qwen3moe_config_as_llama_cpp_reads_it(tmp_path):
    """llama.cpp's qwen3moe keys (expert_count, expert_used_count, expert_feed_forward_length) and
    tensors: router ffn_gate_inp {n_embd, n_expert}, experts ffn_gate/up_exps {n_embd, n_ff_exp, n_expert},
    ffn_down_exps {n_ff_exp, n_embd, n_expert} in ggml order -- numpy order reversed; no dense FFN."""
    p = write_synthetic_model(tmp_path / "m.gguf", "qwen3moe", "Q4_0", n_expert=6, n_expert_used=3, n_ff_exp=96)
    m = load_model(p)
    c = m.config
    assert (c.n_expert, c.n_expert_used, c.n_ff_exp, c.is_moe, c.rope_style) == (6, 3, 96, True, "neox")
    assert m.metadata["qwen3moe.expert_count"] == 6 and "blk.0.ffn_gate.weight" not in m.tensors
    ne = {t.name: tuple(int(d) for d in t.shape) for t in gguf.GGUFReader(p).tensors}  # ggml order
    assert ne["blk.1.ffn_gate_inp.weight"] == (c.n_embd, 6) and ne["blk.1.ffn_up_exps.weight"] == (c.n_embd, 96, 6)
    assert ne["blk.1.ffn_down_exps.weight"] == (96, c.n_embd, 6)
    assert m.tensor("blk.1.ffn_gate_exps.weight").shape == (6, 96, c.n_embd)
    # an expert is a slice of the stack: expert 4's rows are rows 4 * 96 .. 5 * 96 of the raw blocks
    exps = m.tensor("blk.0.ffn_down_exps.weight")
    assert bits_equal(exps.dequantize()[4], quants.dequantize(exps.raw[4 * c.n_embd : 5 * c.n_embd], exps.qtype,
                                                               (c.n_embd, 96)))
    # no expert_feed_forward_length: llama.cpp takes n_ff / n_expert_used
    p = write_synthetic_model(tmp_path / "d.gguf", "qwen3moe", "Q8_0", n_ff=128, n_ff_exp=64, n_expert_used=2,
                              **{"qwen3moe.expert_feed_forward_length": 0})
    assert load_model(p).config.n_ff_exp == 64


@pytest.mark.parametrize("meta, words", [
    ({"qwen3moe.expert_used_count": 9}, "expert_used_count = 9 (must be 1..8 with expert_count = 8)"),
    ({"qwen3moe.expert_used_count": 0}, "expert_used_count = 0"),
    ({"qwen3moe.expert_count": 4}, "tensor 'blk.0.ffn_gate_inp.weight' has shape (8, 64), expected (4, 64)"),
    ({"qwen3moe.expert_count": 100000}, "expert_count = 100000 (must be 1..512)"),
    ({"qwen3moe.expert_feed_forward_length": 96}, "tensor 'blk.0.ffn_gate_exps.weight' has shape (8, 128, 64), "
                                                  "expected (8, 96, 64)"),
])
def test_qwen3moe_inconsistent_metadata_is_one_line(tmp_path, meta, words):
    p = write_synthetic_model(tmp_path / "m.gguf", "qwen3moe", "Q8_0", **meta)
    with pytest.raises(ModelError) as info:
        load_model(p)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_qwen3moe_expert_count_of_the_wrong_type_is_one_line(tmp_path):
    p = write_synthetic_model(tmp_path / "m.gguf", "qwen3moe", "Q8_0", **{"qwen3moe.expert_count": "eight"})
    with pytest.raises(ModelError, match="metadata key 'qwen3moe.expert_count' should be int, got 'eight'"):
        load_model(p)


def test_llama_with_experts_is_mixtral_style_as_llama_cpp_reads_it(tmp_path):
    """Mixtral's GGUF is arch llama with llama.expert_count > 0 (src/models/llama.cpp): llama's attention
    (norm RoPE, no QK-norm), the experts where the dense FFN was, their length feed_forward_length
    itself -- llama.cpp reads no expert_feed_forward_length for llama."""
    p = write_synthetic_model(tmp_path / "m.gguf", "llama", "Q4_0", n_expert=4, n_expert_used=2, n_ff_exp=96)
    m = load_model(p)
    c = m.config
    assert (c.arch, c.n_expert, c.n_expert_used, c.n_ff_exp, c.n_ff, c.is_moe) == ("llama", 4, 2, 96, 96, True)
    assert (c.rope_style, c.has_qk_norm) == ("norm", False) and "llama.expert_feed_forward_length" not in m.metadata
    assert m.tensor("blk.1.ffn_up_exps.weight").shape == (4, 96, c.n_embd) and "blk.0.ffn_gate.weight" not in m.tensors
    no_experts = write_synthetic_model(tmp_path / "d.gguf", "llama", "Q8_0", **{"llama.expert_count": 0})
    assert not load_model(no_experts).config.is_moe  # a zero count is a dense llama, as llama.cpp reads it
    # the writer refuses what no file holds
    for arch, n, k in (("llama", -2, 2), ("qwen3moe", 0, 2), ("qwen3moe", 4, 6)):
        with pytest.raises(ValueError, match=f"experts: {n} a layer, {k} a token"):
            write_synthetic_model(tmp_path / "x.gguf", arch, "Q8_0", n_expert=n, n_expert_used=k)


def test_experts_in_an_arch_without_them_are_declined_in_one_line(tmp_path):
    """qwen2 with qwen2.expert_count > 0 (a file that would be Qwen2-MoE): declined by name, not run as a dense
    model nor failed on a missing ffn tensor."""
    p = write_synthetic_model(tmp_path / "m.gguf", "qwen2", "Q8_0",
                              **{"qwen2.expert_count": 8, "qwen2.expert_used_count": 2})
    with pytest.raises(ModelError) as info:
        load_model(p)
    assert ("qwen2-arch mixture of experts is not supported (qwen2.expert_count = 8): the MoE archs read are "
            "qwen3moe, llama") in str(info.value) and "\n" not in str(info.value)


def test_gemma3_corrupt_block_count_fails_fast(tmp_path):
    """A block_count of 2**31 - 1: one line about the first missing layer, not 2**31 per-layer windows
    first (17 GB of tuple: a MemoryError, or minutes)."""
    from sharpinf.errors import ModelError

    p = write_synthetic_model(tmp_path / "c.gguf", "gemma3", "Q8_0", **{"gemma3.block_count": 2**31 - 1})
    with pytest.raises(ModelError, match="missing tensor 'blk.2."):
        load_model(p)


def test_rope_scaling_is_read_as_llama_cpp_reads_it(tmp_path):
    """Linear (the type defaults to linear; rope.scale_linear is the old key) and YaRN (ext_factor 1,
    the original context from its key else the training context, cos/sin times 1 + 0.1 ln factor) as
    llama.cpp's load_hparams and cparams hold them; a type llama.cpp does not name refused in one line."""
    for key in ("llama.rope.scaling.factor", "llama.rope.scale_linear"):
        c = load_model(write_synthetic_model(tmp_path / f"{key}.gguf", "llama", "Q8_0", **{key: 4.0})).config
        assert c.rope_freq_scale == 0.25 and c.rope_for(0) == (10000.0, RopeScaling("linear", 0.25))

    yarn = {"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0}
    for extra, n_orig in (({}, 1024), ({"llama.rope.scaling.original_context_length": 256}, 256)):
        c = load_model(write_synthetic_model(tmp_path / f"y{n_orig}.gguf", "llama", "Q8_0", **yarn, **extra)).config
        base, y = c.rope_for(0)
        assert (base, y.kind, y.freq_scale, y.ext_factor, y.n_ctx_orig) == (10000.0, "yarn", 0.25, 1.0, n_orig)
        assert y.mscale == pytest.approx(1 + 0.1 * np.log(4.0), rel=1e-6)

    p = write_synthetic_model(tmp_path / "l.gguf", "llama", "Q8_0", **{"llama.rope.scaling.type": "su"})
    with pytest.raises(ModelError, match="unsupported RoPE scaling 'su' \\(supported: none, linear, yarn, longrope\\)"):
        load_model(p)


def test_overrides(tmp_path):
    p = write_synthetic_model(
        tmp_path / "m.gguf", "llama", "Q8_0", n_layer=3, n_embd=96, n_head=6, n_head_kv=3, n_ff=160,
        context_length=4096, head_dim=32, rope_theta=500000.0, rms_eps=1e-6, n_vocab=300,
        norm_qtype="F16", **{"general.name": "custom"},
    )
    m = load_model(p)
    c = m.config
    assert (c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.n_ff, c.context_length) == (3, 96, 6, 3, 160, 4096)
    assert (c.head_dim, c.q_dim, c.kv_dim, c.n_vocab) == (32, 192, 96, 300)
    assert c.rope_theta == 500000.0 and c.rms_eps == pytest.approx(1e-6)
    assert m.metadata["general.name"] == "custom"
    assert m.tensor("blk.0.attn_norm.weight").qtype == quants.F16
    assert m.tensor("blk.0.attn_output.weight").shape == (96, 192)



# -- nothing in a file is silently ignored (model/keys.py) ---------------------------------------------
def _llama(tmp_path, name="m.gguf", **kw):
    return write_synthetic_model(tmp_path / name, "llama", "Q8_0", n_layer=1, n_embd=64, n_head=2, n_head_kv=1,
                                 n_ff=128, **kw)


def test_a_llama31_file_applies_its_rope_frequency_factors(tmp_path):
    """llama.cpp's converter writes rope_freqs.weight for every Llama 3.1-3.3 model and its llama graph
    divides every layer's RoPE frequencies by it: the file loads, and its logits are not those of the
    same weights without the factors (a load that dropped them would give another model's)."""
    plain = load_model(_llama(tmp_path))
    factors = np.linspace(1.0, 8.0, 16, dtype=np.float32)  # head_dim / 2 frequencies
    m = load_model(_llama(tmp_path, "llama31.gguf", extra_tensors={"rope_freqs.weight": factors}))
    assert m.config.has_rope_factors and not plain.config.has_rope_factors
    ids = list(range(1, 9))
    a, b = Reference(plain).logits(ids), Reference(m).logits(ids)
    assert np.array_equal(a[0], b[0]), "position 0 turns by nothing: factors or not, the same first row"
    assert np.abs(a[1:] - b[1:]).max() > 1e-3 * np.abs(a).max()
    with pytest.raises(ModelError, match=r"'rope_freqs.weight' has shape"):
        load_model(_llama(tmp_path, "short.gguf", extra_tensors={"rope_freqs.weight": factors[:8]}))


def test_phi3s_sliding_window_is_left_off_as_llama_cpp_leaves_it(tmp_path):
    """llama.cpp's phi3 graph turns the window off (its converter's pattern is wrong): inert, said why."""
    p = write_synthetic_model(tmp_path / "p.gguf", "phi3", "Q8_0", n_layer=1, **{"phi3.attention.sliding_window": 2047})
    m = load_model(p)
    assert m.config.layer_window == () and m.config.fused_qkv and m.config.fused_gate_up
    use = next(k for k in inspect_model(p).keys if k.key == "phi3.attention.sliding_window")
    assert use.use == "inert" and "turns sliding windows off" in use.why


def test_longrope_reads_the_long_factors_past_the_original_context_and_the_short_ones_within(tmp_path):
    """llama.cpp's get_rope_factors: a run whose sequences may pass rope.scaling.original_context_length
    (16 here) reads rope_factors_long, one that stays within it the short ones -- the engine's
    max_model_len is that context; one table alone, or the tables in another arch, are refused."""
    from oracles.reference import Reference
    from sharpinf.engine.llm_engine import LLMEngine

    p = write_synthetic_model(tmp_path / "lr.gguf", "phi3", "Q8_0", n_layer=1, longrope=16)
    m = load_model(p)
    assert m.config.has_longrope and m.config.n_ctx_orig == 16 and m.config.rope_scaling.kind == "longrope"
    assert [m.with_context(n).config.longrope_factors() for n in (None, 16, 17)] == ["long", "short", "long"]
    ids = list(range(1, 9))
    assert np.abs(Reference(m).logits(ids) - Reference(m.with_context(16)).logits(ids))[1:].max() > 1e-3
    engine = LLMEngine(p, backend="emu", max_model_len=16, num_blocks=8)
    assert engine.model.config.longrope_factors() == "short"
    only_long = write_synthetic_model(tmp_path / "l.gguf", "phi3", "Q8_0", n_layer=1,
                                      extra_tensors={"rope_factors_long.weight": np.ones(8, np.float32)})
    with pytest.raises(ModelError, match="missing tensor 'rope_factors_short.weight'"):
        load_model(only_long)
    in_llama = _llama(tmp_path, "ll.gguf", extra_tensors={"rope_factors_long.weight": np.ones(16, np.float32)})
    with pytest.raises(ModelError, match=r"rope_factors_long.weight \(LongRoPE's long-context factors, which only"):
        load_model(in_llama)


def test_rope_factors_in_an_arch_whose_graph_does_not_read_them_are_refused(tmp_path):
    """qwen3's graph in llama.cpp reads no rope_freqs.weight: a file carrying one is refused, naming it."""
    p = write_synthetic_model(tmp_path / "q.gguf", "qwen3", "Q8_0", n_layer=1,
                              extra_tensors={"rope_freqs.weight": np.ones(16, np.float32)})
    with pytest.raises(ModelError, match=r"tensor rope_freqs.weight \(RoPE frequency factors, which llama.cpp's graph"):
        load_model(p)


@pytest.mark.parametrize("key,value,words", [
    ("llama.attention.sliding_window", 4096, "the llama graph sharpinf runs does not read it"),
    ("llama.rope.dimension_count", 16, "sharpinf runs 32"),  # a partial rotary: another graph
    ("llama.attention.causal", False, "sharpinf runs True"),
    ("llama.logit_scale", 0.5, "sharpinf runs 1.0"),
    ("tokenizer.ggml.remove_extra_whitespaces", True, "sharpinf runs False"),
    ("tokenizer.ggml.precompiled_charsmap", [1, 2, 3], "a tokenizer setting sharpinf does not apply"),
    ("split.count", 3, "join them first"),
    ("mistral3.rope.freq_base", 1e6, "not a key of the llama graph"),
])
def test_a_key_that_would_change_the_math_is_refused_in_one_line(tmp_path, key, value, words):
    path = _llama(tmp_path, **{key: value})
    with pytest.raises(ModelError) as e:
        load_model(path)
    msg = str(e.value)
    assert "\n" not in msg and key in msg and words in msg and "sharpinf info" in msg, msg


def test_keys_that_change_nothing_load_and_say_why(tmp_path):
    path = _llama(tmp_path, **{"llama.rope.dimension_count": 32, "llama.rope.scaling.finetuned": False,
                               "general.license": "mit", "tokenizer.ggml.fim_pre_token_id": 5})
    r = inspect_model(path)
    assert r.error is None and r.refused is None
    use = {u.key: (u.use, u.why) for u in r.keys}
    assert use["llama.rope.dimension_count"] == ("checked", "the value sharpinf runs")
    assert use["llama.rope.scaling.finetuned"][0] == use["general.license"][0] == "inert"
    assert use["tokenizer.ggml.fim_pre_token_id"][0] == "inert" and "infill" in use["tokenizer.ggml.fim_pre_token_id"][1]
    assert use["llama.embedding_length"] == ("applied", "ModelConfig")
    assert {t.use for t in r.tensor_uses} == {"used"} and len(r.tensor_uses) == len(load_model(path).tensors)


def test_info_lists_what_it_reads_and_refuses_before_any_weight(tmp_path):
    from typer.testing import CliRunner

    from sharpinf.cli import app

    factors = np.ones(16, np.float32)
    path = _llama(tmp_path, extra_tensors={"rope_freqs.weight": factors, "blk.0.ffn_mystery.weight": factors},
                  **{"llama.attention.sliding_window": 128})
    res = CliRunner().invoke(app, ["info", str(path), "--json"])
    assert res.exit_code == 1
    doc = json.loads(res.output[: res.output.rindex("}") + 1])
    f = doc["file"]
    assert not f["loads"] and "ffn_mystery" in f["error"] and "llama.attention.sliding_window" in f["error"]
    assert {t["name"] for t in f["tensors"]["refused"]} == {"blk.0.ffn_mystery.weight"}  # rope_freqs: read
    assert next(k for k in f["keys"] if k["key"] == "llama.attention.sliding_window")["use"] == "refused"
    ok = CliRunner().invoke(app, ["info", str(_llama(tmp_path, "ok.gguf", extra_tensors={"rope_freqs.weight": factors},
                                                     **{"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0}))])
    assert ok.exit_code == 0 and "YaRN x4 over an original context of 1024" in ok.output
    assert "frequency factors (rope_freqs.weight)" in ok.output


def test_mistral3_reads_its_yarn_and_temperature_keys_and_runs_to_its_whole_context(tmp_path):
    """mistral3 (llama's graph): YaRN's betas and log multiplier and the queries' temperature_scale applied
    (llama.cpp agrees: test_llamacpp_agreement's mistral3 file); the factor is 1 exactly before the original
    context and > 1 past it, where the reference's logits change; the kernels apply it too, so the engine's
    max_model_len is the file's context, as for any file; the same keys in a llama file are refused."""
    from sharpinf.engine.config import run_context

    keys = {"mistral3.rope.scaling.type": "yarn", "mistral3.rope.scaling.factor": 4.0,
            "mistral3.rope.scaling.original_context_length": 64, "mistral3.rope.scaling.yarn_beta_fast": 8.0,
            "mistral3.rope.scaling.yarn_beta_slow": 0.5, "mistral3.rope.scaling.yarn_log_multiplier": 0.1,
            "mistral3.attention.temperature_scale": 0.5}
    m = load_model(write_synthetic_model(tmp_path / "m3.gguf", "mistral3", "Q8_0", n_layer=1, **keys))
    c = m.config
    assert (c.rope_style, c.rope_scaling.beta_fast, c.rope_scaling.beta_slow, c.attn_temp_starts) == ("norm", 8.0, 0.5, 64)
    assert c.attn_temp([0, 63]).tolist() == [1.0, 1.0] and c.attn_temp([64])[0] == np.float32(1 + 0.5 * np.log(2))
    assert c.context_length > 65 and run_context(c, None) == c.context_length and run_context(c, 65) == 65
    ids = list(range(1, 70))  # the reference applies it past 64: those logits change
    ref = Reference(m).logits(ids)
    untempered = Reference(load_model(write_synthetic_model(
        tmp_path / "m3b.gguf", "mistral3", "Q8_0", n_layer=1, **{**keys, "mistral3.attention.temperature_scale": 0.0})))
    other = untempered.logits(ids)
    assert np.array_equal(ref[:64], other[:64]) and not np.array_equal(ref[64:], other[64:])
    llama = _llama(tmp_path, "l.gguf", **{"llama.rope.scaling.type": "yarn", "llama.rope.scaling.yarn_beta_fast": 8.0})
    with pytest.raises(ModelError, match="llama.rope.scaling.yarn_beta_fast"):
        load_model(llama)


def test_a_mistral3_step_past_the_temperatures_start_gives_the_references_logits(tmp_path):
    """The kernels (the simple and the fast set) run a mistral3 file past its original context of 8, in
    chunks and decode steps, and give the reference's logits there; the same file with temperature_scale
    0 gives the same bits before position 8 (the factor is 1.0f exactly) and other logits at every
    position past it -- which fail this file's reference (the negative control: kernels without the
    factor, max |dlogit| ~5 here)."""
    from oracles import paths
    from oracles.compare import compare_logits
    from oracles.tolerances import kernel_vs_reference
    from sharpinf.runtime.select import get_backend
    from sharpinf.step.forward import ForwardPass

    keys = {"mistral3.rope.scaling.original_context_length": 8, "mistral3.attention.temperature_scale": 0.5}
    m = load_model(write_synthetic_model(tmp_path / "m3.gguf", "mistral3", "F32", n_layer=1, **keys))
    off = load_model(write_synthetic_model(tmp_path / "m3off.gguf", "mistral3", "F32", n_layer=1,
                                           **{**keys, "mistral3.attention.temperature_scale": 0.0}))
    be, ids = get_backend("emu"), list(range(1, 21))
    for kernels in ("simple", "fast"):
        fp, fp_off = ForwardPass(m, be, kernels=kernels), ForwardPass(off, be, kernels=kernels)
        r = paths.oracle_kernel_vs_reference(fp, ids, "f16", 4)
        assert r.passed, r
        got, untempered = (np.asarray(paths.fresh_runner(f, "f16", 8, 4, 0).prefill_chunks(ids, [6, 1, 9, 1, 3]))
                           for f in (fp, fp_off))
        assert np.array_equal(got[:8], untempered[:8]) and (got[8:] != untempered[8:]).any(axis=1).all()
        act = paths.act_quant_of(fp)
        want = paths.reference_for(m, "f16", act).logits(ids)
        tol = kernel_vs_reference("f16", float(np.abs(want).max()) / 10.0, act, 1, fp.choice.of("attention").rounding)
        assert compare_logits("chunked", kernels, got, want, tol).passed
        assert not compare_logits("untempered", kernels, untempered, want, tol).passed


def test_gemma2_windows_every_other_layer_and_reads_its_softcaps(tmp_path):
    """gemma2 as llama.cpp reads it (llama.cpp agrees: test_llamacpp_agreement's gemma2 file): windows on the
    even layers, the softcaps from the file or llama.cpp's defaults (50, 30), token_embd as the head (a file's
    output.weight refused, naming why). Every kernel path: test_forward_oracles' gemma2 model."""
    c = load_model(write_synthetic_model(tmp_path / "g2.gguf", "gemma2", "F32", n_layer=4)).config
    assert (c.layer_window, c.attn_softcap, c.final_softcap, c.tied_output) == ((16, 0, 16, 0), 50.0, 30.0, True)
    bare = write_synthetic_model(tmp_path / "g2b.gguf", "gemma2", "F32", n_layer=2, sliding_window=0, **{
        "gemma2.attn_logit_softcapping": 20.0})
    m = load_model(bare)
    assert (m.config.layer_window, m.config.attn_softcap) == ((4096, 0), 20.0)
    headed = write_synthetic_model(tmp_path / "g2h.gguf", "gemma2", "F32", n_layer=2, tied=False)
    with pytest.raises(ModelError, match="output.weight .llama.cpp's gemma2 graph reads token_embd.weight as the LM head"):
        load_model(headed)
