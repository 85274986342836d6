"""What sharpinf does with each metadata key and tensor of a GGUF file: nothing is silently ignored.

Every key is one of
  applied   read into the ModelConfig (or the tokenizer) and applied by every path;
  checked   read and held to the one value sharpinf runs (e.g. rope.dimension_count = head_dim: a
            partial rotary would be another graph) -- any other value is refused;
  inert     read by nothing in the graph, here or in llama.cpp's graph for the arch (general.*, a file's
            provenance; a tokenizer's fill-in-the-middle ids) -- listed, with why;
  refused   none of the above: the load fails naming it.
and every tensor is used (the arch's graph reads it) or refused. `sharpinf info FILE` lists them all
before any weight loads (`file_report`); `load_model` raises on the first refused one, naming all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

# {arch}.KEY applied by every arch (model/loader.py reads them into ModelConfig)
APPLIED = {
    "vocab_size", "context_length", "embedding_length", "block_count", "feed_forward_length",
    "attention.head_count", "attention.head_count_kv", "attention.key_length",
    "attention.layer_norm_rms_epsilon", "rope.freq_base",
    "rope.scaling.type", "rope.scaling.factor", "rope.scale_linear", "rope.scaling.attn_factor",
    "rope.scaling.original_context_length",  # YaRN's correction dims (model/rope_scaling.py); unused by linear
}
# ... and by some archs only
APPLIED_BY_ARCH = {
    "gemma3": {"attention.sliding_window", "final_logit_softcapping"},
    "gemma2": {"attention.sliding_window", "attn_logit_softcapping", "final_logit_softcapping"},
    "qwen3moe": {"expert_count", "expert_used_count", "expert_feed_forward_length"},
    "llama": {"expert_count", "expert_used_count"},  # Mixtral-style: the experts where the dense FFN was
    # llama's graph with YaRN's own betas and log multiplier and the queries' temperature (src/models/mistral3.cpp)
    # src/models/openai-moe.cpp: windows on a pattern of layers, their own RoPE base, the experts' length
    "gpt-oss": {"expert_count", "expert_used_count", "expert_feed_forward_length", "attention.sliding_window",
                "attention.sliding_window_pattern", "rope.freq_base_swa"},
    "mistral3": {"attention.temperature_scale", "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow",
                 "rope.scaling.yarn_log_multiplier"},
}


def _eq(want) -> Callable[[Any, Any], str | None]:
    def check(value, cfg) -> str | None:
        w = want(cfg) if callable(want) else want
        return None if value == w else f"sharpinf runs {w!r}"
    return check


# {arch}.KEY held to the value sharpinf's graph has (cfg: the ModelConfig the applied keys made)
CHECKED: dict[str, Callable[[Any, Any], str | None]] = {
    "rope.dimension_count": _eq(lambda cfg: cfg.head_dim),  # RoPE over the whole head (no partial rotary)
    "attention.value_length": _eq(lambda cfg: cfg.head_dim),  # V heads as wide as K's
    "attention.causal": _eq(True),
    "logit_scale": _eq(1.0),
    "embedding_scale": _eq(1.0),
    "residual_scale": _eq(1.0),
    "attention.clamp_kqv": _eq(0.0),
    "expert_weights_scale": _eq(1.0),
    "expert_shared_count": _eq(0),
    "leading_dense_block_count": _eq(0),
    "rope.scaling.yarn_log_multiplier": _eq(0.0),
}
# {arch}.KEY the graph does not read, and why it may be left unread
INERT = {
    "rope.scaling.finetuned": "whether the scaled RoPE was fine-tuned: llama.cpp reads it, no graph uses it",
    "expert_weights_norm": "the top-k weights' renormalisation, which both MoE graphs do anyway",
    "expert_gating_func": "softmax over the experts, both MoE graphs' (llama.cpp's default for them)",
}
# ... and by some archs only, as llama.cpp's graph for the arch leaves them unread
INERT_BY_ARCH = {
    "phi3": {"attention.sliding_window": "llama.cpp's phi3 graph turns sliding windows off (src/models/phi3.cpp)"},
    "gpt-oss": {"expert_gating_func": "llama.cpp's openai-moe graph takes the top k on the router's logits and a "
                                      "softmax over them, whatever the file says",
                "expert_weights_norm": "the openai-moe graph never renormalises its weights (the softmax is over the "
                                       "chosen k)"},
}
# tokenizer.* keys the tokenizer applies (model/tokenizer.py, tokenizer_spm.py)
TOKENIZER_APPLIED = {
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
    "tokenizer.ggml.scores", "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.eom_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
    "tokenizer.ggml.add_space_prefix", "tokenizer.chat_template",
}
TOKENIZER_CHECKED: dict[str, Callable[[Any, Any], str | None]] = {
    "tokenizer.ggml.remove_extra_whitespaces": _eq(False),  # a T5-style normaliser llama.cpp's BPE/SPM never run
    "tokenizer.ggml.add_sep_token": _eq(False),
}
TOKENIZER_INERT_PREFIXES = {
    "tokenizer.ggml.fim_": "fill-in-the-middle ids: infill prompts only, which sharpinf does not build",
    "tokenizer.ggml.seperator_token_id": "the separator of embedding pairs (llama.cpp's spelling)",
    "tokenizer.ggml.mask_token_id": "the mask of masked-LM vocabularies: never generated or parsed",
    "tokenizer.chat_template.": "a named alternative chat template (tool use, RAG): the default one is applied",
    "tokenizer.huggingface.json": "the HF tokenizer.json copy: the ggml fields above are what both read",
}
INERT_PREFIXES = {
    "general.": "the file's provenance (name, license, quantization, ...): nothing in the graph",
    "quantize.": "how the file was quantized (imatrix datasets and counts)",
}


@dataclass(frozen=True)
class KeyUse:
    key: str
    value: Any
    use: str  # "applied", "checked", "inert" or "refused"
    why: str = ""


def _shown(v: Any) -> str:
    if isinstance(v, list):
        return f"[{len(v)} items]"
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def key_use(arch: str, key: str, value: Any, cfg) -> KeyUse:
    """What sharpinf does with one metadata key of an `arch` file whose applied keys made `cfg`."""
    if key.startswith("split."):
        if key == "split.count" and value not in (0, 1):
            return KeyUse(key, value, "refused", f"a GGUF split into {value} files: join them first "
                                                 "(llama-gguf-split --merge)")
        return KeyUse(key, value, "inert", "one piece of a split file, and it is the whole")
    for prefix, why in INERT_PREFIXES.items():
        if key.startswith(prefix):
            return KeyUse(key, value, "inert", why)
    if key.startswith("tokenizer."):
        if key in TOKENIZER_APPLIED:
            return KeyUse(key, value, "applied", "the tokenizer")
        if key in TOKENIZER_CHECKED:
            bad = TOKENIZER_CHECKED[key](value, cfg)
            return KeyUse(key, value, "refused" if bad else "checked", bad or "the tokenizer's default")
        for prefix, why in TOKENIZER_INERT_PREFIXES.items():
            if key.startswith(prefix):
                return KeyUse(key, value, "inert", why)
        return KeyUse(key, value, "refused", "a tokenizer setting sharpinf does not apply")
    if not key.startswith(arch + "."):
        return KeyUse(key, value, "refused", f"not a key of the {arch} graph (nor general.*, tokenizer.*)")
    name = key[len(arch) + 1:]
    if name in APPLIED or name in APPLIED_BY_ARCH.get(arch, ()):
        return KeyUse(key, value, "applied", "ModelConfig")
    if name in CHECKED:
        bad = CHECKED[name](value, cfg)
        return KeyUse(key, value, "refused" if bad else "checked", bad or "the value sharpinf runs")
    if name in INERT_BY_ARCH.get(arch, {}):  # first: an arch's own reason
        return KeyUse(key, value, "inert", INERT_BY_ARCH[arch][name])
    if name in INERT:
        return KeyUse(key, value, "inert", INERT[name])
    return KeyUse(key, value, "refused", f"the {arch} graph sharpinf runs does not read it")


def key_uses(arch: str, meta: dict[str, Any], cfg) -> list[KeyUse]:
    return [key_use(arch, k, v, cfg) for k, v in meta.items()]


@dataclass(frozen=True)
class TensorUse:
    name: str
    shape: tuple[int, ...]
    qtype: str
    use: str  # "used" or "refused"
    why: str = ""


def tensor_uses(tensors: dict, expected: dict[str, tuple[int, ...]], arch: str) -> list[TensorUse]:
    """Each tensor of the file: read by the arch's graph (in `expected`), or refused."""
    out = []
    for name, t in tensors.items():
        if name in expected:
            out.append(TensorUse(name, t.shape, t.qtype_name, "used"))
        else:
            out.append(TensorUse(name, t.shape, t.qtype_name, "refused", _why_tensor(name, arch)))
    return out


