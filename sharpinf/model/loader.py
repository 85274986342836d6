"""Load a GGUF file: metadata -> ModelConfig, tensors -> QTensor views of the memory map.

Every way a file can be unusable ends in one ModelError naming the file and the problem.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator

import gguf
import numpy as np

from ..errors import ModelError
from . import quants
from .config import MOE_ARCHS, MOE_MAX_EXPERTS, MOE_MAX_USED, ROPE_STYLE, SUPPORTED_ARCHS, ModelConfig
from .rope_scaling import read_rope_scaling
from .keys import KeyUse, TensorUse, key_uses, refusal, tensor_uses
from .fused import FFN_NORM_IN_FILE, unfused
from .gemma_fields import GEMMA_FIELDS
from .gpt_oss_fields import gpt_oss_fields
from .tensors import QTensor, TensorSpan, check_spans

GGUF_MAGIC = b"GGUF"


@dataclass
class LoadedModel:
    path: Path
    config: ModelConfig
    tensors: dict[str, QTensor]
    metadata: dict[str, Any]  # every GGUF KV as plain Python (str/int/float/bool/list)

    def with_context(self, n_ctx_seq: int) -> "LoadedModel":
        """The model as a run whose sequences reach at most n_ctx_seq tokens sees it (LongRoPE's choice;
        the same object for a model without LongRoPE, which no context changes)."""
        if not self.config.has_longrope:
            return self
        return replace(self, config=replace(self.config, n_ctx_seq=n_ctx_seq))

    def tensor(self, name: str) -> QTensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise ModelError(self.path, f"missing tensor {name!r}") from None

    def layer_tensor(self, i: int, short_name: str) -> QTensor:
        """layer_tensor(3, "attn_q.weight") -> blk.3.attn_q.weight"""
        return self.tensor(f"blk.{i}.{short_name}")

    def output_weight(self) -> QTensor:
        """The LM head (n_vocab, n_embd): output.weight, or token_embd.weight when tied."""
        return self.tensor("token_embd.weight" if self.config.tied_output else "output.weight")


@dataclass
class FileReport:
    """What sharpinf would read of a file, before any weight is used: its config, and what it does
    with every metadata key and tensor (model/keys.py). error: why the file cannot load at all."""

    path: Path
    metadata: dict[str, Any]
    tensors: dict[str, QTensor]
    config: ModelConfig | None
    keys: list[KeyUse]
    tensor_uses: list[TensorUse]
    error: str | None = None

    @property
    def refused(self) -> str | None:
        """One line naming every key and tensor sharpinf would not apply (None: none)."""
        return refusal(self.keys, self.tensor_uses)


def inspect_model(path: str | Path) -> FileReport:
    """Read the header and build the config; every key and tensor judged. Raises only for a file that
    is not a readable GGUF; a config that cannot be built is the report's error."""
    path = Path(path)
    reader = _open_reader(path)
    try:
        metadata = _read_metadata(path, reader)
        tensors = _read_tensors(path, reader)
        try:
            config = _build_config(path, metadata, tensors)
            _validate_shapes(path, config, tensors)
        except ModelError as e:
            return FileReport(path, metadata, tensors, None, [], [], e.problem)
        expected = expected_shapes(config)
        return FileReport(path, metadata, tensors, config, key_uses(config.arch, metadata, config),
                          tensor_uses(tensors, expected, config.arch))
    except ModelError:
        raise
    except Exception as e:  # a header the reader accepted but that makes no sense (e.g. a 0-dim tensor)
        raise ModelError(path, f"corrupt GGUF: {type(e).__name__}: {e}") from None


def load_model(path: str | Path) -> LoadedModel:
    """The model, or one ModelError: an unreadable file, or a key or tensor sharpinf would not apply
    (nothing in a file is silently ignored: `sharpinf info FILE` lists what it reads and refuses)."""
    r = inspect_model(path)
    if r.error is not None:
        raise ModelError(r.path, r.error)
    why = r.refused
    if why:
        raise ModelError(r.path, f"{why} (`sharpinf info {r.path.name}` lists every key and tensor)")
    return LoadedModel(path=r.path, config=r.config, tensors=unfused(r.config, r.tensors), metadata=r.metadata)


# ---------------------------------------------------------------- file and reader

def _open_reader(path: Path) -> gguf.GGUFReader:
    if not path.exists():
        raise ModelError(path, "file not found")
    if not path.is_file():
        raise ModelError(path, "not a regular file")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelError(path, f"cannot read file: {e.strerror or e}") from None
    if magic != GGUF_MAGIC:
        raise ModelError(path, f"not a GGUF file (bad magic {magic!r}, expected {GGUF_MAGIC!r})")
    try:
        return _CheckedReader(path)
    except ModelError:
        raise
    except Exception as e:  # the reader raises anything from ValueError to IndexError on bad bytes
        raise ModelError(path, f"truncated or corrupt GGUF: {type(e).__name__}: {e}") from None


