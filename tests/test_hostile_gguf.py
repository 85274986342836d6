"""A GGUF whose tensor data ranges lie is refused at load with one ModelError naming the tensor.

Each hostile file is a valid synthetic model with one tensor-info field patched in the header:
before these checks such files loaded and read other tensors' bytes, or the header's, as weights.
"""

from __future__ import annotations

import time
from pathlib import Path

import gguf
import numpy as np
import pytest

from sharpinf.errors import ModelError
from sharpinf.model.loader import load_model
from sharpinf.model.synth import write_synthetic_model

U64 = 2**64


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    return write_synthetic_model(tmp_path_factory.mktemp("good") / "m.gguf", "llama", "Q8_0")


def tensor_infos(path: Path) -> dict[str, dict]:
    """name -> where its header fields live (file positions) and what they say."""
    reader = gguf.GGUFReader(path)
    infos = {}
    for t in reader.tensors:
        parts = t.field.parts  # name_len, name, n_dims, dims, type, offset
        before_offset = sum(int(p.nbytes) for p in parts[:-1])
        before_dims = sum(int(p.nbytes) for p in parts[:3])
        infos[t.name] = dict(
            offset_at=t.field.offset + before_offset,
            dims_at=t.field.offset + before_dims,
            offset=int(parts[-1][0]),
            n_bytes=int(t.n_bytes),
            data_start=reader.data_offset,
        )
    return infos


def patched(src: Path, dst: Path, name: str, *, offset: int | None = None, ne0: int | None = None) -> Path:
    """A copy of src with tensor `name`'s data offset (or first dimension) replaced."""
    info = tensor_infos(src)[name]
    data = bytearray(src.read_bytes())
    if offset is not None:
        data[info["offset_at"]:info["offset_at"] + 8] = (offset % U64).to_bytes(8, "little")
    if ne0 is not None:
        data[info["dims_at"]:info["dims_at"] + 8] = ne0.to_bytes(8, "little")
    dst.write_bytes(bytes(data))
    return dst


def refused(path: Path, *words: str) -> str:
    t0 = time.perf_counter()
    with pytest.raises(ModelError) as info:
        load_model(path)
    assert time.perf_counter() - t0 < 5
    msg = str(info.value)
    assert info.value.path == str(path) and "\n" not in msg
    for w in words:
        assert w.lower() in msg.lower(), (w, msg)
    return msg


def test_the_unpatched_file_loads(good):
    assert load_model(good).config.n_layer == 2


def test_overlapping_tensors_are_refused(tmp_path, good):
    infos = tensor_infos(good)
    a, b = "blk.0.attn_q.weight", "blk.0.attn_k.weight"
    assert infos[a]["offset"] + infos[a]["n_bytes"] == infos[b]["offset"]  # neighbours in the file
    p = patched(good, tmp_path / "overlap.gguf", b, offset=infos[a]["offset"] + 64)
    refused(p, "overlaps", a, b)


def test_two_tensors_sharing_one_range_are_refused(tmp_path, good):
    infos = tensor_infos(good)
    p = patched(good, tmp_path / "alias.gguf", "blk.1.ffn_up.weight", offset=infos["blk.1.ffn_gate.weight"]["offset"])
    refused(p, "overlaps", "blk.1.ffn_up.weight", "blk.1.ffn_gate.weight")


@pytest.mark.parametrize("shift", [1, 4, 16])
def test_misaligned_offset_is_refused(tmp_path, good, shift):
    name = "token_embd.weight"  # first in the data section, offset 0
    p = patched(good, tmp_path / "misaligned.gguf", name, offset=tensor_infos(good)[name]["offset"] + shift)
    refused(p, name, "not a multiple of", "alignment 32")


def realigned(src: Path, dst: Path, alignment: int) -> Path:
    """src rewritten with general.alignment = alignment (its tensors padded to match)."""
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, reader.fields["general.architecture"].contents())
    writer.add_custom_alignment(alignment)
    for key, field in reader.fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), field.types[0], sub)
    for t in reader.tensors:
        writer.add_tensor(t.name, np.ascontiguousarray(t.data), raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def test_alignment_is_the_headers(tmp_path, good):
    """general.alignment = 64: the file loads, and an offset aligned to 32 only is refused."""
    p = realigned(good, tmp_path / "a64.gguf", 64)
    assert load_model(p).config.n_layer == 2
    name = "blk.0.attn_q.weight"
    bad = patched(p, tmp_path / "a64_bad.gguf", name, offset=tensor_infos(p)[name]["offset"] + 32)
    refused(bad, name, "not a multiple of", "alignment 64")


def test_offset_past_the_end_is_refused(tmp_path, good):
    size = good.stat().st_size
    p = patched(good, tmp_path / "past.gguf", "output_norm.weight", offset=size // 32 * 32)
    refused(p, "output_norm.weight", "past the end")


def test_last_tensor_running_off_the_end_is_refused(tmp_path, good):
    info = tensor_infos(good)["output_norm.weight"]
    p = patched(good, tmp_path / "runoff.gguf", "output_norm.weight", offset=info["offset"] + 128)
    refused(p, "output_norm.weight", "truncated", "past the end")


@pytest.mark.parametrize("at", [0, 32, 4096])
def test_wrapping_offset_is_refused(tmp_path, good, at):
    """data_start + offset overflows uint64 and wraps round to byte `at` of the file, in the header."""
    info = tensor_infos(good)["blk.0.attn_v.weight"]
    assert at + info["n_bytes"] < info["data_start"]
    p = patched(good, tmp_path / "wrap.gguf", "blk.0.attn_v.weight", offset=U64 - info["data_start"] + at)
    refused(p, "blk.0.attn_v.weight", "past the end")


def test_huge_offset_is_refused(tmp_path, good):
    p = patched(good, tmp_path / "huge.gguf", "blk.1.attn_norm.weight", offset=U64 - 32)
    refused(p, "blk.1.attn_norm.weight", "past the end")


def test_row_not_a_whole_number_of_blocks_is_refused(tmp_path, good):
    p = patched(good, tmp_path / "rows.gguf", "blk.0.ffn_down.weight", ne0=100)  # Q8_0 blocks hold 32
    refused(p, "blk.0.ffn_down.weight", "100", "Q8_0", "32")


def test_size_from_shape_must_fit_before_the_next_tensor(tmp_path, good):
    """A larger ne0 (still whole blocks) makes the tensor's bytes run into its neighbour's."""
    p = patched(good, tmp_path / "grown.gguf", "blk.0.attn_q.weight", ne0=128)
    refused(p, "overlaps", "blk.0.attn_q.weight", "blk.0.attn_k.weight")


def test_real_model_still_loads(smollm2_path):
    model = load_model(smollm2_path)
    assert model.config.n_layer == 30
    assert np.isfinite(model.tensor("output_norm.weight").dequantize()).all()
