"""Tokenizers built from a GGUF file's tokenizer.* metadata, giving llama.cpp's token ids.

Shared by every vocabulary (Tokenizer, here): special tokens split out of the text first as
llama.cpp does (llama-vocab.cpp, tokenizer_st_partition), BOS, decoding byte for byte from each
token's bytes. The raw text in between goes to the vocabulary's own encoder:
- tokenizer.ggml.model "gpt2" (byte-level BPE, here): the `tokenizers` library, configured to give
  llama.cpp's ids: the same pre-tokenizer regexes per tokenizer.ggml.pre (pretokenizers.py), the
  same merge ranks.
- tokenizer.ggml.model "llama" (SentencePiece BPE: Gemma 3, Llama 2): the `sentencepiece`
  library, in tokenizer_spm.py.
"""

from __future__ import annotations

import struct
from typing import Any, Iterable

from tokenizers import Regex, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models

from sharpinf.errors import ModelError
from sharpinf.model.pretokenizers import PRE_TOKENIZERS, PreTokenizer
from sharpinf.model.synth_vocab import bytes_to_unicode

from sharpinf.model.token_types import TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_USER_DEFINED

# Texts of tokens that end generation besides tokenizer.ggml.eos_token_id: llama.cpp's list
# (llama-vocab.cpp, special_eog_ids). llama.cpp also makes each one a control token where the GGUF
# says otherwise, so it is split out of text only when parsing specials (Gemma 3's "</s>" is
# user-defined in the GGUF); a vocabulary with "<|tool_response>" (gemma4) keeps "</s>" as it is.
_EOG_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
)
# Token types decode(skip_special=True) leaves out (llama.cpp: attr CONTROL or UNKNOWN).
_HIDDEN_TYPES = (TOKEN_CONTROL, TOKEN_UNKNOWN)

_BYTE_OF_CHAR = {c: b for b, c in bytes_to_unicode().items()}


def _pre_tokenizer(pre: str, where: str) -> PreTokenizer:
    if pre not in PRE_TOKENIZERS:
        known = ", ".join(sorted(PRE_TOKENIZERS))
        raise ModelError(where, f"unsupported tokenizer.ggml.pre {pre!r} (supported: {known})")
    return PRE_TOKENIZERS[pre]


