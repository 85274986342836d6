"""Generation on the NumPy reference (`--backend reference`): slow, obviously right.

One sequence, the engine's rules: each token is chosen by the sampling kernel's NumPy twin
(`ops.sampling_reference.sample_reference`) with the engine's seed, step and penalty history, so a request
gives the same tokens here as on emu or cuda (greedy is temperature 0)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from sharpinf.engine.config import EngineConfig
from sharpinf.engine.grammar import Grammars
from sharpinf.model.tokenizer import Tokenizer
from sharpinf.ops.sampling import RequestSeeds, history_words
from sharpinf.ops.sampling_reference import sample_reference
from oracles.reference import Reference
from sharpinf.params import SamplingParams
from sharpinf.textgen import GenerationResult, StopChecker, check_prompt

INITIAL_ROOM = 256  # generated positions allocated up front; the cache doubles when they run out


def generate_reference(ref: Reference, tok: Tokenizer, prompt_ids: list[int], params: SamplingParams,
                       on_token: Callable[[int, str], None] | None = None) -> GenerationResult:
    cfg = ref.cfg
    check_prompt(prompt_ids, cfg.n_vocab, cfg.context_length)
    stop = StopChecker(params, tok, context_left=cfg.context_length - len(prompt_ids))
    seed = RequestSeeds(EngineConfig.seed).seed_for(params)  # a new engine's first seedless request's seed
    # positions this request can use; the cache grows towards it as tokens come, never sized by
    # the model's declared context up front (a GGUF may declare 2**24: hundreds of GiB)
    limit = min(cfg.context_length, len(prompt_ids) + (params.max_tokens or cfg.context_length))
    cache = ref.new_cache(min(limit, len(prompt_ids) + INITIAL_ROOM))
    logits = ref.forward(prompt_ids, cache)[-1]
    seen = list(prompt_ids)  # the penalty's history, as the engine's: prompt + generated
    grammar = Grammars(tok, cfg.n_vocab).compile(params.structured) if params.structured is not None else None
    mask = np.zeros(history_words(cfg.n_vocab), np.uint32)
    while True:
        if grammar is not None:
            grammar.fill(mask)
        token = sample_reference(logits, params, seed, step=len(stop.tokens), seen=seen,
                                 generated=seen[len(prompt_ids):], mask=mask if grammar is not None else None)
        if token < 0:  # the grammar allows nothing: the engine ends the request the same way
            stop.finish_reason = "stop"
            break
        seen.append(token)
        shown = len(stop.text)
        done = stop.add(token)
        if grammar is not None:  # the engine's rule: a complete document ends the request
            grammar.advance(token)
            if grammar.finished and stop.finish_reason != "stop":
                done, stop.finish_reason = True, "stop"
        if on_token is not None:
            on_token(token, stop.text[shown:])
        if done:
            break
        cache.reserve(cache.length + 1, limit)
        logits = ref.forward([token], cache)[-1]
    return GenerationResult(list(prompt_ids), stop.tokens, stop.text, stop.finish_reason)
