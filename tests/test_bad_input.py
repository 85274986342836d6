"""Every unusable GGUF ends in one ModelError naming the file and the problem."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharpinf.errors import ModelError
from sharpinf.model.loader import load_model
from sharpinf.model.synth import synthetic_model


def rewrite(src: Path, dst: Path, *, arch: str | None = None, drop_keys=(), set_keys=None,
            drop_tensors=(), add_tensors=None) -> Path:
    """Copy a GGUF through gguf-py's reader and writer, editing metadata and tensors on the way.

    set_keys: key -> (value, GGUFValueType); add_tensors: name -> (raw array, GGMLQuantizationType),
    replacing a tensor of that name in place or appending it.
    """
    reader = gguf.GGUFReader(src)
    old_arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch or old_arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop_keys:
            continue
        if set_keys and key in set_keys:
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), field.types[0], sub)
    for key, (value, vtype) in (set_keys or {}).items():
        writer.add_key_value(key, value, vtype)
    add_tensors = dict(add_tensors or {})
    for t in reader.tensors:
        if t.name in drop_tensors:
            continue
        data, qtype = add_tensors.pop(t.name, (t.data, t.tensor_type))
        writer.add_tensor(t.name, np.ascontiguousarray(data), raw_shape=data.shape, raw_dtype=qtype)
    for name, (data, qtype) in add_tensors.items():
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def expect_error(path: Path, *words: str) -> ModelError:
    with pytest.raises(ModelError) as info:
        load_model(path)
    msg = str(info.value)
    assert str(path) in msg and info.value.path == str(path)
    for w in words:
        assert w.lower() in msg.lower(), (w, msg)
    return info.value


@pytest.fixture(scope="module")
def good() -> Path:
    return synthetic_model("llama", "Q8_0")


def test_good_file_loads(good):
    assert load_model(good).config.n_layer == 2


def test_missing_file(tmp_path):
    expect_error(tmp_path / "nope.gguf", "not found")


def test_directory(tmp_path):
    expect_error(tmp_path, "not a regular file")


def test_empty_file(tmp_path):
    p = tmp_path / "empty.gguf"
    p.write_bytes(b"")
    expect_error(p, "not a GGUF", "magic")


def test_bad_magic(tmp_path, good):
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGML" + good.read_bytes()[4:])
    expect_error(p, "not a GGUF", "magic")


def test_text_file(tmp_path):
    p = tmp_path / "model.safetensors"
    p.write_text('{"not": "a gguf"}')
    expect_error(p, "not a GGUF")


@pytest.mark.parametrize("fraction", [0.0001, 0.002, 0.01, 0.05, 0.3, 0.7, 0.999])
def test_truncated(tmp_path, good, fraction):
    data = good.read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(data[: max(5, int(len(data) * fraction))])
    expect_error(p, "truncated")


def test_truncated_by_one_byte(tmp_path, good):
    p = tmp_path / "cut.gguf"
    p.write_bytes(good.read_bytes()[:-1])
    expect_error(p, "truncated")


def test_unsupported_version(tmp_path, good):
    data = bytearray(good.read_bytes())
    data[4:8] = (99).to_bytes(4, "little")
    p = tmp_path / "v99.gguf"
    p.write_bytes(bytes(data))
    expect_error(p, "corrupt", "version")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pos=st.integers(4, 4000), value=st.integers(0, 255))
def test_corrupt_header_bytes(tmp_path, good, pos, value):
    """Any byte of the header changed: the load succeeds or raises ModelError, nothing else."""
    data = bytearray(good.read_bytes())
    data[pos] = value
    p = tmp_path / "flip.gguf"
    p.write_bytes(bytes(data))
    try:
        load_model(p)
    except ModelError as e:
        assert str(p) in str(e)


def test_unknown_arch(tmp_path, good):
    p = rewrite(good, tmp_path / "gpt2.gguf", arch="gpt2")
    err = expect_error(p, "unknown architecture", "gpt2")
    for arch in ("llama", "qwen2", "qwen3"):
        assert arch in err.problem


def test_unsupported_quant_type(tmp_path, good):
    raw = np.zeros((4, 66), np.uint8)  # 4 rows of one IQ2_XXS block (256 values)
    p = rewrite(good, tmp_path / "iq2.gguf", add_tensors={"blk.0.extra.weight": (raw, gguf.GGMLQuantizationType.IQ2_XXS)})
    err = expect_error(p, "unsupported quant type", "IQ2_XXS", "blk.0.extra.weight")
    assert "supported: F32" in err.problem and "IQ4_XS" in err.problem  # what is supported, named


def test_unsupported_quant_type_of_expected_tensor(tmp_path, good):
    raw = np.zeros((64, 2 * 40), np.uint8)  # (64, 64) in Q8_1: 40 bytes per 32 values
    p = rewrite(good, tmp_path / "q81.gguf",
                add_tensors={"blk.1.attn_q.weight": (raw, gguf.GGMLQuantizationType.Q8_1)})
    expect_error(p, "unsupported quant type", "Q8_1", "blk.1.attn_q.weight")


@pytest.mark.parametrize("name", ["token_embd.weight", "blk.1.ffn_up.weight", "output_norm.weight",
                                  "blk.0.attn_norm.weight"])
def test_missing_tensor(tmp_path, good, name):
    p = rewrite(good, tmp_path / "missing.gguf", drop_tensors=[name])
    expect_error(p, "missing tensor", name)


def test_missing_qwen2_bias(tmp_path):
    p = rewrite(synthetic_model("qwen2", "Q8_0"), tmp_path / "nobias.gguf", drop_tensors=["blk.1.attn_v.bias"])
    expect_error(p, "missing tensor", "blk.1.attn_v.bias")


def test_shape_mismatch(tmp_path, good):
    # attn_q should be (q_dim=64, n_embd=64); give it 96 rows of Q8_0 (68 bytes a row)
    raw = np.zeros((96, 68), np.uint8)
    p = rewrite(good, tmp_path / "shape.gguf", add_tensors={"blk.0.attn_q.weight": (raw, gguf.GGMLQuantizationType.Q8_0)})
    expect_error(p, "blk.0.attn_q.weight", "shape", "(96, 64)", "expected (64, 64)")


def test_qk_norm_shape_mismatch(tmp_path):
    norm = np.ones(32, np.float32)  # head_dim is 16
    p = rewrite(synthetic_model("qwen3", "Q8_0"), tmp_path / "qn.gguf",
                add_tensors={"blk.1.attn_k_norm.weight": (norm, gguf.GGMLQuantizationType.F32)})
    expect_error(p, "blk.1.attn_k_norm.weight", "(32,)", "expected (16,)")


@pytest.mark.parametrize("key", ["llama.block_count", "llama.embedding_length", "llama.context_length",
                                 "llama.feed_forward_length", "llama.attention.head_count",
                                 "llama.attention.layer_norm_rms_epsilon"])
def test_missing_metadata_key(tmp_path, good, key):
    p = rewrite(good, tmp_path / "nokey.gguf", drop_keys=[key])
    expect_error(p, "missing metadata key", key)


def test_missing_vocab_size(tmp_path, good):
    p = rewrite(good, tmp_path / "novocab.gguf", drop_keys=["llama.vocab_size", "tokenizer.ggml.tokens"])
    expect_error(p, "missing metadata key", "llama.vocab_size")


def test_wrong_metadata_type(tmp_path, good):
    p = rewrite(good, tmp_path / "type.gguf",
                set_keys={"llama.block_count": ("two", gguf.GGUFValueType.STRING)})
    expect_error(p, "llama.block_count", "should be int")


def test_vocab_size_disagrees_with_embedding(tmp_path, good):
    p = rewrite(good, tmp_path / "vocab.gguf", set_keys={"llama.vocab_size": (500, gguf.GGUFValueType.UINT32)})
    expect_error(p, "token_embd.weight", "expected (500, 64)")


def test_bad_head_counts(tmp_path, good):
    p = rewrite(good, tmp_path / "heads.gguf",
                set_keys={"llama.attention.head_count_kv": (3, gguf.GGUFValueType.UINT32)})
    expect_error(p, "head_count")


def test_defaults_without_optional_metadata(tmp_path):
    """No rope.freq_base, key_length, vocab_size or head_count_kv: llama.cpp's defaults apply."""
    src = synthetic_model("llama", "Q8_0", rope_theta=500000.0, n_head_kv=4)
    dst = rewrite(src, tmp_path / "m.gguf",
                  drop_keys=["llama.rope.freq_base", "llama.vocab_size", "llama.attention.head_count_kv"])
    c = load_model(dst).config
    assert c.rope_theta == 10000.0 and c.n_vocab == 512 and c.head_dim == 16 and c.n_head_kv == 4


def test_huge_block_count_fails_fast(tmp_path, good):
    p = rewrite(good, tmp_path / "layers.gguf", set_keys={"llama.block_count": (2**31, gguf.GGUFValueType.UINT32)})
    expect_error(p, "missing tensor", "blk.2.attn_norm.weight")


def test_zero_size_metadata(tmp_path, good):
    p = rewrite(good, tmp_path / "zero.gguf", set_keys={"llama.feed_forward_length": (0, gguf.GGUFValueType.UINT32)})
    expect_error(p, "n_ff", "must be positive")
