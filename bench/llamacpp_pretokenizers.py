"""Record llama.cpp's token ids for every pre-tokenizer sharpinf names (model/pretokenizers.py), so
CI holds each to llama.cpp without building it (tests/test_pretokenizers.py reads the fixture).

    python bench/llamacpp_pretokenizers.py --llamacpp DIR [--out tests/data/pretokenizer_llamacpp_tokens.json]

DIR holds llama.cpp's binaries with llama-tokenize (`bash ../shared/peers/build_llamacpp.sh cpu DEST`,
then `cmake --build DEST/llama.cpp/build-cpu --target llama-tokenize`). One synthetic vocabulary
serves every name: its merges were learned across every boundary a pre-tokenizer may draw
(synth_vocab's crossing vocabulary), so where a name splits a text shows in its ids. For each name a
1-layer synthetic model carrying that vocabulary and tokenizer.ggml.pre goes through
`llama-tokenize --stdin --no-escape --ids` (no BOS: the file says add_bos_token false) for each text.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sharpinf.model.pretokenizers import PRE_TOKENIZERS  # noqa: E402
from sharpinf.model.synth import write_synthetic_model  # noqa: E402
from sharpinf.model.synth_vocab import synthetic_tokenizer_metadata  # noqa: E402

N_VOCAB, SEED = 2048, 0
NOT_LLAMACPP = {"gpt2"}  # sharpinf's alias for gpt-2, which llama.cpp refuses
TEXTS = [  # code, CJK, emoji, digits, whitespace runs, cases, marks, scripts
    "Hello world! It's a test, isn't it? I'M SURE you'll see.",
    "HTTPServer parses JSONData; XMLHttpRequest isn't camelCase, but snake_case_names are.",
    "def forward(self, x):\n    h = self.embed(x)\n\treturn h  # done\n\n\n",
    "for (int i = 0; i < n; i++) { sum += a[i] * b[i]; }  // 2**10 == 1024",
    "1234567 12345678901 3.14159 0.000123 1,000,000 2024-12-02 10:30:45 $99.99 50%",
    "日本語のテキストとカタカナ、ひらがな。中文文本测试，你好世界！",
    "한국어 텍스트입니다 ＡＢＣ！？　全角 mixed日本English123",
    "नमस्ते दुनिया मराठी हिन्दी ಕನ್ನಡ ภาษาไทย",
    "مرحبا بالعالم שלום עולם Привет, мир! Γειά σου κόσμε",
    "Ünïcödé ÉCOLE été naïve café Straße façade Øresund ǅemal Ωmega µs K",
    "👍🏽 🚀🚀 ❤️ 👨‍👩‍👧 ✓ ★ € £ ¥ © ® ™ ° ± ≤ ≥ → ∑ ∞ … — « » „ “ ” ‘ ’",
    "   leading spaces, trailing spaces   \n \n\t\t tabs\r\ncrlf\u00a0nbsp\u2003em\u3000ideo  ",
    "x  =  [ 1 ,  2 ]  ;  y=x[::-1]//2**3 <tag attr=\"v\">&amp;</tag> https://example.com/a?b=c",
    "don't DON'T we've WE'VE they'd 'quoted' l'été c'est",
    "？\u3000全角 x \u3000全 a\u2003漢字\u3000、。\u00a0中\u205f文",  # non-ASCII spaces beside CJK
]


def crossing_vocab() -> dict:
    meta = synthetic_tokenizer_metadata(N_VOCAB, SEED, crossing=True)
    return {k: v for k, v in meta.items() if k != "tokenizer.ggml.pre"}


def vocab_sha256(meta: dict) -> str:
    blob = json.dumps([meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.merges"]], ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def vocab_model(gguf: Path, meta: dict, **keys) -> Path:
    """A 1-layer synthetic llama carrying the vocabulary `meta` (and any other keys): what llama-tokenize reads."""
    return write_synthetic_model(gguf, "llama", "F32", n_layer=1, n_embd=32, n_head=2, n_head_kv=1, n_ff=64,
                                 n_vocab=len(meta["tokenizer.ggml.tokens"]), **meta, **keys)


def tokenize(bin_dir: Path, gguf: Path, text: str) -> list[int]:
    env = {**os.environ, "LD_LIBRARY_PATH": str(bin_dir)}
    r = subprocess.run([str(bin_dir / "llama-tokenize"), "-m", str(gguf), "--stdin", "--no-escape", "--ids",
                        "--log-disable"], input=text.encode(), capture_output=True, env=env, timeout=120)
    if r.returncode:
        raise SystemExit(f"llama-tokenize failed on {gguf.name}: {r.stderr.decode(errors='replace')[-1500:]}")
    return json.loads(r.stdout.decode().strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llamacpp", type=Path, required=True, help="llama.cpp's bin folder (llama-tokenize)")
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "pretokenizer_llamacpp_tokens.json")
    a = ap.parse_args(argv)
    meta = crossing_vocab()
    ids = {}
    with tempfile.TemporaryDirectory() as tmp:
        for pre in sorted(set(PRE_TOKENIZERS) - NOT_LLAMACPP):
            gguf = Path(tmp) / f"{pre}.gguf"
            vocab_model(gguf, meta, **{"tokenizer.ggml.pre": pre})
            ids[pre] = [tokenize(a.llamacpp, gguf, t) for t in TEXTS]
            print(pre, sum(map(len, ids[pre])), "tokens", file=sys.stderr)
    doc = {"generator": "llama.cpp 0c1e570 (../shared/peers, CPU build): llama-tokenize --stdin --no-escape --ids; "
                        "bench/llamacpp_pretokenizers.py",
           "vocab": {"n_vocab": N_VOCAB, "seed": SEED, "crossing": True, "sha256": vocab_sha256(meta)},
           "texts": TEXTS, "ids": ids}
    a.out.write_text(json.dumps(doc, ensure_ascii=False, indent=0) + "\n")
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