class _CheckedReader(gguf.GGUFReader):
    """gguf-py's reader, with every tensor's byte range checked before any is mapped."""

    def __init__(self, path: Path):
        self._path = path
        super().__init__(path, "r")

    def _build_fields(self, *args, **kwargs):  # (offs, count) in gguf-py 0.19: passed through as they come
        # gguf-py reads each metadata value as a slice of self.data, a np.memmap, and every memmap
        # slice runs memmap.__array_finalize__: a 262k-token vocabulary is a million slices (Gemma 3
        # 270M: 18 s a load, SmolLM2's 49k: 4.6 s). The same bytes through a plain ndarray view.
        mapped, self.data = self.data, self.data.view(np.ndarray)
        try:
            return super()._build_fields(*args, **kwargs)
        finally:
            self.data = mapped

    def _build_tensors(self, start_offs: int, fields: list) -> None:
        # gguf-py's tensor-info parts: name_len, name, n_dims, dims, type, offset
        spans = [TensorSpan(f.name, int(f.parts[4][0]), tuple(int(d) for d in f.parts[3]), int(f.parts[5][0]))
                 for f in fields]
        check_spans(self._path, spans, start_offs, self.data.shape[0], int(self.alignment))
        super()._build_tensors(start_offs, fields)


def _plain(field) -> Any:
    """A GGUF ReaderField's value as plain Python (numpy scalars -> int/float/bool)."""
    value = field.contents()
    if isinstance(value, list):
        return [v.item() if isinstance(v, np.generic) else v for v in value]
    return value.item() if isinstance(value, np.generic) else value


def _read_metadata(path: Path, reader) -> dict[str, Any]:
    # skip the reader's own header pseudo-fields (GGUF.version, GGUF.tensor_count, ...)
    return {key: _plain(field) for key, field in reader.fields.items() if not key.startswith("GGUF.")}


def _read_tensors(path: Path, reader) -> dict[str, QTensor]:
    # Byte ranges were checked as the reader was built (_CheckedReader): inside the file, aligned, apart.
    tensors: dict[str, QTensor] = {}
    for t in reader.tensors:
        qtype = int(t.tensor_type)
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # GGUF ne -> numpy order
        if qtype not in quants.SUPPORTED:
            raise ModelError(path, f"unsupported quant type {quants.qtype_name(qtype)} in tensor {t.name!r} "
                                   f"({quants.why_unsupported(qtype)})")
        rb = quants.row_bytes(qtype, shape[-1])
        end = t.data_offset + rb * math.prod(shape[:-1])
        raw = reader.data[t.data_offset:end].reshape(-1, rb)  # (rows, row_bytes), read-only memmap view
        tensors[t.name] = QTensor(name=t.name, qtype=qtype, shape=shape, raw=raw)
    return tensors


# ---------------------------------------------------------------- config

def _get(path: Path, meta: dict[str, Any], key: str, kind: type, default: Any = None) -> Any:
    if key not in meta:
        if default is not None:
            return default
        raise ModelError(path, f"missing metadata key {key!r}")
    value = meta[key]
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) if kind is float else (
        isinstance(value, kind) and not isinstance(value, bool))
    if not ok:
        raise ModelError(path, f"metadata key {key!r} should be {kind.__name__}, got {value!r:.80}")
    return kind(value)


