"""ModelConfig: the shape of a decoder-only transformer, read from GGUF metadata."""

from __future__ import annotations

from dataclasses import dataclass

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3")

# How llama.cpp rotates each arch. `norm`: pairs (2i, 2i+1) are adjacent, because
# the HF->GGUF converter permuted Q/K rows for llama. `neox`: pairs (i, i + d/2).
ROPE_STYLE = {"llama": "norm", "qwen2": "neox", "qwen3": "neox"}


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_vocab: int
    n_embd: int  # hidden size
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int  # SwiGLU inner size
    context_length: int
    rms_eps: float
    rope_theta: float
    rope_style: str  # "norm" (adjacent pairs) or "neox" (halves)
    has_qkv_bias: bool  # qwen2
    has_qk_norm: bool  # qwen3
    tied_output: bool  # no output.weight: the LM head is token_embd

    @property
    def q_dim(self) -> int:
        return self.n_head * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_head_kv * self.head_dim

    @property
    def gqa_group(self) -> int:
        """Query heads per KV head: query head h reads KV head h // gqa_group."""
        return self.n_head // self.n_head_kv

    def kv_bytes_per_token(self, bytes_per_element: float = 2.0) -> float:
        """K and V for every layer, for one token (fp16 by default)."""
        return 2 * self.n_layer * self.kv_dim * bytes_per_element
