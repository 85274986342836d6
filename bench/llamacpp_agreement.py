"""Record llama.cpp's answers on synthetic GGUF files, so CI can hold the reference to an outside
implementation without building llama.cpp (tests/test_llamacpp_agreement.py reads the fixture).

    python bench/llamacpp_agreement.py --llamacpp DIR [--out tests/data/llamacpp_agreement.json]

DIR holds llama.cpp's binaries (`bash ../shared/peers/build_llamacpp.sh cpu DEST` builds them:
DEST/llama.cpp/build-cpu/bin). For each synthetic model (`MODELS`: 2 layers, float32 weights, so
llama.cpp's CPU matmuls do not quantize the activations as they do for quantized weights) it records:
  * logits: `llama-perplexity --kl-divergence-base` on a fixed text in 32-token chunks, float32 KV
    and no flash attention; the file holds each scored position's log-probabilities as uint16 over
    [max - 16, max] (steps of <= 16/65535): the top 5 of each row are kept, with the chunk's tokens;
  * greedy: `llama-completion` at temperature 0 from a fixed prompt (float32 KV): the bytes it
    prints after the prompt.
Quantized weights are not recorded: llama.cpp's CPU dots quantize the activations of every quantized
type (Q8_0, Q8_K), the reference does not, and on these random 2-layer files that alone moves
log-probabilities by up to 0.9 (Q8_0), 2.5 (Q4_K) and 5.3 (Q3_K) nats, argmax flips at 2-5 of 45 rows
(measured 2026-12-03). A gpt-oss with MXFP4 experts is recorded all the same, the one quantized file: its
dots against q8_0 activations there put it 0.36 nats off, its 4 argmax flips at near ties (oracles/
tolerances.py's LLAMACPP_MXFP4_LOGPROB: the test holds it at confident positions). A weight type is held to llama.cpp by its dequantization instead, bit-equal to
gguf-py's, ggml's own port (tests/test_quants.py), with the float32 graph held here.
The synthetic file's sha256 is recorded too: the test rebuilds the model and refuses to compare
against a fixture made from other bytes (rerun this script after a change to the generator).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sharpinf.model.synth import write_synthetic_model  # noqa: E402
from sharpinf.model.tokenizer import Tokenizer  # noqa: E402

MODELS = [  # (name, write_synthetic_model arguments)
    ("qwen3moe-f32", dict(arch="qwen3moe", qtype="F32", n_layer=2, seed=0)),
    ("qwen3-f32", dict(arch="qwen3", qtype="F32", n_layer=2, seed=0)),
    ("llama-moe-f32", dict(arch="llama", qtype="F32", n_layer=2, seed=0, n_expert=8)),  # Mixtral-style
    # Llama 3.1's frequency factors (rope_freqs.weight, for an original context of 64 so that they vary
    # across a 16-wide head), and Qwen3's long-context YaRN (factor 4 over 256: the ramp inside the head)
    ("llama31-f32", dict(arch="llama", qtype="F32", n_layer=2, seed=0, rope_factors=64)),
    ("qwen3-yarn-f32", dict(arch="qwen3", qtype="F32", n_layer=2, seed=0, **{
        "qwen3.rope.scaling.type": "yarn", "qwen3.rope.scaling.factor": 4.0,
        "qwen3.rope.scaling.original_context_length": 256})),
    ("smollm3-f32", dict(arch="smollm3", qtype="F32", n_layer=4, seed=0)),  # layer 3 without RoPE
    ("phi3-f32", dict(arch="phi3", qtype="F32", n_layer=2, seed=0)),  # fused attn_qkv and gate|up
    # LongRoPE over an original context of 16: perplexity's chunks of 32 and completion's default context
    # (the file's 1024) both run past it, so llama.cpp reads the long factors, as sharpinf does by default
    ("phi3-longrope-f32", dict(arch="phi3", qtype="F32", n_layer=2, seed=0, longrope=16)),
    # mistral3: YaRN (factor 4 over 16, the file's betas -- the ramp over other pairs than the defaults' --
    # and log multiplier) and the queries' temperature, from position 16 on: every scored position has it
    ("mistral3-yarn-temp-f32", dict(arch="mistral3", qtype="F32", n_layer=2, seed=0, **{
        "mistral3.rope.scaling.type": "yarn", "mistral3.rope.scaling.factor": 4.0,
        "mistral3.rope.scaling.original_context_length": 16, "mistral3.rope.scaling.yarn_beta_fast": 1.0,
        "mistral3.rope.scaling.yarn_beta_slow": 0.25, "mistral3.rope.scaling.yarn_log_multiplier": 0.1,
        "mistral3.attention.temperature_scale": 0.5})),
    # gemma2: windows of 16 on every other layer, caps low enough to bend most scores and logits
    ("gemma2-softcap-f32", dict(arch="gemma2", qtype="F32", n_layer=2, seed=0, **{
        "gemma2.attn_logit_softcapping": 2.0, "gemma2.final_logit_softcapping": 5.0})),
    # gpt-oss: sinks, biases, windows of 16 on every other layer (the chunks are 32), YaRN, the biased
    # top-k-softmax router and the clamped SwiGLU; its experts in F32, then in MXFP4 (the synthetic default:
    # held at confident positions only, below)
    ("gpt-oss-f32", dict(arch="gpt-oss", qtype="F32", n_layer=2, seed=0, expert_qtype="F32")),
    ("gpt-oss-mxfp4", dict(arch="gpt-oss", qtype="F32", n_layer=2, seed=0)),
]
N_CTX = 32  # perplexity's chunk: the second half of each chunk is scored
CHUNKS = 3  # chunks kept in the fixture
TOP = 5
PROMPT = "the quick brown fox jumps over"
N_GREEDY = 16
FLOAT_KV = ["-ctk", "f32", "-ctv", "f32", "-fa", "off"]


def text() -> str:
    rng = random.Random(1)
    words = ("the quick brown fox jumps over lazy dog and then some more words appear in this tiny text about "
             "experts routing tokens").split()
    return " ".join(rng.choice(words) for _ in range(160))


def read_kl_base(path: Path) -> tuple[int, np.ndarray, list[np.ndarray]]:
    """llama-perplexity's --kl-divergence-base file: (n_ctx, tokens [chunks, n_ctx], per chunk the
    log-probabilities [n_ctx - 1 - n_ctx/2, vocab] of its scored positions, -inf at the floor)."""
    b = path.read_bytes()
    if b[:8] != b"_logits_":
        raise SystemExit(f"{path}: not a llama.cpp logits file")
    n_ctx = int(np.frombuffer(b, np.int32, 1, 8)[0])
    n_vocab, n_chunk = (int(x) for x in np.frombuffer(b, np.int32, 2, 12))
    at = 20
    toks = np.frombuffer(b, np.int32, n_chunk * n_ctx, at).reshape(n_chunk, n_ctx)
    at += 4 * n_chunk * n_ctx
    nv, rows = 2 * ((n_vocab + 1) // 2) + 4, n_ctx - 1 - n_ctx // 2
    out = []
    for _ in range(n_chunk):
        raw = np.frombuffer(b, np.uint16, rows * nv, at).reshape(rows, nv)
        at += 2 * rows * nv
        scale_min = raw[:, :4].copy().view(np.float32).astype(np.float64)  # (scale, min log-prob) per row
        q = raw[:, 4 : 4 + n_vocab].astype(np.float64)
        lp = scale_min[:, 1:2] + scale_min[:, 0:1] * q
        lp[q == 0] = -np.inf  # at or below the floor
        out.append(lp)
    return n_ctx, toks, out


def run(cmd: list[str], bin_dir: Path) -> bytes:
    env = {**os.environ, "LD_LIBRARY_PATH": str(bin_dir)}
    r = subprocess.run(cmd, capture_output=True, env=env, timeout=600)
    if r.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr.decode(errors='replace')[-2000:]}")
    return r.stdout


def record(name: str, kw: dict, bin_dir: Path, work: Path) -> dict:
    gguf = work / f"{name}.gguf"
    write_synthetic_model(gguf, **kw)
    txt, base = work / "text.txt", work / f"{name}.logits"
    txt.write_text(text())
    run([str(bin_dir / "llama-perplexity"), "-m", str(gguf), "-f", str(txt), "-c", str(N_CTX), "-t", "2",
         "--kl-divergence-base", str(base), *FLOAT_KV], bin_dir)
    n_ctx, toks, lps = read_kl_base(base)
    tok = Tokenizer.from_gguf(gguf)
    if tok.add_bos:  # perplexity scores each chunk with its first token made BOS, and writes the tokens before
        toks = toks.copy()
        toks[:, 0] = tok.bos_id
    chunks = []
    for c in range(min(CHUNKS, len(lps))):
        rows = []
        for lp in lps[c]:
            top = [int(i) for i in np.argsort(-lp, kind="stable")[:TOP] if np.isfinite(lp[i])]
            rows.append([[i, round(float(lp[i]), 6)] for i in top])
        chunks.append({"tokens": toks[c].tolist(), "first_scored": n_ctx // 2, "top": rows})
    cmd = [str(bin_dir / "llama-completion"), "-m", str(gguf), "-p", PROMPT, "-n", str(N_GREEDY), "--temp", "0",
           "-no-cnv", "--ignore-eos", "-s", "0", "--no-display-prompt", "--simple-io", *FLOAT_KV]
    for _ in range(20):  # its log thread may not flush at exit: whole only when it ends with its blank line
        out = run(cmd, bin_dir)
        if out.endswith(b"\n\n"):
            break
    else:
        raise SystemExit(f"llama-completion never printed its whole output (last: {out[-40:]!r})")
    return {"synth": kw, "sha256": hashlib.sha256(gguf.read_bytes()).hexdigest(), "n_ctx": n_ctx,
            "chunks": chunks, "greedy": {"prompt": PROMPT, "n": N_GREEDY, "continuation_hex": out[:-2].hex()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llamacpp", type=Path, required=True, help="llama.cpp's bin folder (llama-perplexity, llama-completion)")
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "llamacpp_agreement.json")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="record these models alone, the others kept from --out")
    a = ap.parse_args(argv)
    names = [n for n, _ in MODELS]
    unknown = sorted(set(a.only or ()) - set(names))
    if unknown:
        raise SystemExit(f"unknown models {unknown}; known: {', '.join(names)}")
    models = json.loads(a.out.read_text())["models"] if a.only else {}
    with tempfile.TemporaryDirectory() as tmp:
        models.update({name: record(name, kw, a.llamacpp, Path(tmp)) for name, kw in MODELS
                       if not a.only or name in a.only})
    doc = {"generator": "llama.cpp 0c1e570 (../shared/peers, CPU build): llama-perplexity --kl-divergence-base and "
                        "llama-completion --temp 0, float32 KV, no flash attention; bench/llamacpp_agreement.py",
           "models": models}
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
