"""Record llama.cpp's token ids for its one tokenizer rule keyed on a model's name -- phi3's RSTRIP (the
whitespace after a special token dropped where general.name says phi-3 or phi3, tokenizer.py's
RSTRIP_NAMES) -- so CI holds sharpinf's split to it (tests/test_tokenizer.py reads the fixture).

    python bench/llamacpp_rstrip.py --llamacpp DIR [--out tests/data/rstrip_llamacpp_tokens.json]

DIR holds llama-tokenize (bench/llamacpp_pretokenizers.py says how to build it). One synthetic byte-level
BPE vocabulary with the special tokens the rule names (<s>, </s>, <unk>, <|endoftext|>) and chat ones
(control and user-defined) goes through llama-tokenize twice, in a file named phi3 and in one named
otherwise, for each text: texts with whitespace after, before and between special tokens.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.llamacpp_pretokenizers import tokenize, vocab_model  # noqa: E402
from sharpinf.model.synth_vocab import TOKEN_CONTROL, TOKEN_USER_DEFINED, synthetic_tokenizer_metadata  # noqa: E402

TOKEN_UNKNOWN = 2
ADDED = [("<s>", TOKEN_CONTROL), ("</s>", TOKEN_CONTROL), ("<unk>", TOKEN_UNKNOWN), ("<|user|>", TOKEN_USER_DEFINED),
         ("<|end|>", TOKEN_CONTROL), ("<|assistant|>", TOKEN_USER_DEFINED)]
NAMES = {"phi3": "Phi-3-mini-4k-instruct", "other": "sharpinf-synthetic-llama"}
TEXTS = [
    "<|user|>\n  Hello<|end|>\n<|assistant|>   Hi  there</s>  \t x",
    "<s>  y <unk>  z <|endoftext|>  w <|im_start|> \n v<|im_end|>\r\n u",
    "a </s></s>  b <|end|>\n\n",
    "  <|end|>  <|user|>",
    "plain  text, no specials  ",
]


def vocab() -> dict:
    """The fixture's vocabulary: the synthetic BPE one (512 tokens) with ADDED after it."""
    meta = synthetic_tokenizer_metadata(512, 0)
    meta["tokenizer.ggml.tokens"] = meta["tokenizer.ggml.tokens"] + [t for t, _ in ADDED]
    meta["tokenizer.ggml.token_type"] = meta["tokenizer.ggml.token_type"] + [k for _, k in ADDED]
    return meta


def vocab_sha256(meta: dict) -> str:
    blob = json.dumps([meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"], meta["tokenizer.ggml.merges"]])
    return hashlib.sha256(blob.encode()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llamacpp", type=Path, required=True, help="llama.cpp's bin folder (llama-tokenize)")
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "rstrip_llamacpp_tokens.json")
    a = ap.parse_args(argv)
    meta = vocab()
    ids = {}
    with tempfile.TemporaryDirectory() as tmp:
        for key, name in NAMES.items():
            gguf = Path(tmp) / f"{key}.gguf"
            vocab_model(gguf, meta, **{"general.name": name})
            ids[key] = [tokenize(a.llamacpp, gguf, t) for t in TEXTS]
    doc = {"generator": "llama.cpp 0c1e570 (../shared/peers, CPU build): llama-tokenize --stdin --no-escape --ids; "
                        "bench/llamacpp_rstrip.py",
           "vocab_sha256": vocab_sha256(meta), "names": NAMES, "texts": TEXTS, "ids": ids}
    a.out.write_text(json.dumps(doc, ensure_ascii=False, indent=0) + "\n")
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
