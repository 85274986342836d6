"""Small, deterministic vocabularies for synthetic GGUF models.

synthetic_tokenizer_metadata: GPT-2-style (byte-level BPE, tokenizer.ggml.model "gpt2"), shaped
like SmolLM2's: control tokens <|endoftext|>, <|im_start|>, <|im_end|> first, the 256 byte tokens
next, then learned merges; a ChatML chat template. Merges are learned with the `tokenizers` BPE
trainer on the corpus below.

synthetic_spm_tokenizer_metadata: SentencePiece BPE (tokenizer.ggml.model "llama"), shaped like
Gemma 3's: <pad> <eos> <bos> <unk> and the turn markers as control tokens, "\n" runs as
user-defined ones, the 256 byte pieces <0x00>..<0xFF>, then pieces with scores learned by the
`sentencepiece` BPE trainer on the same corpus; a Gemma-style chat template.

The same (n_vocab, seed) always gives the same vocabulary.
"""

from __future__ import annotations

import io
import json
import random
from typing import Any

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_BYTE = 1, 3, 4, 6

# SmolLM2-Instruct's template, byte for byte (newlines inside its string literals are real ones), so synthetic models render chats like the real one.
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_ENGLISH = """\
The quick brown fox jumps over the lazy dog. A model reads the prompt, one token at a time,
and writes the next token. We measure how fast it runs and whether the answer is right.
It's a small test, but it's what we have: they're simple sentences that we'll reuse often.
Once upon a time there was a little robot who wanted to learn how to read and write.
The weather today is sunny with a light breeze from the west; tomorrow it may rain.
Please answer the question below. What is the capital of France? The capital is Paris.
Hello, world! How are you doing? I am fine, thank you. Let me know if you need help.
In the beginning the engine loads the weights, then it builds the cache for the keys and values.
"""

_DIGITS = """\
1 2 3 4 5 6 7 8 9 10 11 12 100 256 512 1024 2048 4096 3.14159 2.71828 0.5 1e-5 42
The year 2024 had 366 days. Call 555-0123 before 9:30 on 12/31. Pi is about 3.14.
"""

_CODE = """\
def forward(self, x):
    h = self.embed(x)
    for layer in self.layers:
        h = layer(h) + h
    return self.norm(h)

class Cache:
    def __init__(self, n_layers, n_ctx):
        self.keys = [None] * n_layers
        self.n_ctx = n_ctx

for (int i = 0; i < n; i++) {
\tsum += a[i] * b[i];
}
if __name__ == "__main__":
    print("hello world", 1 + 2)
"""


# For the crossing vocabulary only (crossing_tokenizer_metadata): the scripts, marks, cases and
# symbols where pre-tokenizers differ.
_WORLD = """\
HTTPServer parses JSONData; XMLHttpRequest isn't camelCase, but snake_case_names are. I'M DONE, you'll see.
Ünïcödé ÉCOLE été naïve café Straße façade Øresund ĲSSEL ǅemal Ωmega µs K
日本語のテキストとカタカナ、ひらがな。中文文本测试，你好世界！한국어 텍스트입니다 ＡＢＣ！？　全角
नमस्ते दुनिया मराठी हिन्दी ಕನ್ನಡ ภาษาไทย مرحبا بالعالم שלום עולם Привет, мир! Γειά σου κόσμε
👍🏽 🚀🚀 ❤️ 👨‍👩‍👧 ✓ ★ € £ ¥ © ® ™ ° ± ≤ ≥ → ← ∑ ∞ … — – « » „ “ ” ‘ ’
1234567 12345678901 3.14159 0.000123 1,000,000 2024-12-02 10:30:45 $99.99 50% #42 @user
    indented	tabbed		twice   \n spaces   \r\n crlf
x  =  [ 1 ,  2 ]  ;  y=x[::-1]//2**3  # comment /* c */ <tag attr="v">&amp;</tag> https://example.com/a?b=c
"""

_SYLLABLES = "ka lo mi ne ru sa te vo ba di fe gu ho ji ku la me no pi qu ri so tu ve wa xi yo ze".split()


def _corpus(seed: int) -> list[str]:
    """The training lines, shuffled by seed: a different seed gives a different (valid) vocab."""
    rng = random.Random(seed)
    lines = [ln for block in (_ENGLISH, _DIGITS, _CODE) for ln in block.splitlines(keepends=True)]
    rng.shuffle(lines)
    # Made-up words after the real text, so large vocabularies still get learned merges
    # (the real text alone runs out of pairs after a few hundred merges).
    words = ["".join(rng.choices(_SYLLABLES, k=rng.randint(2, 5))) for _ in range(6000)]
    made_up = [" ".join(words[i : i + 12]) + "\n" for i in range(0, len(words), 12)]
    # Real text repeated so its pairs are learned first; the trainer breaks ties deterministically.
    return lines * 40 + made_up


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (the form GGUF gpt2 vocabularies are stored in)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def _learn_merges(n_merges: int, seed: int, crossing: bool = False) -> list[tuple[str, str]]:
    """Ask the tokenizers BPE trainer for up to n_merges merges, in the order it learned them.
    crossing: learned on whole lines (bytes only, no split) of the corpus and _WORLD, so merges span
    spaces, digit runs, case changes and script boundaries."""
    tok = Tokenizer(models.BPE())
    # Same pre-tokenization as the smollm pre-tokenizer: digits split off one by one, GPT-2 regex.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    ) if not crossing else pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    corpus = _corpus(seed) if not crossing else _WORLD.splitlines(keepends=True) * 40 + _corpus(seed)
    trainer = trainers.BpeTrainer(
        vocab_size=256 + n_merges,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    merges = json.loads(tok.to_str())["model"]["merges"]
    # Older tokenizers versions write "a b" strings, newer ones [a, b] pairs.
    pairs = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in merges]
    return pairs[:n_merges]