def _hf_pre_tokenizer(spec: PreTokenizer):
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in spec.regexes]
    # The regexes already split; ByteLevel only maps bytes to GPT-2's printable characters.
    return pre_tokenizers.Sequence(splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _piece_bytes(text: str) -> bytes:
    """Bytes of a byte-level vocabulary entry; a char outside GPT-2's map stands for its own UTF-8."""
    out = bytearray()
    for ch in text:
        b = _BYTE_OF_CHAR.get(ch)
        if b is None:
            out += ch.encode("utf-8")
        else:
            out.append(b)
    return bytes(out)


class _ByteLevelBPE:
    """tokenizer.ggml.model "gpt2": raw text (no special tokens in it) -> ids on `tokenizers`."""

    add_space_prefix = False
    default_ids: dict[str, int] = {}  # no default BOS/EOS ids

    def __init__(self, metadata: dict[str, Any], tokens: list[str], types: list[int], where: str):
        try:
            merges = list(metadata["tokenizer.ggml.merges"])
        except KeyError as e:
            raise ModelError(where, f"missing tokenizer metadata key {e.args[0]}") from None
        self.pre = metadata.get("tokenizer.ggml.pre", "default")
        spec = _pre_tokenizer(self.pre, where)
        self.default_add_bos = spec.add_bos  # llama.cpp's default where the file has no add_bos_token
        self.token_bytes = [
            t.encode("utf-8") if ty in (TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNKNOWN) else _piece_bytes(t)
            for t, ty in zip(tokens, types)
        ]
        text_to_id = {t: i for i, t in enumerate(tokens)}
        pairs = []
        for m in merges:
            cut = m.find(" ", 1)  # as llama.cpp: the first space after the first character
            left, right = m[:cut], m[cut + 1 :]
            # The tokenizers library rejects a merge whose parts or result are not tokens.
            if cut > 0 and left in text_to_id and right in text_to_id and left + right in text_to_id:
                pairs.append((left, right))
        self.hf = HFTokenizer(models.BPE(text_to_id, pairs, ignore_merges=spec.ignore_merges))
        self.hf.pre_tokenizer = _hf_pre_tokenizer(spec)

    def encode(self, text: str) -> list[int]:
        # The batch calls let go of the GIL while they work; encode holds it (4 MB of text: 6 s in
        # which no other thread of a server runs). encode_batch_fast (tokenizers 0.21) skips the
        # offsets, which also makes freeing the result cheap (its ids list is the GIL's part: ~20 ms
        # per 500k tokens).
        batch = getattr(self.hf, "encode_batch_fast", self.hf.encode_batch)
        return batch([text], add_special_tokens=False)[0].ids


# llama.cpp's one tokenizer rule keyed on a model's name (llama-vocab.cpp's load): in a file whose
# general.name says phi-3 or phi3, the whitespace after a special token is dropped (its RSTRIP attribute),
# "</s>" too, but not after <unk>, <s> or <|endoftext|>.
RSTRIP_NAMES = ("phi-3", "phi3")
RSTRIP_KEPT = ("<unk>", "<s>", "<|endoftext|>")
_C_SPACE = " \t\n\v\f\r"  # C's isspace, which llama.cpp strips with


def rstrip_ids(metadata: dict[str, Any], tokens: list[str], special: set[int]) -> frozenset[int]:
    """The special tokens (ids) llama.cpp marks RSTRIP for this file's general.name; none for most files."""
    name = str(metadata.get("general.name", "")).lower()
    if not any(n in name for n in RSTRIP_NAMES):
        return frozenset()
    ids = set(special) | {i for i, t in enumerate(tokens) if t == "</s>"}
    return frozenset(i for i in ids if tokens[i] not in RSTRIP_KEPT)


class _SpecialSplitter:
    """llama.cpp's tokenizer_st_partition: special tokens come out of the text verbatim.

    Longest token first (equal lengths: lower id first), each one splits every raw-text piece
    left so far at all its occurrences. Only tokens that occur in the text are tried; to find
    them without searching the text for each one (Gemma 3 has 6,400, 6,242 of them "<unusedN>"),
    tokens are grouped by their first 2 characters, then by their first 8.
    """

    def __init__(self, specials: list[tuple[str, int]], rstrip: frozenset[int] = frozenset()):
        self._order = sorted(specials, key=lambda s: -len(s[0]))
        self._rstrip = rstrip  # the tokens whose following whitespace is dropped (RSTRIP_NAMES)
        self._groups: dict[str, dict[str, list[int]]] = {}
        for k, (text, _) in enumerate(self._order):
            self._groups.setdefault(text[:2], {}).setdefault(text[:8], []).append(k)

    def split(self, text: str) -> list[str | int]:
        """The text as raw-text pieces (str) and special token ids (int), in order."""
        frags: list[str | int] = [text] if text else []
        present = sorted(
            k
            for head, subgroups in self._groups.items() if head in text
            for longer_head, ks in subgroups.items() if longer_head in text
            for k in ks
        )
        for k in present:
            special, token_id = self._order[k]
            if special not in text:
                continue
            out: list[str | int] = []
            for frag in frags:
                if isinstance(frag, int) or special not in frag:
                    out.append(frag)
                    continue
                for j, part in enumerate(frag.split(special)):
                    if j:
                        out.append(token_id)
                        if token_id in self._rstrip:
                            part = part.lstrip(_C_SPACE)
                    if part:
                        out.append(part)
            frags = out
        return frags


class Tokenizer:
    """Text <-> token ids for a GGUF vocabulary: "gpt2" (byte-level BPE) or "llama" (SentencePiece).

    The part both share is here: special tokens split out of the text first (CONTROL, USER_DEFINED
    and UNKNOWN ones; with parse_special false only USER_DEFINED), BOS, decoding from per-token
    bytes. Each raw-text piece in between goes to the vocabulary's own encoder.
    """

    def __init__(self, metadata: dict[str, Any], where: str = "<metadata>"):
        self.where = where
        model = metadata.get("tokenizer.ggml.model")
        if model not in ("gpt2", "llama"):
            supported = "'gpt2' byte-level BPE, 'llama' SentencePiece"
            raise ModelError(where, f"unsupported tokenizer.ggml.model {model!r} (supported: {supported})")
        try:
            tokens = list(metadata["tokenizer.ggml.tokens"])
        except KeyError as e:
            raise ModelError(where, f"missing tokenizer metadata key {e.args[0]}") from None
        types = list(metadata.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens))
        if len(types) != len(tokens):
            raise ModelError(where, f"{len(tokens)} tokens but {len(types)} token types")
        text_to_id = {t: i for i, t in enumerate(tokens)}
        # End-of-generation tokens found by their text, and made control tokens, as llama.cpp does.
        eog = {text_to_id[t] for t in _EOG_TEXTS if t in text_to_id}
        if "<|tool_response>" in text_to_id and "</s>" in text_to_id:
            eog.discard(text_to_id["</s>"])
        for i in eog:
            types[i] = TOKEN_CONTROL
        if model == "gpt2":
            self._model = _ByteLevelBPE(metadata, tokens, types, where)
        else:
            from sharpinf.model.tokenizer_spm import SentencePieceBPE  # lazily: sentencepiece, protobuf

            self._model = SentencePieceBPE(metadata, tokens, types, where)
        self.model = model
        self.pre = metadata.get("tokenizer.ggml.pre", "default")

        self._tokens = tokens
        self._types = types
        self._bytes = self._model.token_bytes
        defaults = self._model.default_ids
        self._bos = metadata.get("tokenizer.ggml.bos_token_id", defaults.get("bos"))
        self._eos = metadata.get("tokenizer.ggml.eos_token_id", defaults.get("eos"))
        self.add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", self._model.default_add_bos))
        self.add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False))  # llama.cpp's default too
        # SentencePiece's dummy " " before the text: decode drops it again from the first token.
        self.add_space_prefix: bool = self._model.add_space_prefix
        self.chat_template: str | None = metadata.get("tokenizer.chat_template")
        if self._eos is not None:
            eog.add(self._eos)
        for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):  # llama.cpp's special_eog_ids
            if metadata.get(key) is not None:
                eog.add(int(metadata[key]))
        self.eot_ids: frozenset[int] = frozenset(eog)

        special_kinds = (TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNKNOWN)
        rstrip = rstrip_ids(metadata, tokens, {i for i, ty in enumerate(types) if ty in special_kinds})

        def splitter(kinds: tuple[int, ...]) -> _SpecialSplitter:
            return _SpecialSplitter([(t, i) for i, (t, ty) in enumerate(zip(tokens, types)) if ty in kinds and t], rstrip)

        # llama.cpp matches user-defined tokens always, control (and unknown) ones only when parsing specials.
        self._split_special = splitter(special_kinds)
        self._split_plain = splitter((TOKEN_USER_DEFINED,))

    @classmethod
    def from_gguf_metadata(cls, metadata: dict[str, Any], where: str = "<metadata>") -> "Tokenizer":
        return cls(metadata, where)

    @classmethod
    def from_gguf(cls, path) -> "Tokenizer":
        return cls(read_tokenizer_metadata(path), str(path))

    # --- properties ---------------------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        return len(self._tokens)

    @property
    def bos_id(self) -> int | None:
        return self._bos

    @property
    def eos_id(self) -> int | None:
        return self._eos

    @property
    def bos_token(self) -> str:
        return self._tokens[self._bos] if self._bos is not None else ""

    @property
    def eos_token(self) -> str:
        return self._tokens[self._eos] if self._eos is not None else ""

    def id_to_piece(self, token_id: int) -> str:
        """The vocabulary entry as stored (gpt2: GPT-2 byte-to-unicode form; llama: "▁" for spaces)."""
        return self._tokens[token_id]

    def token_type(self, token_id: int) -> int:
        return self._types[token_id]

    def is_special(self, token_id: int) -> bool:
        """Control and unknown tokens: the ones decode(skip_special=True) hides, as llama.cpp does."""
        return self._types[token_id] in _HIDDEN_TYPES

    # --- encode / decode ----------------------------------------------------------------------
    def encode(self, text: str, add_bos: bool | None = None, parse_special: bool = True) -> list[int]:
        """Token ids for text; add_bos None means tokenizer.ggml.add_bos_token. The specials llama.cpp adds
        come with it: an EOS at the end too where tokenizer.ggml.add_eos_token says so (add_bos False:
        neither, the text already holds what it needs)."""
        ids = []
        if (self.add_bos if add_bos is None else add_bos) and self._bos is not None:
            ids.append(self._bos)
        for frag in (self._split_special if parse_special else self._split_plain).split(text):
            if isinstance(frag, int):
                ids.append(frag)
            else:
                ids += self._model.encode(frag)
        if self.add_eos and add_bos is not False and self._eos is not None:
            ids.append(self._eos)
        return ids

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for (control tokens: their text); streaming decoders join these."""
        return self._bytes[token_id]

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text for ids; bytes joined first so multi-token characters survive, bad UTF-8 -> U+FFFD.

        With add_space_prefix (SentencePiece) the first token loses one leading space, as in
        llama.cpp's detokenize; a hidden first token (skip_special) keeps the space of the next."""
        out = bytearray()
        strip_space = self.add_space_prefix
        for i in ids:
            piece = b"" if skip_special and self._types[i] in _HIDDEN_TYPES else self._bytes[i]
            if strip_space and piece[:1] == b" ":
                piece = piece[1:]
            strip_space = False
            out += piece
        return out.decode("utf-8", errors="replace")

    def decode_token(self, token_id: int) -> str:
        return self._bytes[token_id].decode("utf-8", errors="replace")

    def apply_chat(self, messages: list[dict], add_generation_prompt: bool = True, template: str | None = None) -> list[int]:
        """Render messages with the chat template, then encode with special tokens parsed."""
        from sharpinf.model.chat import render_chat  # chat imports nothing from here; lazy keeps it optional

        tpl = template if template is not None else self.chat_template
        if not tpl:
            raise ModelError(self.where, "no tokenizer.chat_template in this model (a base model? give it plain "
                                         "text: --prompt)")
        text = render_chat(tpl, messages, add_generation_prompt, bos_token=self.bos_token, eos_token=self.eos_token)
        ids = self.encode(text, add_bos=False)
        # Add BOS only when the model wants it and the template did not already write it.
        if self.add_bos and self._bos is not None and (not ids or ids[0] != self._bos):
            ids = [self._bos] + ids
        return ids


