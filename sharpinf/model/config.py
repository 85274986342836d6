"""ModelConfig: the shape of a decoder-only transformer, read from GGUF metadata."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .rope_scaling import RopeScaling

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "gemma3", "qwen3moe", "smollm3", "phi3", "mistral3", "gemma2", "gpt-oss")
# The archs whose files may hold experts: qwen3moe always does; a llama file with llama.expert_count
# > 0 is Mixtral-style (llama's attention, the experts where the dense FFN was).
MOE_ARCHS = ("qwen3moe", "llama", "gpt-oss")

# How llama.cpp rotates each arch. `norm`: pairs (2i, 2i+1) are adjacent, because
# the HF->GGUF converter permuted Q/K rows for llama. `neox`: pairs (i, i + d/2).
ROPE_STYLE = {"llama": "norm", "qwen2": "neox", "qwen3": "neox", "gemma3": "neox", "qwen3moe": "neox",
              "smollm3": "norm", "phi3": "neox", "mistral3": "norm",
              "gemma2": "neox", "gpt-oss": "neox"}

# What the MoE kernels hold per token (moe_route.cu, moe_route_split.cu: the router's probabilities in shared memory, the
# chosen k in registers); llama.cpp's own cap is 512 experts.
MOE_MAX_EXPERTS = 512
MOE_MAX_USED = 32


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
    has_rope_factors: bool = False  # llama: rope_freqs.weight divides every layer's RoPE frequencies (Llama 3.1+)
    nope_layer_step: int = 0  # smollm3: every n-th layer (layer i with (i + 1) % n == 0) has no RoPE (NoPE)
    # phi3's files fuse tensors the graph runs apart: attn_qkv holds Q, K, V's rows; ffn_up the gate's then
    # the up's (the loader gives them as views under the usual names: model/fused.py)
    fused_qkv: bool = False
    fused_gate_up: bool = False
    # LongRoPE (phi3): rope_factors_long/short.weight; llama.cpp takes the long ones when a sequence may run
    # past n_ctx_orig (its n_ctx_seq), the short ones otherwise
    has_longrope: bool = False
    n_ctx_orig: int = 0  # rope.scaling.original_context_length, else context_length
    n_ctx_seq: int = 0  # the context a sequence may reach in this run (the engine's max_model_len); 0: context_length
    # mistral3's attention temperature (llama.cpp's llama-4 scaling): position p's queries times
    # 1 + attn_temp_scale ln(floor(p / n_ctx_orig) + 1) -- exactly 1 before n_ctx_orig (attn_temp_starts)
    attn_temp_scale: float = 0.0
    # Gemma 3 (llama.cpp's gemma3 graph); the defaults are the llama/qwen behaviour.
    layer_window: tuple[int, ...] = ()  # per layer: sliding window W (a query at p sees p-W+1..p), 0 = full
    rope_theta_local: float = 0.0  # RoPE base of the windowed layers (0: rope_theta)
    rope_scaling: RopeScaling = RopeScaling()  # the full-attention layers' scaling (linear or YaRN; model/rope_scaling.py)
    embd_scale: float = 1.0  # the embedding rows are multiplied by this (gemma3: sqrt(n_embd))
    attn_scale: float = 0.0  # scale of q.k (0: 1 / sqrt(head_dim))
    ffn_act: str = "silu"  # the gated activation: "silu" (SwiGLU), "gelu_tanh" (GeGLU), "swiglu_oai" (gpt-oss: clamped)
    post_norms: bool = False  # RMSNorm of the attention and FFN outputs before each residual add
    final_softcap: float = 0.0  # logits = cap * tanh(logits / cap) when > 0
    attn_softcap: float = 0.0  # gemma2: each attention score = cap * tanh(score / cap) before the mask, when > 0
    # Mixture of experts (qwen3moe, Mixtral-style llama): every layer's FFN is n_expert SwiGLU experts of n_ff_exp, of which a
    # router picks n_expert_used per token (softmax over all, top-k, weights renormalised over the k).
    n_expert: int = 0  # 0: a dense model
    n_expert_used: int = 0
    n_ff_exp: int = 0  # one expert's SwiGLU inner size
    # gpt-oss (llama.cpp's openai-moe graph; model/gpt_oss_fields.py): a per-head sink logit in every
    # attention softmax (attn_sinks.weight: in the max and the sum, never a key), the attention output's
    # bias, the router's and the experts' biases, and the router's choice taken on its logits with a
    # softmax over the k chosen ("topk_softmax"; "softmax": over all experts, top-k, renormalised)
    has_attn_sinks: bool = False
    has_attn_out_bias: bool = False
    has_moe_bias: bool = False
    moe_gating: str = "softmax"
    local_rope_scaled: bool = False  # the windowed layers keep the full layers' RoPE scaling (gpt-oss)

    @property
    def is_moe(self) -> bool:
        return self.n_expert > 0

    def window(self, layer: int) -> int:
        """The layer's sliding window (0: it attends to the whole causal context)."""
        return self.layer_window[layer] if self.layer_window else 0

    def rope_for(self, layer: int) -> tuple[float, RopeScaling]:
        """(base, scaling) of the layer's RoPE: windowed layers use the local base unscaled, as
        llama.cpp does for gemma3 (gpt-oss: scaled as the others, its rope.freq_base_swa) (model/rope_scaling.py turns them into the table every path reads)."""
        if self.window(layer) and self.rope_theta_local:
            return self.rope_theta_local, self.rope_scaling if self.local_rope_scaled else RopeScaling()
        return self.rope_theta, self.rope_scaling

    def longrope_factors(self) -> str:
        """Which LongRoPE factor tensor this run reads: "long" past the original context, else "short"."""
        return "long" if (self.n_ctx_seq or self.context_length) > self.n_ctx_orig else "short"

    @property
    def attn_temp_starts(self) -> int:
        """The first position whose queries the attention temperature scales (0: none ever is); the factor
        is 1 exactly before it."""
        return self.n_ctx_orig if self.attn_temp_scale else 0

    def attn_temp(self, positions):
        """The factor on the queries at these positions (attn_temp below)."""
        return attn_temp(positions, self.attn_temp_scale, self.n_ctx_orig)

    def uses_rope(self, layer: int) -> bool:
        """Whether the layer rotates Q and K at all (smollm3's NoPE layers do not)."""
        return not (self.nope_layer_step and (layer + 1) % self.nope_layer_step == 0)

    @property
    def rope_freq_scale(self) -> float:
        """The full-attention layers' frequency scale (1 / rope.scaling.factor)."""
        return self.rope_scaling.freq_scale

    @property
    def kq_scale(self) -> float:
        return self.attn_scale or 1.0 / float(self.head_dim) ** 0.5

    @property
    def all_layers_windowed(self) -> bool:
        """Every layer slides: a position every layer's window has left is never read again."""
        return bool(self.layer_window) and all(w > 0 for w in self.layer_window)

    @property
    def kv_window(self) -> int:
        """How far back any layer reads when every layer is windowed (the largest window), so the KV
        blocks of older positions can be freed; 0 when some layer reads the whole context (gemma3)."""
        return max(self.layer_window) if self.all_layers_windowed else 0

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


def attn_temp(positions, scale: float, n_ctx_orig: int) -> np.ndarray:
    """float32 [len(positions)]: 1 + scale ln(floor(p / n_ctx_orig) + 1), as llama.cpp forms it
    (llm_graph_input_attn_temp: the quotient in float32, the rest in double, stored as float32) and
    kernels_cu/attn_temp.cuh does; exactly 1 where scale is 0."""
    if not scale:
        return np.ones(np.shape(positions), np.float32)
    q = np.floor(np.asarray(positions, dtype=np.float32) / np.float32(n_ctx_orig)).astype(np.float64)
    return (np.log(q + 1.0) * float(np.float32(scale)) + 1.0).astype(np.float32)