KNOWN_TENSORS = {  # what llama.cpp does with tensors sharpinf's graphs do not read (the refusal says it)
    "rope_freqs.weight": "RoPE frequency factors, which llama.cpp's graph for this arch does not read",
    "rope_factors_long.weight": "LongRoPE's long-context factors, which only llama.cpp's phi3 graph reads (and it "
                                "needs both tables)",
    "rope_factors_short.weight": "LongRoPE's short-context factors, which only llama.cpp's phi3 graph reads (and it "
                                 "needs both tables)",
}


def _why_tensor(name: str, arch: str) -> str:
    if name == "output.weight":  # an arch whose head is always token_embd (loader.TIED_ARCHS)
        return f"llama.cpp's {arch} graph reads token_embd.weight as the LM head, never this one"
    return KNOWN_TENSORS.get(name.split(".", 2)[-1] if name.startswith("blk.") else name,
                             f"not read by sharpinf's {arch} graph")


def refusal(keys: list[KeyUse], tensors: list[TensorUse]) -> str | None:
    """One line naming everything the load refuses (None: nothing)."""
    parts = [f"metadata key {u.key} = {_shown(u.value)} ({u.why})" for u in keys if u.use == "refused"]
    bad_t = [t for t in tensors if t.use == "refused"]
    if bad_t:
        first = bad_t[0]
        more = f" and {len(bad_t) - 1} more tensors not read" if len(bad_t) > 1 else ""
        parts.append(f"tensor {first.name} ({first.why}){more}")
    if not parts:
        return None
    return "sharpinf would not apply " + "; ".join(parts[:4]) + (f"; and {len(parts) - 4} more" if len(parts) > 4 else "")
