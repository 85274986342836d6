"""LLM: the Python API. `LLM(model).generate(prompts, params)` runs them all through the engine.

    llm = LLM("smollm2-135m", backend="emu", max_num_batched_tokens=256)
    outs = llm.generate(["Hello", [{"role": "user", "content": "Hi!"}]], SamplingParams(max_tokens=16))
    for delta in llm.stream("Once upon a time"):   # token deltas as they come
        print(delta.new_text, end="")

A request that cannot run (bad parameters, prompt too long, ...) comes back with
finish_reason "rejected" and its error; the others run as usual. Nothing is dropped.

One LLM may be shared: any number of threads and interleaved streams may call generate and
stream at once. The engine steps under one lock, whoever holds it steps for everyone, and
each step's deltas are routed to the request that owns them.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator, Sequence as Seq

import numpy as np

from sharpinf.engine.llm_engine import LLMEngine, Prompt, RequestOutput
from sharpinf.engine.watchdog import describe
from sharpinf.errors import EngineStuck, RequestError, SharpinfError
from sharpinf.params import SamplingParams
from sharpinf.textgen import GenerationResult


def _ids_list(p) -> bool:
    return isinstance(p, (list, tuple)) and bool(p) and all(isinstance(t, (int, np.integer)) and not isinstance(t, bool)
                                                          for t in p)


def _as_items(prompts) -> list:
    """One prompt (a string, a list of ids, one chat) or many, as a list of prompts."""
    if prompts is None:
        raise RequestError("prompts is None: give a string, a list of token ids, a chat, or a list of those")
    if isinstance(prompts, np.ndarray):  # ids: 1-D is one prompt, 2-D one per row
        if prompts.ndim not in (1, 2) or prompts.dtype.kind not in "iu":
            raise RequestError(f"a NumPy prompt must be a 1-D or 2-D integer array, got {prompts.ndim}-D {prompts.dtype}")
        return [prompts.tolist()] if prompts.ndim == 1 else prompts.tolist()
    if isinstance(prompts, str) or _ids_list(prompts):
        return [prompts]
    if isinstance(prompts, (list, tuple)) and prompts and all(isinstance(p, dict) for p in prompts):
        return [prompts]
    if isinstance(prompts, (list, tuple)):
        return [p.tolist() if isinstance(p, np.ndarray) else p for p in prompts]
    raise RequestError(f"prompts must be a string, token ids, a chat, or a list of those; got {type(prompts).__name__}")


def _result(seq) -> GenerationResult:
    return GenerationResult(list(seq.prompt_ids), list(seq.output_ids), seq.stop.text, seq.finish_reason,
                            seq.metrics.to_json(), error=seq.error)


class LLM:
    def __init__(self, model, backend=None, **engine_config):
        self.engine = LLMEngine(model, backend=backend, **engine_config)
        self.tokenizer = self.engine.tokenizer
        self._lock = threading.RLock()
        self._outbox: dict[str, deque[RequestOutput]] = {}  # each live request's deltas, not yet taken

    # -- the shared loop -----------------------------------------------------------------------
    def _submit(self, prompt: Prompt, params: SamplingParams | None) -> str:
        with self._lock:
            rid = self.engine.add_request(prompt, params)
            self._outbox[rid] = deque()
            return rid

    def _step(self, awaited) -> None:
        """One engine step for the caller awaiting request ids `awaited` (it holds the lock); deltas
        go to their requests' boxes. The engine raises EngineStuck rather than stall; should it go
        idle with an awaited request unfinished, that is said here too, never waited on forever."""
        for o in self.engine.step():
            box = self._outbox.get(o.request_id)
            if box is not None:
                box.append(o)
        if not self.engine.has_unfinished():
            left = [self.engine.requests[r] for r in sorted(awaited) if not self.engine.requests[r].all_finished]
            if left:
                raise EngineStuck(f"engine stuck: the engine has nothing left to run but {len(left)} awaited "
                                  f"request(s) never finished: {describe(left)} (a bug)")

    def _drop(self, rids) -> None:
        """A caller gave up (an error, an interrupt): its requests end and their blocks come back."""
        with self._lock:
            for rid in rids:
                self.engine.abort(rid)
                self._forget(rid)

    def _forget(self, rid: str):
        with self._lock:
            self._outbox.pop(rid, None)
            return self.engine.requests.pop(rid, None)

    # -- the API -------------------------------------------------------------------------------
    def generate(self, prompts: Prompt | Seq[Prompt], params: SamplingParams | Seq[SamplingParams] | None = None,
                 on_step=None) -> list[GenerationResult]:
        """Outputs in input order. on_step(engine) is called after each step (progress bars)."""
        items = _as_items(prompts)
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(items)
        if len(plist) != len(items):
            raise SharpinfError(f"{len(items)} prompts but {len(plist)} sampling params")
        results: list[GenerationResult | None] = [None] * len(items)
        rid_to_index: dict[str, int] = {}
        for i, (prompt, p) in enumerate(zip(items, plist)):
            try:
                rid_to_index[self._submit(prompt, p)] = i
            except SharpinfError as exc:
                ids = [int(t) for t in prompt] if _ids_list(prompt) else []
                results[i] = GenerationResult(ids, [], "", "rejected", error=str(exc))
        pending = set(rid_to_index)
        try:
            while pending:
                with self._lock:
                    pending = {r for r in pending if not self.engine.requests[r].all_finished}
                    if pending:
                        self._step(pending)
                if pending and on_step is not None:
                    on_step(self.engine)
        except BaseException:
            self._drop(rid_to_index)
            raise
        for rid, i in rid_to_index.items():
            seq = self._forget(rid)
            results[i] = _result(seq)
            if seq.choices:  # n > 1: the result is choice 0, with every choice in .choices
                results[i].choices = [_result(s) for s in seq.choices]
        return results  # type: ignore[return-value]

    def stream(self, prompt: Prompt, params: SamplingParams | None = None) -> Iterator[RequestOutput]:
        """Token deltas of one request as they are generated (with n > 1, each delta's .index says its
        choice), ending with the finished one (other
        requests, other streams and other threads run alongside; each gets its own deltas).
        The request is queued at once (a bad one raises here); closing the iterator early aborts it."""
        return self._deltas(self._submit(prompt, params))

    def _deltas(self, rid: str) -> Iterator[RequestOutput]:
        try:
            while True:
                with self._lock:
                    box = self._outbox[rid]
                    finished = self.engine.requests[rid].all_finished
                    if not box and not finished:
                        self._step((rid,))
                        finished = self.engine.requests[rid].all_finished
                    outs = list(box)
                    box.clear()
                yield from outs
                if finished:
                    return
        finally:
            with self._lock:
                self.engine.abort(rid)
            self._forget(rid)

    def metrics(self) -> dict:
        with self._lock:
            return self.engine.engine_metrics()
