"""The command line on a synthetic model: JSON outputs, and one clear line for bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sharpinf.model.synth import synthetic_model


def run(*args, ok=True):
    proc = subprocess.run([sys.executable, "-m", "sharpinf", *map(str, args)], capture_output=True, text=True, timeout=600)
    if ok:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def model():
    return synthetic_model("qwen2", "Q4_1", n_embd=128)


def test_info_json_lists_tensor_types_and_kv_bytes(model):
    facts = json.loads(run("info", model, "--json").stdout)
    assert facts["config"]["arch"] == "qwen2" and facts["config"]["has_qkv_bias"]
    assert set(facts["tensor_types"]) == {"Q4_1", "F32"}
    assert facts["kv_bytes_per_token"]["fp16"] == 2 * 2 * facts["config"]["n_layer"] * facts["config"]["n_head_kv"] * facts["config"]["head_dim"]


def test_info_shows_the_experts_of_an_moe_model():
    facts = json.loads(run("info", synthetic_model("qwen3moe", "Q8_0"), "--json").stdout)
    e, c = facts["experts"], facts["config"]
    assert (e["n_expert"], e["n_expert_used"], e["n_ff_exp"], e["params_per_expert"]) == (8, 2, 128, 3 * 64 * 128)
    # a token runs through 2 of the 8 experts of each of the 2 layers: 2 x 6 experts' parameters idle
    assert e["active_params"] == facts["n_params"] - 2 * 6 * 3 * 64 * 128 and c["n_expert"] == 8


def test_tokenize_json_round_trips(model):
    out = json.loads(run("tokenize", model, "hello <|im_start|>world 123", "--json").stdout)
    assert "".join(out["pieces"]) == "hello <|im_start|>world 123"
    assert 1 in out["token_ids"]  # <|im_start|> parsed as the special token


def test_generate_reference_and_emu_agree(model):
    ref = json.loads(run("generate", model, "--prompt-ids", "5,6,7,8", "--max-tokens", "6", "--backend", "reference", "--json").stdout)
    emu = json.loads(run("generate", model, "--prompt-ids", "5,6,7,8", "--max-tokens", "6", "--backend", "emu", "--json").stdout)
    assert ref["prompt_ids"] == [5, 6, 7, 8] and len(ref["token_ids"]) <= 6
    assert set(ref) >= {"prompt_ids", "token_ids", "text", "finish_reason"}
    assert emu["token_ids"] == ref["token_ids"]


def test_score_json(model):
    out = json.loads(run("score", model, "--prompt-ids", "5,6,7,8,9", "--top-k", "3", "--backend", "reference", "--json").stdout)
    assert len(out["top_ids"]) == 5 and len(out["top_ids"][0]) == 3
    assert len(out["next_token_logprob"]) == 4 and all(lp <= 0 for lp in out["next_token_logprob"])
    assert out["perplexity"] > 1
    # the CLI's emu path (the kernel sets' logits against the reference: test_forward_oracles); the fast
    # kernels read q8_1 activations: the same winners, ranks 2-3 may swap at a near-tie
    fast = json.loads(run("score", model, "--prompt-ids", "5,6,7,8,9", "--top-k", "3", "--backend", "emu",
                          "--kernels", "fast", "--json").stdout)
    assert [t[0] for t in fast["top_ids"]] == [t[0] for t in out["top_ids"]]


def test_verify_reference_passes_with_json(model):
    rows = json.loads(run("verify", model, "--backend", "reference", "--json").stdout)
    assert rows and all(r["passed"] for r in rows)
    assert {r["oracle"] for r in rows} >= {"reference-vs-naive", "incremental-vs-full", "tokenizer-roundtrip"}
    moe = {r["oracle"] for r in rows if r["case"].startswith("synthetic qwen3moe/")}  # the foundation's MoE model
    assert moe == {"reference-vs-naive", "incremental-vs-full"}


@pytest.mark.parametrize("args,needle", [
    (["info", "/no/such/file.gguf"], "neither a registered model"),
    (["info", __file__], "GGUF"),
    (["generate", "{model}", "--prompt-ids", "1,x"], "comma-separated"),
    (["generate", "{model}", "--prompt", "a", "--chat", "b"], "exactly one"),
    (["generate", "{model}", "--prompt-ids", "1,2", "--temperature", "-1"], "temperature"),
    (["generate", "{model}", "--prompt-ids", "1,2", "--backend", "nope"], "backend"),
    (["generate", "{model}", "--prompt-ids", "1,2", "--kernels", "matmul=fastest"], "unknown matmul variant"),
    (["verify", "{model}", "--kernels", "attention"], "is not op=variant"),
    (["bench", "{model}", "--kernels", "softmax=split"], "unknown op(s) softmax"),
    (["bench", "qwen3-8b-shape:Q4_X", "--dry-run"], "unsupported quant type 'Q4_X'"),
    (["bench", "qwen3-30b-a3b-shape:Q4_K", "--suite", "kernels", "--op", "link", "--dry-run"], "has no such layer"),
    (["bench", "{model}", "--suite", "kernels", "--prefill-sizes", "0", "--dry-run"], "--prefill-sizes must be"),
    (["bench", "smollm2-135m-shape:Q4_K", "--dry-run"], "rows need a multiple of 256 values, got 576"),
    (["bench", "qwen3-8b-shape:Q4_K", "--suite", "kernels", "--context", "40960", "--dry-run"], "does not fit"),
    (["models", "pull", "no-such-model"], "unknown model"),
])
def test_bad_input_gives_one_clear_line_and_nonzero_exit(model, args, needle):
    proc = run(*[a.replace("{model}", str(model)) for a in args], ok=False)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert needle.lower() in proc.stderr.lower()
    assert len([l for l in proc.stderr.splitlines() if l.strip()]) <= 3


def test_models_synth_qwen3moe_then_generate(tmp_path):
    """`models synth --arch qwen3moe` with its expert options: `info` shows them, and the emulator's
    greedy tokens (the fast moe kernels) are the reference's; `--arch llama --experts N` too."""
    path = tmp_path / "m.gguf"
    run("models", "synth", path, "--arch", "qwen3moe", "--experts", "4", "--experts-used", "3")
    facts = json.loads(run("info", path, "--json").stdout)
    assert facts["config"]["arch"] == "qwen3moe" and (facts["experts"]["n_expert"],
                                                       facts["experts"]["n_expert_used"]) == (4, 3)
    ids = "5,6,7,8,9,10,11"
    ref = json.loads(run("generate", path, "--prompt-ids", ids, "--max-tokens", "4", "--backend", "reference",
                         "--json").stdout)
    emu = json.loads(run("generate", path, "--prompt-ids", ids, "--max-tokens", "4", "--backend", "emu",
                         "--kernels", "fast", "--json").stdout)
    assert emu["token_ids"] == ref["token_ids"] and len(ref["token_ids"]) == 4
    # llama with --experts: Mixtral-style (its oracles: test_forward_oracles.py's MoE cross-path cases)
    run("models", "synth", path, "--arch", "llama", "--experts", "4")
    facts = json.loads(run("info", path, "--json").stdout)
    assert facts["config"]["arch"] == "llama" and facts["experts"]["n_expert"] == 4


def test_models_synth_gemma3_then_generate_past_its_window(tmp_path):
    """`models synth --arch gemma3`: a SentencePiece vocabulary, windows on 5 layers of 6; a prompt
    longer than the window gives the reference's tokens on the emulator."""
    path = tmp_path / "g.gguf"
    run("models", "synth", path, "--arch", "gemma3", "--layers", "6")
    facts = json.loads(run("info", path, "--json").stdout)
    assert facts["config"]["arch"] == "gemma3" and facts["config"]["layer_window"] == [16] * 5 + [0]
    tok = json.loads(run("tokenize", path, "<start_of_turn>user hello world", "--json").stdout)
    assert tok["token_ids"][:2] == [2, 4]  # <bos>, then <start_of_turn> as one special token
    ids = ",".join(str(5 + i % 200) for i in range(30))  # 30 tokens: past the 16-key window
    ref = json.loads(run("generate", path, "--prompt-ids", ids, "--max-tokens", "5", "--backend", "reference",
                         "--json").stdout)
    emu = json.loads(run("generate", path, "--prompt-ids", ids, "--max-tokens", "5", "--backend", "emu", "--json").stdout)
    assert emu["token_ids"] == ref["token_ids"] and len(ref["token_ids"]) == 5