def read_tokenizer_metadata(path) -> dict[str, Any]:
    """The tokenizer.* key/value pairs of a GGUF file as plain Python values.

    Parses the key/value section directly: gguf.GGUFReader takes seconds on a 49k-token vocabulary.
    """
    import mmap

    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse_kv(buf, ("tokenizer.", "general.name"))  # the name: RSTRIP_NAMES
    except (OSError, ValueError, struct.error, IndexError) as e:
        raise ModelError(path, f"cannot read GGUF metadata: {e}") from None


_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NP = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9


def _parse_kv(buf, prefix: str | tuple[str, ...]) -> dict[str, Any]:
    """Walk GGUF v2/v3 (little-endian) key/values; keep those whose key starts with prefix."""
    import numpy as np

    if buf[:4] != b"GGUF":
        raise ValueError("not a GGUF file (bad magic)")
    version, _n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version < 2:
        raise ValueError(f"GGUF version {version} is too old")
    pos = 24

    def string(at: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", buf, at)
        return bytes(buf[at + 8 : at + 8 + n]).decode("utf-8", errors="replace"), at + 8 + n

    def value(vtype: int, at: int, keep: bool) -> tuple[Any, int]:
        if vtype == _STRING:
            return string(at)
        if vtype in _SCALAR:
            fmt = _SCALAR[vtype]
            return struct.unpack_from(fmt, buf, at)[0], at + struct.calcsize(fmt)
        if vtype != _ARRAY:
            raise ValueError(f"unknown GGUF value type {vtype}")
        etype, n = struct.unpack_from("<IQ", buf, at)
        at += 12
        if etype in _NP:
            size = np.dtype(_NP[etype]).itemsize * n
            arr = np.frombuffer(buf, _NP[etype], n, at).tolist() if keep else None
            if keep and etype == 7:
                arr = [bool(x) for x in arr]
            return arr, at + size
        items = []
        for _ in range(n):
            v, at = value(etype, at, keep)
            items.append(v)
        return (items if keep else None), at

    out: dict[str, Any] = {}
    for _ in range(n_kv):
        key, pos = string(pos)
        (vtype,) = struct.unpack_from("<I", buf, pos)
        keep = key.startswith(prefix)
        v, pos = value(vtype, pos + 4, keep)
        if keep:
            out[key] = v
    return out
