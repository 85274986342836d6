"""LLMEngine: requests in, token deltas out, one packed forward step at a time.

    add_request(prompt, params) -> request id     (validated here: a bad request is rejected
                                                    with a RequestError, never dropped later)
    step() -> [RequestOutput]                      (schedule -> run -> sample -> stop rules)
    abort(request id)
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sharpinf.engine.block_manager import BlockManager
from sharpinf.engine.fork import ChoiceForker
from sharpinf.engine.config import EngineConfig, run_context, step_capacity
from sharpinf.engine.stats import EngineMetrics, StepTimes
from sharpinf.engine.kv_budget import KVBudget, plan_kv_budget
from sharpinf.engine.logprobs import TokenLogprobs
from sharpinf.engine.model_runner import ModelRunner, RunnerStep
from sharpinf.engine.scheduler import Scheduler
from sharpinf.engine.sequence import PENDING, Sequence
from sharpinf.engine.speculative import Speculator
from sharpinf.engine.watchdog import Watchdog, check_none_lost, describe
from sharpinf.engine.grammar import Grammar, Grammars
from sharpinf.errors import ContextLengthError, EngineStuck, RequestError, SharpinfError
from sharpinf.step.forward import ForwardPass
from sharpinf.step.kv_pool import KVPool
from sharpinf.model.loader import LoadedModel
from sharpinf.model.registry import open_model
from sharpinf.model.tokenizer import Tokenizer
from sharpinf.ops.sampling import RequestSeeds
from sharpinf.runtime.backend import Backend
from sharpinf.runtime.select import get_backend
from sharpinf.params import SamplingParams
from sharpinf.textgen import StopChecker, check_prompt

Prompt = str | list[int] | list[dict]  # text, token ids, or a chat (list of {"role", "content"})


@dataclass
class RequestOutput:
    request_id: str
    new_token_ids: list[int]
    new_text: str
    token_ids: list[int]  # every token generated so far (a fresh list)
    text: str
    finished: bool
    finish_reason: str | None
    prompt_ids: list[int]  # the request's own list, shared: do not modify
    new_logprobs: list[TokenLogprobs] | None = None  # with SamplingParams.logprobs: one per new token
    error: str | None = None  # why a rejected request could not run (or a structured one stopped early)
    index: int = 0  # the choice (SamplingParams.n > 1: 0 .. n-1); `finished` is this choice's
    request_finished: bool | None = None  # every choice of the request finished (None: as `finished`)

    @property
    def all_done(self) -> bool:
        """The request is over: the last output a caller waits for."""
        return self.finished if self.request_finished is None else self.request_finished


class LLMEngine:
    def __init__(self, model: str | Path | LoadedModel, backend: str | Backend | None = None, **config):
        unknown = sorted(set(config) - set(EngineConfig.__dataclass_fields__))
        if unknown:
            raise SharpinfError(f"unknown engine option(s) {', '.join(unknown)}; the options are "
                                f"{', '.join(f for f in EngineConfig.__dataclass_fields__ if f != 'backend')}")
        self.config = EngineConfig(backend=backend if isinstance(backend, str) or backend is None else backend.name, **config)
        self.backend = backend if isinstance(backend, Backend) else get_backend(self.config.backend)
        self.model = open_model(model)
        self.cfg = self.model.config
        self.tokenizer = Tokenizer.from_gguf_metadata(self.model.metadata, where=str(self.model.path))
        self.grammars = Grammars(self.tokenizer, self.cfg.n_vocab)  # llguidance's tokenizer: built on first use
        # weights, step buffers and kernels first, then the KV pool from what is left, then graphs over it
        self.max_model_len = run_context(self.cfg, self.config.max_model_len)
        self.model = self.model.with_context(self.max_model_len)  # LongRoPE's tables follow the run's context
        self.cfg = self.model.config
        self.fp = ForwardPass(self.model, self.backend, capacity=step_capacity(self.config, self.max_model_len),
                              kv_dtype=self.config.kv_dtype, kernels=self.config.kernels)
        self.fp.freeze()
        # a draft model's weights, buffers and KV pool come before the target's pool takes what is left
        self.spec = None if self.config.speculative is None else Speculator(self.config.speculative, self)
        # a draft model's weights, buffers and KV pool come before the target's pool takes what is left
        eager = self.config.enforce_eager
        self.budget: KVBudget = plan_kv_budget(self.backend, self.cfg, self.config,
                                               graph_launches=0 if eager else self.fp.graph_launches())
        self.pool = KVPool(self.backend, self.cfg, self.budget.num_blocks, self.config.block_size, self.config.kv_dtype)
        self.graph_report = None if eager else self.fp.capture_graphs(self.pool)
        self.fp.use_graphs = not eager
        self.blocks = BlockManager(self.budget.num_blocks, self.config.block_size, self.config.enable_prefix_caching,
                                   window=self.fp.cfg.kv_window)
        self.runner = ModelRunner(self.fp, self.pool)
        self.scheduler = Scheduler(self.config, self.blocks, on_release=self._released)
        self.requests: dict[str, Sequence] = {}
        self.live: dict[str, Sequence] = {}  # the unfinished requests: each is waiting or running
        self.forker = ChoiceForker(self.blocks, self.scheduler, self.runner.slots, self.stop_rules, self.live)
        self.ended = 0  # requests finished, rejected or aborted after they were queued
        self.watchdog = Watchdog(bound=self.token_limit())
        self.metrics = EngineMetrics()
        self.last_step_times: StepTimes | None = None
        self._ids = itertools.count()
        self._seeds = RequestSeeds(self.config.seed)
        self._inflight: RunnerStep | None = None  # async scheduling: the step submitted, not yet collected

    def _released(self, seq: Sequence) -> None:
        """seq left the running set (finished or preempted)."""
        self.runner.release(seq)
        if self.spec is not None:
            self.spec.release(seq)

    # -- requests ------------------------------------------------------------------------------
    def encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
            return self.tokenizer.apply_chat(prompt)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, (int, np.integer)) for t in prompt):
            return [int(t) for t in prompt]
        raise RequestError("a prompt is a string, a list of token ids, or a chat (a list of {'role', 'content'} dicts)")

    def check(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Everything that would make a request impossible, said now rather than later."""
        if params.n > self.config.max_num_seqs:
            raise RequestError(f"n = {params.n} choices, but at most max_num_seqs = {self.config.max_num_seqs} "
                               "sequences run at once (the choices run side by side)", "n")
        ctx, n = self.max_model_len, len(prompt_ids)
        check_prompt(prompt_ids, self.cfg.n_vocab, ctx)
        bad = [i for i, _ in params.logit_bias if i >= self.cfg.n_vocab]
        if bad:
            raise RequestError(f"logit_bias names token id {bad[0]}, outside the vocabulary (0..{self.cfg.n_vocab - 1})",
                               "logit_bias")
        total = self.token_limit() if params.max_tokens is None else n + params.max_tokens
        if total > ctx:
            raise ContextLengthError(f"prompt ({n}) + max_tokens ({params.max_tokens}) = {total} exceeds the context length {ctx}")
        need = -(-total // self.config.block_size)
        if need > self.budget.num_blocks:
            raise ContextLengthError(f"request needs {need} KV blocks ({total} tokens) but the pool has only "
                               f"{self.budget.num_blocks} ({self.budget.tokens} tokens): it could never run")

    def token_limit(self) -> int:
        """The most tokens (prompt + output) one request may hold: the context, or the KV pool if
        smaller. A request without max_tokens runs until it reaches this (finish "context")."""
        return min(self.max_model_len, self.budget.tokens)

    def stop_rules(self, params: SamplingParams, n_prompt: int) -> StopChecker:
        """The stop rules of a sequence with an n_prompt-token prompt (its room: token_limit)."""
        return StopChecker(params, self.tokenizer, context_left=self.token_limit() - n_prompt)

    def add_request(self, prompt: Prompt, params: SamplingParams | None = None, request_id: str | None = None,
                    grammar: Grammar | None = None) -> str:
        """Queue a request; a SharpinfError says why it can never run (counted as rejected).
        grammar: params.structured already compiled (`self.grammars.compile`, safe on any thread: the
        server compiles off the engine thread, whose steps a large schema would otherwise hold up)."""
        try:
            params = params or SamplingParams()
            if not isinstance(params, SamplingParams):
                raise RequestError(f"params must be SamplingParams, got {type(params).__name__}")
            ids = self.encode(prompt)
            self.check(ids, params)
            rid = request_id if request_id is not None else str(next(self._ids))
            if rid in self.requests:
                raise RequestError(f"request id {rid!r} is already in use")
            if params.structured is not None and grammar is None:
                grammar = self.grammars.compile(params.structured)
        except SharpinfError:
            self.metrics.rejected += 1
            raise
        seq = Sequence(rid, ids, params, self._seeds.seed_for(params), self.stop_rules(params, len(ids)))
        seq.grammar = grammar
        self.requests[rid] = seq
        self.live[seq.key] = seq
        self.scheduler.add(seq)
        self.metrics.prompt_tokens += len(ids)
        return rid

    def abort(self, request_id: str) -> None:
        """End every unfinished choice of the request."""
        seq = self.requests.get(request_id)
        for s in (seq.choices or [seq]) if seq is not None else []:
            if not s.is_finished:
                self._finish(s, "aborted")

    def has_unfinished(self) -> bool:
        """Work left: queued sequences, or unfinished requests the scheduler lost (step() says so)."""
        return self.scheduler.has_work() or bool(self.live)

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.drop_pending()  # a token of a step still in flight is never emitted
        self.live.pop(seq.key, None)
        self.ended += 1
        seq.finish_reason = reason
        seq.metrics.finished = time.perf_counter()
        self.scheduler.finish(seq)
        if reason != "rejected":
            self.metrics.finished += 1

    def _reject_unschedulable(self) -> list[RequestOutput]:
        """Nothing could be scheduled with work pending: the request at the head of the queue
        cannot be admitted even with every block free. It is rejected with the reason (its
        output says so, so a stream ends); the others keep their place and run."""
        sch = self.scheduler
        if sch.running or not sch.waiting:  # the scheduler guarantees progress here: a bug, said plainly
            raise EngineStuck(f"engine stuck: the scheduler scheduled nothing with {len(sch.running)} running, "
                              f"{len(sch.waiting)} waiting and {self.blocks.num_free}/{self.blocks.num_blocks} blocks "
                              f"free: {describe(list(sch.running) + list(sch.waiting))} (a bug)")
        seq = sch.waiting[0]
        need = -(-len(seq.tokens) // self.config.block_size)
        seq.error = (f"request needs {need} KV blocks for its {len(seq.tokens)} tokens at once, but only "
                     f"{self.blocks.num_free} of {self.blocks.num_blocks} can be free")
        self._finish(seq, "rejected")
        self.metrics.rejected += 1
        return [RequestOutput(seq.request_id, [], "", seq.output_ids, seq.stop.text, True, "rejected", seq.prompt_ids,
                              error=seq.error)]

    def _no_allowed_token(self, seq: Sequence) -> RequestOutput:
        """A mask that allowed no id (a grammar in an error state): the request ends ("stop") with
        what it has, and says why."""
        why = seq.grammar.error if seq.grammar is not None else None
        seq.error = f"structured output: no token is allowed next ({why or 'the grammar allows nothing'})"
        self._finish(seq, "stop")
        text = seq.stop.text
        delta = text[seq.sent_chars:]
        seq.sent_chars = len(text)
        return RequestOutput(seq.request_id, [], delta, seq.output_ids, text, True, "stop", seq.prompt_ids,
                             error=seq.error, index=seq.index)

    # -- the loop ------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One step; raises EngineStuck (a bug) rather than let a caller's loop spin forever."""
        outputs = self._step()
        sch = self.scheduler
        check_none_lost(self.live, sch.waiting, sch.running)
        self.watchdog.after_step(len(outputs), self.ended, self.live)
        return outputs

    def _step(self) -> list[RequestOutput]:
        """Sync: schedule, submit, collect one step. Async (EngineConfig.async_scheduling): schedule
        and submit step n+1, then collect step n (the one in flight since the last call) while the
        device runs n+1; the first call submits two steps, a call with nothing left to schedule
        only collects."""
        t0 = time.perf_counter()
        if not self.config.async_scheduling:
            step = self._submit()
            t1 = time.perf_counter()
            if step is None:
                return self._reject_unschedulable() if self.scheduler.has_work() else []
            return self._collect(step, t0, t1)
        if self._inflight is None:
            self._inflight = self._submit()
            if self._inflight is None:
                return self._reject_unschedulable() if self.scheduler.has_work() else []
        step, self._inflight = self._inflight, self._submit()
        outputs = self._collect(step, t0, time.perf_counter())
        if self._inflight is not None:  # its grammars' masks, now that their last tokens are in
            self.runner.finish(self._inflight)
        return outputs

    def _submit(self) -> RunnerStep | None:
        """Schedule and submit a step (None: nothing to schedule). Each chunk's tokens count as
        computed from here on (stream order makes its K/V there before any later step reads it);
        a chunk that samples appends a PENDING token, which the scheduler sees as a decode."""
        if self.spec is not None:
            self.spec.propose(self.scheduler.running)
        chunks = self.scheduler.schedule()
        if not chunks:
            return None
        self.pool.copy_blocks(self.blocks.take_copies())  # copy on write (forked choices), before the step
        step = self.runner.submit(chunks)
        for r, c in zip(step.first_row, step.samplers):
            if c.seq.drafts:  # its picks settle what it emits when collected
                continue
            c.seq.tokens.append(PENDING)
            c.seq.pending += 1
            c.seq.feed_row = r
        for s, _, _ in step.forking:  # its choices fork when this step is collected, not again
            s.forks_inflight, s.forks = s.forks, 0
        for c in chunks:
            c.seq.num_computed += c.n_tokens
            c.seq.metrics.computed_tokens += c.n_tokens
            self.metrics.tokens_computed += c.n_tokens
            self.blocks.register_full_blocks(c.seq)  # only blocks whose tokens are all real
            self.blocks.slide(c.seq)
        self.metrics.steps += 1
        return step

    def _collect(self, step: RunnerStep, t0: float, t1: float) -> list[RequestOutput]:
        """Wait for a submitted step's ids; put them in place of its PENDING tokens, apply the stop
        rules, detokenize. A sequence that ended (or was aborted) since the step was submitted
        gets nothing: the token is discarded, never emitted."""
        sampled = self.runner.collect(step)
        now = time.perf_counter()
        done: list[tuple[Sequence, RequestOutput]] = []
        forks = {id(f.seq): f for f in self.runner.last_forks}
        for chunk, token in zip(step.chunks, sampled):
            seq = chunk.seq
            if token is None or seq.is_finished:
                continue
            lps = self.runner.last_logprobs.get(seq.key)
            if isinstance(token, list):  # a verified chunk: the kept guesses and the target's pick
                done.append((seq, self._append_run(seq, self.spec.settle(seq, token, self.blocks), now, lps)))
                continue
            if self.spec is not None:
                self.spec.metrics.chunk(0, 0, 1)
            f = forks.pop(id(seq), None)
            children = self.forker.fork(f, now) if f is not None else []  # before its token can end it
            done.append((seq, self._append(seq, token, now, lps)))
            done += [(c, self._append(c, t, now, lp)) for c, t, lp in children]
        for f in forks.values():  # a forking request that ended before its step was collected: no choices
            self.forker.cancel(f)
        last_of = {}  # a request of n > 1 choices is over when all are: said by its last output only
        for seq, o in done:
            if seq.choices:
                o.request_finished = False
                last_of[id(seq.choices)] = (seq, o)
        for seq, o in last_of.values():
            o.request_finished = seq.all_finished
        outputs = [o for _, o in done]
        self.last_step_times = StepTimes(t1 - t0, now - t1, time.perf_counter() - now)
        return outputs

    def _append(self, seq: Sequence, token: int, now: float, lp: TokenLogprobs | None) -> RequestOutput:
        """seq's new token: the stop rules (and its grammar's), the text delta, its output. A negative
        token: the sampler found no allowed id (a stuck grammar)."""
        if token < 0:
            return self._no_allowed_token(seq)
        if seq.pending:  # async scheduling: its first pending token is this step's
            seq.tokens[len(seq.tokens) - seq.pending] = token
            seq.pending -= 1
            if not seq.pending:
                seq.feed_row = -1
            if seq.block_table:  # still holding blocks (not preempted since): its real blocks register now
                self.blocks.register_full_blocks(seq)
        else:
            seq.tokens.append(token)
        self.metrics.generated_tokens += 1
        if seq.metrics.first_token is None:
            seq.metrics.first_token = now
        seq.metrics.token_times.append(now)
        done = seq.stop.add(token)
        if seq.grammar is not None:
            seq.grammar.advance(token)
            if seq.grammar.finished and seq.stop.finish_reason != "stop":  # the document is complete
                done, seq.stop.finish_reason = True, "stop"
        if done:
            self._finish(seq, seq.stop.finish_reason)
        text, stable = seq.stop.text, seq.stop.stable_len()
        delta = text[seq.sent_chars:stable]  # only text that can no longer change
        seq.sent_chars = max(seq.sent_chars, stable)
        return RequestOutput(seq.request_id, [token], delta, seq.output_ids, text, done, seq.finish_reason,
                             seq.prompt_ids, None if lp is None else [lp], index=seq.index)

    def _append_run(self, seq: Sequence, tokens: list[int], now: float, lps) -> RequestOutput:
        """A verified chunk's tokens, one by one through the stop rules (those after a stop are
        dropped), as one output; its blocks then register and slide as a plain step's would."""
        outs, start, computed = [], len(seq.tokens), seq.num_computed
        for i, t in enumerate(tokens):
            if seq.is_finished:  # a stop before the end: kept guesses after it were computed for nothing
                seq.metrics.rolled_back += range(start + i - 1, computed)
                break
            outs.append(self._append(seq, t, now, None if lps is None else lps[i]))
        if not seq.is_finished:
            self.blocks.register_full_blocks(seq)
            self.blocks.slide(seq)
        last = outs[-1]
        last.new_token_ids = [t for o in outs for t in o.new_token_ids]
        last.new_text = "".join(o.new_text for o in outs)
        last.new_logprobs = None if lps is None else [lp for o in outs for lp in o.new_logprobs]
        return last

    def engine_metrics(self) -> dict:
        return self.metrics.to_json(self)
