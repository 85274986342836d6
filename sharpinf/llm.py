"""LLM: the Python API. `LLM(model).generate(prompts, params)` runs them all through the engine.

    llm = LLM("smollm2-135m", backend="emu", max_num_batched_tokens=256)
    outs = llm.generate(["Hello", [{"role": "user", "content": "Hi!"}]], SamplingParams(max_tokens=16))
    for delta in llm.stream("Once upon a time"):   # token deltas as they come
        print(delta.new_text, end="")

A request that cannot run (bad parameters, prompt too long, ...) comes back with
finish_reason "rejected" and its error; the others run as usual. Nothing is dropped.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence as Seq

from sharpinf.engine.llm_engine import LLMEngine, Prompt, RequestOutput
from sharpinf.errors import SharpinfError
from sharpinf.sampling import SamplingParams
from sharpinf.textgen import GenerationResult


def _is_single(prompts) -> bool:
    """A string, a list of ids, or one chat is one prompt; a list of those is many."""
    if isinstance(prompts, str):
        return True
    if isinstance(prompts, (list, tuple)) and prompts and all(isinstance(p, dict) for p in prompts):
        return True
    return isinstance(prompts, (list, tuple)) and bool(prompts) and all(isinstance(p, int) for p in prompts)


class LLM:
    def __init__(self, model, backend=None, **engine_config):
        self.engine = LLMEngine(model, backend=backend, **engine_config)
        self.tokenizer = self.engine.tokenizer

    def generate(self, prompts: Prompt | Seq[Prompt], params: SamplingParams | Seq[SamplingParams] | None = None,
                 on_step=None) -> list[GenerationResult]:
        """Outputs in input order. on_step(engine) is called after each step (progress bars)."""
        items = [prompts] if _is_single(prompts) else list(prompts)
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(items)
        if len(plist) != len(items):
            raise SharpinfError(f"{len(items)} prompts but {len(plist)} sampling params")
        results: list[GenerationResult | None] = [None] * len(items)
        rid_to_index: dict[str, int] = {}
        for i, (prompt, p) in enumerate(zip(items, plist)):
            try:
                rid_to_index[self.engine.add_request(prompt, p)] = i
            except SharpinfError as exc:
                prompt_ids = prompt if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt) else []
                results[i] = GenerationResult(list(prompt_ids), [], "", "rejected", error=str(exc))
        while self.engine.has_unfinished():
            self.engine.step()
            if on_step is not None:
                on_step(self.engine)
        for rid, i in rid_to_index.items():
            seq = self.engine.requests.pop(rid)
            results[i] = GenerationResult(list(seq.prompt_ids), list(seq.output_ids), seq.stop.text,
                                          seq.finish_reason, seq.metrics.to_json())
        return results  # type: ignore[return-value]

    def stream(self, prompt: Prompt, params: SamplingParams | None = None) -> Iterator[RequestOutput]:
        """Token deltas of one request as they are generated (other requests may run alongside)."""
        rid = self.engine.add_request(prompt, params)
        try:
            while True:
                outs = [o for o in self.engine.step() if o.request_id == rid]
                yield from outs
                if any(o.finished for o in outs) or self.engine.requests[rid].is_finished:
                    return
        finally:
            self.engine.abort(rid)
            self.engine.requests.pop(rid, None)

    def metrics(self) -> dict:
        return self.engine.engine_metrics()
