"""What sharpinf runs of a GGUF file, read from the code that runs it (`sharpinf models support`; the
README's table between the markers below, which tests/test_support.py holds to this).

Each row names what holds it to llama.cpp, so the table says what is supported and how we know.
"""

from __future__ import annotations

from pathlib import Path

from sharpinf.doc_tables import rewrite_marked, with_marked
from sharpinf.model import quants
from sharpinf.model.config import MOE_ARCHS, ROPE_STYLE, SUPPORTED_ARCHS
from sharpinf.model.loader import LONGROPE_ARCHS, ROPE_FACTOR_ARCHS
from sharpinf.model.pretokenizers import PRE_TOKENIZERS
from sharpinf.model.rope_scaling import SCALING_KINDS

BEGIN = "<!-- support:begin (generated from the code: sharpinf models support --markdown --write FILE) -->"
END = "<!-- support:end -->"

ARCH_NOTES = {  # what each graph is, beyond llama's (the graph itself: oracles/reference.py)
    "llama": "Llama 2/3/3.1+, SmolLM2, Mistral-style; with llama.expert_count > 0: Mixtral-style experts",
    "qwen2": "QKV bias (Qwen2, Qwen2.5, DeepSeek-R1 distills of Qwen)",
    "qwen3": "QK-norm",
    "gemma3": "sliding windows on 5 layers of 6, local RoPE base, GeGLU, sandwich norms, scaled embeddings",
    "qwen3moe": "a router picks k experts a token (Qwen3-30B-A3B and kin)",
    "smollm3": "llama's graph without RoPE on every 4th layer (SmolLM3)",
    "phi3": "Phi-3/Phi-4: Q, K, V and gate|up fused in the file; LongRoPE's long or short factors by the run's context",
    "gemma2": "Gemma 2: windows on every other layer, the attention scores and the logits softcapped, token_embd "
              "as the head",
    "mistral3": "Mistral 3 / Ministral 3: llama's graph, YaRN with the file's betas and log multiplier; the "
                "queries' temperature_scale from the original context on, in every RoPE kernel",
    "gpt-oss": "llama.cpp's openai-moe graph (gpt-oss-20b, -120b): attention sinks, windows on every other layer, biases, a "
               "biased top-k-softmax router, the clamped SwiGLU, MXFP4 experts",
}
REFUSED = ("every other weight type (IQ1_S to IQ3_S, "
           "TQ1_0, TQ2_0, NVFP4, ...); "
           "any key or tensor the graph would not apply (sharpinf info FILE names it)")


def support_rows() -> list[dict]:
    """(what, supported, held to llama.cpp by) rows, from the tables the loader and tokenizer use."""
    archs = "; ".join(f"`{a}` ({ARCH_NOTES[a]}; RoPE {ROPE_STYLE[a]})" for a in SUPPORTED_ARCHS)
    types = ", ".join(quants.qtype_name(q) for q in quants.SUPPORTED)
    pres = ", ".join(f"`{p}`" for p in sorted(PRE_TOKENIZERS))
    rope = (", ".join(SCALING_KINDS) + " scaling; frequency factors (rope_freqs.weight) in "
            + ", ".join(ROPE_FACTOR_ARCHS) + "; LongRoPE's (rope_factors_long/short.weight) in " + ", ".join(LONGROPE_ARCHS))
    return [
        {"what": "architectures", "supported": archs,
         "checked": "tests/test_llamacpp_agreement.py (qwen3, qwen3moe, Mixtral-style llama, Llama 3.1-style "
                    "llama, qwen3 YaRN, smollm3, phi3, phi3 LongRoPE, mistral3 YaRN + temperature, gemma2 softcaps, "
                    "gpt-oss with F32 and MXFP4 experts), tests/test_gemma3.py, the real SmolLM2 and Gemma 3 files"},
        {"what": "experts", "supported": ", ".join(MOE_ARCHS), "checked": "tests/test_llamacpp_agreement.py"},
        {"what": "weight types", "supported": types,
         "checked": "gguf-py's dequantization (tests/test_quants.py); every matmul path against the reference ("
                    + ", ".join(quants.qtype_name(q) for q in quants.BASE_ONLY) + ": the simple, dp4a and MoE "
                    "baselines; the faster variants hand them to dp4a, the same bits)"},
        {"what": "RoPE", "supported": rope, "checked": "tests/test_llamacpp_agreement.py"},
        {"what": "tokenizers", "supported": f"byte-level BPE (tokenizer.ggml.model gpt2), pre-tokenizers {pres}; "
                                            "SentencePiece BPE (llama); llama.cpp's phi3 rule (no whitespace after a "
                                            "special token in a file named phi-3 or phi3)",
         "checked": "llama-tokenize's ids: tests/test_pretokenizers.py, tests/test_tokenizer.py (phi3's rule: "
                    "bench/llamacpp_rstrip.py's fixture)"},
        {"what": "refused in one line", "supported": REFUSED, "checked": "tests/test_loader.py"},
    ]


def markdown_table() -> str:
    lines = ["| what | supported | held to llama.cpp by |", "| --- | --- | --- |"]
    lines += [f"| {r['what']} | {r['supported']} | {r['checked']} |" for r in support_rows()]
    return "\n".join(lines) + "\n"


def with_table(text: str, where: str = "the text") -> str:
    """text with the table between its markers replaced by the code's."""
    return with_marked(text, BEGIN, END, markdown_table(), where, "support")


def write_table(path: Path) -> bool:
    """Rewrite path's table from the code; whether it changed."""
    return rewrite_marked(path, BEGIN, END, markdown_table(), "support")