def synthetic_tokenizer_metadata(n_vocab: int = 512, seed: int = 0, crossing: bool = False) -> dict[str, Any]:
    """GGUF tokenizer keys -> values for a byte-level BPE vocabulary of exactly n_vocab tokens.
    crossing: its merges span every boundary a pre-tokenizer may draw (_learn_merges), so the ids a
    text gets show where tokenizer.ggml.pre split it (the pre-tokenizer fixtures' vocabulary)."""
    n_fixed = len(SPECIAL_TOKENS) + 256
    if n_vocab < n_fixed:
        raise ValueError(f"n_vocab must be at least {n_fixed} (specials + 256 bytes), got {n_vocab}")
    b2u = bytes_to_unicode()
    tokens = list(SPECIAL_TOKENS) + [b2u[b] for b in range(256)]
    types = [TOKEN_CONTROL] * len(SPECIAL_TOKENS) + [TOKEN_NORMAL] * 256
    merges: list[str] = []
    seen = set(tokens)
    for left, right in _learn_merges(n_vocab - n_fixed, seed, crossing):
        if left + right in seen:  # cannot happen with a fresh trainer; guard keeps ids unique
            continue
        seen.add(left + right)
        tokens.append(left + right)
        types.append(TOKEN_NORMAL)
        merges.append(f"{left} {right}")
    # A corpus too small for n_vocab: pad with unused user-defined tokens so the count is exact.
    i = 0
    while len(tokens) < n_vocab:
        tokens.append(f"<|extra_{i}|>")
        types.append(TOKEN_USER_DEFINED)
        i += 1
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.padding_token_id": 2,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": CHATML_TEMPLATE,
    }


# Gemma 3's ids for these (pad 0, eos 1, bos 2, unk 3; all control), then its turn markers.
SPM_SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
# User-defined: always split out of the text whole, as Gemma 3's "\n" runs (it has tab and space runs too).
SPM_USER_DEFINED = ["\n", "\n\n", "\n\n\n"]

# Gemma 3's template for messages whose content is a string (no images), role checks left out.
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{% set first_user_prefix = messages[0]['content'] + '\n\n' %}{% set loop_messages = messages[1:] %}"
    "{% else %}{% set first_user_prefix = '' %}{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if message['role'] == 'assistant' %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + (message['content'] | trim)"
    " + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


def _learn_spm_pieces(n_pieces: int, seed: int) -> list[tuple[str, float]]:
    """Up to n_pieces (piece, score) from the sentencepiece BPE trainer, best score first: merges
    (score -rank, as in Gemma 3's vocabulary), then single characters. "▁" always stays in; where
    n_pieces is less than the corpus has characters, the rarest go (they fall back to bytes)."""
    import sentencepiece  # lazily, like the tokenizer that reads these

    lines = [ln.rstrip("\n") for ln in _corpus(seed)]
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        model_type="bpe",
        # + the trainer's own <unk> (dropped below); at least room for every character of the corpus
        vocab_size=max(n_pieces, 256) + 1,
        hard_vocab_limit=False,  # a corpus too small for n_pieces gives fewer
        character_coverage=1.0,
        normalization_rule_name="identity",
        add_dummy_prefix=False,  # as Gemma 3 (tokenizer.ggml.add_space_prefix false)
        remove_extra_whitespaces=False,
        unk_id=0,
        bos_id=-1,
        eos_id=-1,
        num_threads=1,
        minloglevel=2,
    )
    sp = sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
    pieces = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size()) if not sp.is_unknown(i)]
    kept = pieces[:n_pieces]
    if all(piece != "\u2581" for piece, _ in kept):
        kept[-1] = next(p for p in pieces if p[0] == "\u2581")
    return kept


def synthetic_spm_tokenizer_metadata(n_vocab: int = 512, seed: int = 0) -> dict[str, Any]:
    """GGUF tokenizer keys -> values for a SentencePiece BPE vocabulary of exactly n_vocab tokens."""
    n_fixed = len(SPM_SPECIAL_TOKENS) + len(SPM_USER_DEFINED) + 256
    if n_vocab < n_fixed + 1:
        raise ValueError(f"n_vocab must be at least {n_fixed + 1} (specials + 256 bytes + '▁'), got {n_vocab}")
    tokens = SPM_SPECIAL_TOKENS + SPM_USER_DEFINED + [f"<0x{b:02X}>" for b in range(256)]
    types = [TOKEN_CONTROL] * len(SPM_SPECIAL_TOKENS) + [TOKEN_USER_DEFINED] * len(SPM_USER_DEFINED)
    types += [TOKEN_BYTE] * 256
    scores = [-1000.0] * (len(SPM_SPECIAL_TOKENS) + len(SPM_USER_DEFINED)) + [0.0] * 256
    seen = set(tokens)
    for piece, score in _learn_spm_pieces(n_vocab - n_fixed, seed):
        if piece in seen:  # cannot happen ("\n" is not in the training lines); keeps ids unique
            continue
        seen.add(piece)
        tokens.append(piece)
        types.append(TOKEN_NORMAL)
        scores.append(score)
    # A corpus too small for n_vocab: pad with unused control tokens, as Gemma 3 has them.
    i = 0
    while len(tokens) < n_vocab:
        tokens.append(f"<unused{i}>")
        types.append(TOKEN_CONTROL)
        scores.append(-1000.0)
        i += 1
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 3,
        "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": False,
        "tokenizer.ggml.add_space_prefix": False,
        "tokenizer.chat_template": GEMMA_TEMPLATE,
    }
