"""tokenizer.ggml.pre -> how llama.cpp pre-tokenizes a byte-level BPE vocabulary (llama-vocab.cpp):
the regexes it applies in turn (each splits the pieces the previous ones left; matches and the text
between them both become pieces), whether a whole pre-token in the vocabulary is taken as one token
before any merge (ignore_merges), and whether BOS is added when the file does not say
(tokenizer.ggml.add_bos_token).

The regexes are llama.cpp's (its adapted forms where it rewrote a tokenizer.json regex for its own
engine, so the `tokenizers` library's engine gives its pieces); tests/test_tokenizer.py holds each
name to llama-tokenize's ids on recorded texts (tests/data/pretokenizer_llamacpp_tokens.json).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PreTokenizer:
    regexes: tuple[str, ...]
    ignore_merges: bool = False
    add_bos: bool = False  # llama.cpp's default when the file has no tokenizer.ggml.add_bos_token


_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama.cpp's "default" is not plain GPT-2: punctuation runs and 3-digit groups split first.
_DEFAULT = [r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"]
_STARCODER = [r"\p{N}", _GPT2]  # digits one by one, then GPT-2's

# llama.cpp matches a regex without \p{...} on the text with every non-ASCII space read as \v (its
# engine's \s knows no other), so no character class below holds one: "&&\S" keeps them out of the
# two whose ranges span spaces (U+3000 in "\u3000-。", U+1680-U+3000 in "ࠀ-一").
_DEEPSEEK_LLM = [
    '[\r\n]',
    '\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+',
    '\\s?[!-/:-~！-／：-～‘-‟\u3000-。&&\\S]+',
    '\\s+$',
    '[一-龥ࠀ-一가-\ud7ff&&\\S]+',
    '\\p{N}+',
]
_DEEPSEEK_CODER = [
    '[\r\n]',
    '\\s?\\p{L}+',
    '\\s?\\p{P}+',
    '[一-龥ࠀ-一가-\ud7ff&&\\S]+',
    '\\p{N}',
]
_DEEPSEEK3_LLM = [
    '\\p{N}{1,3}',
    '[一-龥\u3040-ゟ゠-ヿ]+',
    '[!"#$%&\'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+',
]
_TEKKEN = [
    '[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+',
]
_GPT4O = [
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
]
_QWEN35 = [
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
]
_FALCON = [
    '[\\p{P}\\$\\+<=>\\^~\\|`]+',
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    '[0-9][0-9][0-9]',
]
_PORO = [
    ' ?[^(\\s|.,!?…。，、।۔،)]+',
]
_VIKING = [
    ' ?[^(\\s|.,!?…。，、।۔،)]+',
    '\\p{N}',
]


def _table() -> dict[str, PreTokenizer]:
    t: dict[str, PreTokenizer] = {}

    def add(names: str, regexes: list[str], **kw) -> None:
        for n in names.split():
            t[n] = PreTokenizer(tuple(regexes), **kw)

    add("default", _DEFAULT)
    add("gpt-2 gpt2 phi-2 mpt olmo exaone4", [_GPT2])  # "gpt2": an alias llama.cpp itself refuses
    add("starcoder smollm refact command-r codeshell exaone minerva-7b", _STARCODER)
    add("llama3 llama-v3 llama-bpe falcon3 pixtral", [_LLAMA3], ignore_merges=True, add_bos=True)
    add("dbrx smaug-bpe chatglm-bpe", [_LLAMA3])  # llama3's regex, BPE merges as usual
    add("glm4 glm5", [_LLAMA3], ignore_merges=True)  # (ChatGLM's, GLM-4's: no BOS unless the file names one)
    add("qwen2 deepseek-r1-qwen stablelm2 megrez", [_QWEN2])
    add("qwen35", _QWEN35)
    add("deepseek-llm", _DEEPSEEK_LLM)
    add("deepseek-coder", _DEEPSEEK_CODER)
    add("deepseek-v3", _DEEPSEEK3_LLM)
    add("tekken", _TEKKEN, ignore_merges=True, add_bos=True)  # Mistral Nemo, Small 3, Pixtral
    add("gpt-4o llama4", _GPT4O)
    add("falcon", _FALCON)
    add("poro-chat bloom gpt3-finnish", _PORO)
    add("viking", _VIKING)
    return t


PRE_TOKENIZERS = _table()
