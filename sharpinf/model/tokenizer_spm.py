"""SentencePiece BPE for GGUF tokenizer.ggml.model "llama" vocabularies (Gemma 3, Llama 2, ...).

Encoding runs on the `sentencepiece` library. The GGUF's pieces, scores and types go into a
sentencepiece ModelProto (model type BPE, "identity" normalizer, " " -> "▁", byte fallback) and a
SentencePieceProcessor encodes each raw-text fragment; Tokenizer (tokenizer.py) splits special
tokens out of the text before and decodes, as for every vocabulary, from the bytes of each token
made here.

What the ModelProto must say so that sentencepiece gives llama.cpp's ids
(llm_tokenizer_spm_session in llama.cpp's src/llama-vocab.cpp):
- Both merge, over and over, the adjacent pair whose joined text is a piece with the highest
  score, ties to the leftmost pair; a character that is no piece falls back to the byte pieces
  <0xNN> of its UTF-8 bytes.
- llama.cpp merges into any vocabulary entry whatever its type; sentencepiece merges only into
  NORMAL, USER_DEFINED and UNUSED pieces, splits UNUSED ones up again and matches USER_DEFINED ones
  verbatim before merging. So every piece goes in as NORMAL except the byte pieces (type BYTE,
  which byte fallback needs) and the unknown piece (sentencepiece wants exactly one UNKNOWN).
  Left over: a fragment whose merges would build the text of a byte piece ("<0x41>") or of the
  unknown piece gets that id from llama.cpp, not from sentencepiece; in Gemma 3's vocabulary no
  chain of pieces builds any of them (checked for each of its 6,505 control and byte pieces).
- tokenizer.ggml.add_space_prefix becomes add_dummy_prefix: llama.cpp puts " " before a raw
  fragment that starts the text or follows a special token, and every raw fragment does one or
  the other, so sentencepiece's "a space before each input" is the same thing.
- A vocabulary without all 256 byte pieces gets no byte fallback: a character that is no piece
  becomes the unknown token (llama.cpp looks for a one-byte piece and fails without one).
tests/test_tokenizer.py checks all this against a step-for-step Python copy of llama.cpp's loop.
"""

from __future__ import annotations

import re
from typing import Any

from sharpinf.errors import ModelError
from sharpinf.model.token_types import TOKEN_BYTE, TOKEN_NORMAL, TOKEN_UNUSED

SPACE = "\u2581"  # "▁", SentencePiece's stand-in for " "
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def spm_token_bytes(piece: str, token_type: int) -> bytes:
    """The bytes a piece stands for, as llama.cpp's token_to_piece writes them for SPM."""
    if token_type == TOKEN_BYTE and (m := _BYTE_PIECE.fullmatch(piece)):
        return bytes([int(m.group(1), 16)])
    if token_type == TOKEN_NORMAL:
        return piece.replace(SPACE, " ").encode("utf-8")
    if token_type == TOKEN_UNUSED:
        return b""  # llama.cpp writes nothing for unused pieces
    return piece.encode("utf-8")  # control, user-defined, unknown: their text as is


class SentencePieceBPE:
    """Raw text (no special tokens in it) -> ids, on sentencepiece; plus the per-token bytes."""

    default_add_bos = True  # llama.cpp's defaults for SPM vocabularies, where the GGUF has no key
    default_ids = {"bos": 1, "eos": 2, "unk": 0}

    def __init__(self, metadata: dict[str, Any], tokens: list[str], types: list[int], where: str):
        scores = metadata.get("tokenizer.ggml.scores")
        if scores is None:
            scores = [0.0] * len(tokens)  # as llama.cpp reads a vocabulary without scores
        if len(scores) < len(tokens):
            raise ModelError(where, f"{len(tokens)} tokens but {len(scores)} tokenizer.ggml.scores")
        unk = metadata.get("tokenizer.ggml.unknown_token_id", self.default_ids["unk"])
        if not 0 <= unk < len(tokens):
            raise ModelError(where, f"unknown token id {unk} outside the vocabulary")
        self.add_space_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
        self.token_bytes = [spm_token_bytes(t, ty) for t, ty in zip(tokens, types)]
        n_byte_pieces = sum(1 for t, ty in zip(tokens, types) if ty == TOKEN_BYTE and _BYTE_PIECE.fullmatch(t))
        self._sp = _processor(tokens, scores, types, unk, self.add_space_prefix, n_byte_pieces == 256, where)

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text)


def _processor(tokens, scores, types, unk: int, add_space_prefix: bool, byte_fallback: bool, where: str):
    import sentencepiece
    from sentencepiece import sentencepiece_model_pb2 as pb

    piece = pb.ModelProto.SentencePiece
    # NORMAL for all but bytes and the one unknown piece: see the module docstring.
    kinds = [piece.BYTE if ty == TOKEN_BYTE else piece.NORMAL for ty in types]
    kinds[unk] = piece.UNKNOWN
    proto = pb.ModelProto(
        trainer_spec=pb.TrainerSpec(
            model_type=pb.TrainerSpec.BPE,
            vocab_size=len(tokens),
            byte_fallback=byte_fallback,
            # Only the unknown id matters to the encoder; BOS/EOS are added (or not) by Tokenizer.
            unk_id=unk,
            bos_id=-1,
            eos_id=-1,
            pad_id=-1,
        ),
        normalizer_spec=pb.NormalizerSpec(
            name="identity",
            add_dummy_prefix=add_space_prefix,
            remove_extra_whitespaces=False,
            escape_whitespaces=True,
        ),
    )
    proto.pieces.extend(piece(piece=t, score=s, type=k) for t, s, k in zip(tokens, scores, kinds))
    try:
        return sentencepiece.SentencePieceProcessor(model_proto=proto.SerializeToString())
    except (RuntimeError, OSError) as e:  # duplicate or empty pieces, bad byte pieces, ...
        raise ModelError(where, f"sentencepiece rejects this vocabulary: {e}") from None