def _build_config(path: Path, meta: dict[str, Any], tensors: dict[str, QTensor]) -> ModelConfig:
    arch = _get(path, meta, "general.architecture", str)
    if arch not in SUPPORTED_ARCHS:
        raise ModelError(path, f"unknown architecture {arch!r} (supported: {', '.join(SUPPORTED_ARCHS)})")

    def key(name: str, kind: type, default: Any = None) -> Any:
        return _get(path, meta, f"{arch}.{name}", kind, default)

    n_expert = key("expert_count", int, 0)
    if n_expert and arch not in MOE_ARCHS:  # decline it before any tensor is missed
        raise ModelError(path, f"{arch}-arch mixture of experts is not supported ({arch}.expert_count = {n_expert}):"
                               f" the MoE archs read are {', '.join(MOE_ARCHS)}")
    n_embd = key("embedding_length", int)
    n_head = key("attention.head_count", int)
    n_head_kv = key("attention.head_count_kv", int, n_head)  # llama.cpp: absent means no GQA
    if n_head <= 0 or n_head_kv <= 0 or n_head % n_head_kv:
        raise ModelError(path, f"bad head counts: head_count={n_head}, head_count_kv={n_head_kv}")
    if f"{arch}.vocab_size" in meta:
        n_vocab = key("vocab_size", int)
    elif isinstance(meta.get("tokenizer.ggml.tokens"), list):
        n_vocab = len(meta["tokenizer.ggml.tokens"])
    else:
        raise ModelError(path, f"missing metadata key '{arch}.vocab_size' (and no tokenizer.ggml.tokens)")
    head_dim = key("attention.key_length", int, n_embd // n_head)
    n_layer = key("block_count", int)
    moe = _moe_fields(path, meta, arch) if arch in ("qwen3moe", "gpt-oss") or n_expert else {}
    config = ModelConfig(
        arch=arch,
        n_vocab=n_vocab,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        # qwen3moe: the dense FFN size is unused (every layer is MoE); llama.cpp reads it optionally
        n_ff=key("feed_forward_length", int, moe.get("n_ff_exp")),
        context_length=key("context_length", int),
        rms_eps=key("attention.layer_norm_rms_epsilon", float),
        rope_theta=key("rope.freq_base", float, 10000.0),
        rope_style=ROPE_STYLE[arch],
        has_qkv_bias="blk.0.attn_q.bias" in tensors,
        has_qk_norm="blk.0.attn_q_norm.weight" in tensors,
        tied_output=arch in TIED_ARCHS or ("output.weight" not in tensors and arch not in UNTIED_ARCHS),
        rope_scaling=read_rope_scaling(path, meta, arch, key("context_length", int), _get),
        has_rope_factors=arch in ROPE_FACTOR_ARCHS and "rope_freqs.weight" in tensors,
        nope_layer_step=SMOLLM3_NOPE_STEP if arch == "smollm3" else 0,
        fused_qkv="blk.0.attn_qkv.weight" in tensors,
        fused_gate_up=arch == "phi3",
        has_longrope=arch in LONGROPE_ARCHS and "rope_factors_long.weight" in tensors,
        n_ctx_orig=key("rope.scaling.original_context_length", int, 0) or key("context_length", int),
        attn_temp_scale=key("attention.temperature_scale", float, 0.0) if arch == "mistral3" else 0.0,
        **(ARCH_FIELDS[arch](_get, path, meta, arch, n_layer, len(tensors), n_embd, n_head, head_dim)
           if arch in ARCH_FIELDS else {}),
        **moe,
    )
    for field in ("n_vocab", "n_embd", "n_layer", "head_dim", "n_ff", "context_length"):
        if getattr(config, field) <= 0:
            raise ModelError(path, f"bad metadata: {field} = {getattr(config, field)} (must be positive)")
    return config


def _moe_fields(path: Path, meta: dict[str, Any], arch: str) -> dict[str, Any]:
    """The experts as llama.cpp reads them: expert_count and expert_used_count (both required, > 0);
    the expert FFN's length, for qwen3moe (src/models/qwen3moe.cpp) expert_feed_forward_length (else
    n_ff / n_expert_used), for a Mixtral-style llama file (src/models/llama.cpp) feed_forward_length
    itself (its expert tensors are made with n_ff). Both graphs renormalise the top-k weights
    (build_moe_ffn's norm_w = true) and read no weight scale, so no key says either."""
    n_expert = _get(path, meta, f"{arch}.expert_count", int)
    n_used = _get(path, meta, f"{arch}.expert_used_count", int)
    if not 0 < n_expert <= MOE_MAX_EXPERTS:
        raise ModelError(path, f"bad metadata: expert_count = {n_expert} (must be 1..{MOE_MAX_EXPERTS})")
    if not 0 < n_used <= min(n_expert, MOE_MAX_USED):
        raise ModelError(path, f"bad metadata: expert_used_count = {n_used} (must be 1..{min(n_expert, MOE_MAX_USED)}"
                               f" with expert_count = {n_expert})")
    if arch == "gpt-oss":  # required there (get_key_or_arr without a default)
        n_ff_exp = _get(path, meta, f"{arch}.expert_feed_forward_length", int)
    else:
        n_ff_exp = _get(path, meta, f"{arch}.expert_feed_forward_length", int, 0) if arch == "qwen3moe" else \
            _get(path, meta, f"{arch}.feed_forward_length", int)
    if not n_ff_exp:
        n_ff_exp = _get(path, meta, f"{arch}.feed_forward_length", int) // n_used
    if n_ff_exp <= 0:
        raise ModelError(path, f"bad metadata: expert_feed_forward_length = {n_ff_exp} (must be positive)")
    return dict(n_expert=n_expert, n_expert_used=n_used, n_ff_exp=n_ff_exp)


SMOLLM3_NOPE_STEP = 4  # llama.cpp hard-codes it (src/models/smollm3.cpp): layers 3, 7, 11, ... have no RoPE
TIED_ARCHS = ("gemma2",)  # llama.cpp's graph reads token_embd as the LM head, whatever the file holds
UNTIED_ARCHS = ("gpt-oss",)  # and these need output.weight (no fallback to token_embd)
ARCH_FIELDS = {**GEMMA_FIELDS, "gpt-oss": gpt_oss_fields}
ROPE_FACTOR_ARCHS = ("llama", "mistral3")  # the graphs of llama.cpp (src/models/*.cpp) that read rope_freqs.weight
LONGROPE_ARCHS = ("phi3",)  # the graphs that read rope_factors_long/short.weight


# ---------------------------------------------------------------- shape validation

def expected_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the config implies, name -> numpy-order shape."""
    return dict(_iter_expected(c))


def _iter_expected(c: ModelConfig) -> Iterator[tuple[str, tuple[int, ...]]]:
    # A generator, so a corrupt block_count of 2**31 fails at the first missing layer
    # instead of building billions of names.
    yield "token_embd.weight", (c.n_vocab, c.n_embd)
    if c.has_rope_factors:  # Llama 3.1+: one [head_dim / 2] table of frequency divisors for every layer
        yield "rope_freqs.weight", (c.head_dim // 2,)
    if c.has_longrope:  # phi3: LongRoPE's two tables, the run's context picks one
        yield "rope_factors_long.weight", (c.head_dim // 2,)
        yield "rope_factors_short.weight", (c.head_dim // 2,)
    for i in range(c.n_layer):
        b = f"blk.{i}."
        yield b + "attn_norm.weight", (c.n_embd,)
        if c.fused_qkv:  # phi3: one matrix, Q's rows then K's then V's
            yield b + "attn_qkv.weight", (c.q_dim + 2 * c.kv_dim, c.n_embd)
        else:
            yield b + "attn_q.weight", (c.q_dim, c.n_embd)
            yield b + "attn_k.weight", (c.kv_dim, c.n_embd)
            yield b + "attn_v.weight", (c.kv_dim, c.n_embd)
        if c.has_qkv_bias:
            yield b + "attn_q.bias", (c.q_dim,)
            yield b + "attn_k.bias", (c.kv_dim,)
            yield b + "attn_v.bias", (c.kv_dim,)
        if c.has_qk_norm:
            yield b + "attn_q_norm.weight", (c.head_dim,)
            yield b + "attn_k_norm.weight", (c.head_dim,)
        yield b + "attn_output.weight", (c.n_embd, c.q_dim)
        if c.has_attn_out_bias:
            yield b + "attn_output.bias", (c.n_embd,)
        if c.has_attn_sinks:  # gpt-oss: one logit a query head
            yield b + "attn_sinks.weight", (c.n_head,)
        if c.post_norms:
            yield b + "post_attention_norm.weight", (c.n_embd,)
        yield b + FFN_NORM_IN_FILE.get(c.arch, "ffn_norm.weight"), (c.n_embd,)
        if c.is_moe:  # router [n_expert, n_embd]; experts stacked on the first axis (GGUF ne reversed)
            yield b + "ffn_gate_inp.weight", (c.n_expert, c.n_embd)
            yield b + "ffn_gate_exps.weight", (c.n_expert, c.n_ff_exp, c.n_embd)
            yield b + "ffn_up_exps.weight", (c.n_expert, c.n_ff_exp, c.n_embd)
            yield b + "ffn_down_exps.weight", (c.n_expert, c.n_embd, c.n_ff_exp)
            if c.has_moe_bias:  # gpt-oss: the router's, and each expert's gate, up and down
                yield b + "ffn_gate_inp.bias", (c.n_expert,)
                yield b + "ffn_gate_exps.bias", (c.n_expert, c.n_ff_exp)
                yield b + "ffn_up_exps.bias", (c.n_expert, c.n_ff_exp)
                yield b + "ffn_down_exps.bias", (c.n_expert, c.n_embd)
        else:
            if c.fused_gate_up:  # phi3: the gate's rows then the up's, in ffn_up
                yield b + "ffn_up.weight", (2 * c.n_ff, c.n_embd)
            else:
                yield b + "ffn_gate.weight", (c.n_ff, c.n_embd)
                yield b + "ffn_up.weight", (c.n_ff, c.n_embd)
            yield b + "ffn_down.weight", (c.n_embd, c.n_ff)
        if c.post_norms:
            yield b + "post_ffw_norm.weight", (c.n_embd,)
    yield "output_norm.weight", (c.n_embd,)
    if not c.tied_output:
        yield "output.weight", (c.n_vocab, c.n_embd)


def _validate_shapes(path: Path, config: ModelConfig, tensors: dict[str, QTensor]) -> None:
    for name, want in _iter_expected(config):
        if name not in tensors:
            raise ModelError(path, f"missing tensor {name!r}")
        got = tensors[name].shape
        if got != want:
            raise ModelError(path, f"tensor {name!r} has shape {got}, expected {want}")
