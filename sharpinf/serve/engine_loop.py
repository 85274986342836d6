"""EngineLoop: the one thread that steps an LLMEngine for an asyncio server.

Nothing else touches the engine. Handlers put commands on a queue -- add a request (its prompt
already tokenized in the handler's thread), abort one, or run a query -- and the engine thread
takes them between steps, so a new request joins the running batch at the next step and an
abort lands within one step (a lock would let the stepping thread starve them: locks are not
fair). Each RequestOutput goes to its request's asyncio.Queue through the event loop
(thread-safe); a finished or aborted request is forgotten at once, so its blocks are free and
nothing accumulates. After every step the loop publishes a snapshot of the engine's metrics for
/metrics. The engine is built in this thread (loading and compiling take time): until then the
server answers /health with "loading".
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable

from sharpinf.engine.llm_engine import LLMEngine, RequestOutput
from sharpinf.errors import SharpinfError
from sharpinf.params import SamplingParams

log = logging.getLogger("sharpinf.serve")


@dataclass
class Subscriber:
    queue: asyncio.Queue
    loop: asyncio.AbstractEventLoop


class EngineFailure(RuntimeError):
    """The engine raised while stepping: every live request ends with this (the details are logged)."""


class ShuttingDown(EngineFailure):
    """The server is stopping: a new request is refused, a running one past the bound is cut."""


class EngineLoop:
    def __init__(self, make_engine: Callable[[], LLMEngine]):
        self._make_engine = make_engine
        self.engine: LLMEngine | None = None
        self.load_error: str | None = None  # the engine could not be built (or its thread died)
        self.snapshot: dict | None = None  # engine_metrics() after the last step
        self._cmds: deque = deque()  # (kind, args, Future); deque appends and pops are thread-safe
        self._wake = threading.Event()
        self._subs: dict[str, Subscriber] = {}  # engine thread only
        self._stop = False
        self._closing = False  # shutting down: no new request is added
        self._thread = threading.Thread(target=self._run, name="sharpinf-engine", daemon=True)

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout)

    def close(self) -> None:
        """Take no new request (each is refused with ShuttingDown); running ones go on."""
        self._closing = True

    def cut_all(self, why: str) -> int:
        """End every running request now with ShuttingDown(why), freeing its blocks; how many."""
        return self._command("cut", why)

    @property
    def ready(self) -> bool:
        return self.engine is not None and self.load_error is None

    # -- what handlers call (from worker threads: they wait for the engine's next step boundary) ---
    def _command(self, kind: str, *args) -> Any:
        if self.load_error:
            raise EngineFailure(self.load_error)
        if self._stop:
            raise EngineFailure("the server has stopped")
        fut: Future = Future()
        self._cmds.append((kind, args, fut))
        self._wake.set()
        return fut.result()

    def submit(self, prompt_ids: list[int], params: SamplingParams, loop: asyncio.AbstractEventLoop,
               grammar=None) -> tuple[str, asyncio.Queue]:
        """Queue a request; a RequestError (bad ids, too long, can never fit) is raised here.
        grammar: params.structured compiled by the caller's thread (engine.grammars.compile)."""
        queue: asyncio.Queue = asyncio.Queue()
        return self._command("add", prompt_ids, params, Subscriber(queue, loop), grammar), queue

    def abort(self, rid: str) -> None:
        """End a request (its client went away): its blocks are freed, its queue gets nothing more."""
        self._command("abort", rid)

    def query(self, fn: Callable[[LLMEngine], Any]) -> Any:
        """fn(engine) run in the engine thread between steps (tests and tools; keep it short)."""
        return self._command("query", fn)

    # -- the engine thread -------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            engine = self._make_engine()
            if engine is None:
                raise RuntimeError("the engine factory returned no engine")
        except Exception as exc:  # the server says why it cannot serve, and keeps answering
            self.load_error = f"{type(exc).__name__}: {exc}"
            self._drain_failed()
            return
        self.engine = engine
        self.snapshot = engine.engine_metrics()
        # llguidance's tokenizer (a second or so for a large vocabulary) in the background, so the
        # first structured request does not wait for it; without llguidance, nothing to prepare
        threading.Thread(target=_prepare_grammars, args=(engine,), name="sharpinf-grammars", daemon=True).start()
        while not self._stop:
            try:
                self._wake.clear()  # before draining: a command queued after this sets it again
                self._drain(engine)
                if not engine.has_unfinished():
                    self._wake.wait()
                    continue
                try:
                    outputs = engine.step()
                except Exception:  # a bug: every live request ends with an error, the server stays up
                    log.exception("engine step failed")
                    self._fail_all(engine, "the engine failed on this step (see the server's log)")
                    continue
                for out in outputs:
                    self._deliver(engine, out)
                self.snapshot = engine.engine_metrics()
            except Exception:  # never let the thread die with requests waiting on it
                log.exception("engine loop error")
                self._fail_all(engine, "the engine loop failed (see the server's log)")
        self._drain_failed()

    def _drain(self, engine: LLMEngine) -> None:
        while self._cmds:
            kind, args, fut = self._cmds.popleft()
            try:
                if kind == "add":
                    if self._closing:
                        raise ShuttingDown("the server is shutting down; it takes no new requests")
                    ids, params, sub, grammar = args
                    rid = engine.add_request(ids, params, grammar=grammar)
                    self._subs[rid] = sub
                    fut.set_result(rid)
                elif kind == "abort":
                    (rid,) = args
                    if self._subs.pop(rid, None) is not None:
                        engine.abort(rid)
                        engine.requests.pop(rid, None)
                    fut.set_result(None)
                elif kind == "cut":
                    fut.set_result(self._end_all(engine, ShuttingDown(args[0])))
                else:
                    fut.set_result(args[0](engine))
            except BaseException as exc:  # the caller gets the error (a RequestError for a bad request)
                fut.set_exception(exc)

    def _drain_failed(self) -> None:
        why = EngineFailure(self.load_error or "the server is stopping")
        while self._cmds:
            self._cmds.popleft()[2].set_exception(why)

    def _send(self, sub: Subscriber, item) -> bool:
        try:
            sub.loop.call_soon_threadsafe(sub.queue.put_nowait, item)
            return True
        except RuntimeError:  # its event loop is closed: nobody is listening any more
            return False

    def _deliver(self, engine: LLMEngine, out: RequestOutput) -> None:
        sub = self._subs.get(out.request_id)
        if out.all_done:  # (n > 1: the last of its choices)
            self._subs.pop(out.request_id, None)
            engine.requests.pop(out.request_id, None)
        if sub is not None and not self._send(sub, out) and not out.all_done:
            self._subs.pop(out.request_id, None)
            engine.abort(out.request_id)
            engine.requests.pop(out.request_id, None)

    def _fail_all(self, engine: LLMEngine, why: str) -> None:
        self._end_all(engine, EngineFailure(why))

    def _end_all(self, engine: LLMEngine, error: EngineFailure) -> int:
        n = len(self._subs)
        for rid, sub in list(self._subs.items()):
            try:
                engine.abort(rid)
            except Exception:
                log.exception("abort after a failure")
            engine.requests.pop(rid, None)
            self._send(sub, error)
        self._subs.clear()
        return n


def _prepare_grammars(engine: LLMEngine) -> None:
    try:
        engine.grammars.prepare()
    except SharpinfError:  # llguidance missing or no EOS: a structured request says so itself
        pass
