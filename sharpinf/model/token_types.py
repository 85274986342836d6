"""GGUF's tokenizer.ggml.token_type values (llama.cpp's llama_token_type): what a vocabulary entry is.
A leaf: both encoders (tokenizer.py's byte-level BPE, tokenizer_spm.py's SentencePiece) read it."""

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6
