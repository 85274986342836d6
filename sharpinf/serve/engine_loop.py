"""EngineLoop: the one thread that steps an LLMEngine for an asyncio server.

Handlers call submit() (from a worker thread: it waits for the engine's lock, which a step
holds) and get a request id and an asyncio.Queue; the loop thread puts each RequestOutput of
that request on the queue (through the event loop, thread-safe) and, when the request ends,
forgets it, so its blocks are free and nothing accumulates. abort() ends a request whose client
went away. The engine is built in the loop thread (loading and compiling take time), so the
server answers /health with "loading" meanwhile.
"""

from __future__ import annotations

import asyncio
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

from sharpinf.engine.llm_engine import LLMEngine, Prompt, RequestOutput
from sharpinf.sampling import SamplingParams


@dataclass
class Subscriber:
    queue: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    submitted: float = field(default_factory=time.perf_counter)


class EngineLoop:
    def __init__(self, make_engine: Callable[[], LLMEngine], on_step: Callable[[LLMEngine], None] | None = None):
        self._make_engine = make_engine
        self._on_step = on_step
        self.engine: LLMEngine | None = None
        self.load_error: str | None = None
        self._lock = threading.Lock()  # the engine: add_request, abort and step
        self._wake = threading.Condition(self._lock)
        self._subs: dict[str, Subscriber] = {}
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="sharpinf-engine", daemon=True)

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify_all()
        self._thread.join(timeout)

    @property
    def ready(self) -> bool:
        return self.engine is not None

    # -- what handlers call ----------------------------------------------------------------------
    def submit(self, prompt: Prompt, params: SamplingParams, loop: asyncio.AbstractEventLoop) -> tuple[str, asyncio.Queue]:
        """Queue a request; a RequestError (bad prompt, too long, can never fit) is raised here."""
        queue: asyncio.Queue = asyncio.Queue()
        with self._wake:
            rid = self.engine.add_request(prompt, params)
            self._subs[rid] = Subscriber(queue, loop)
            self._wake.notify_all()
        return rid, queue

    def abort(self, rid: str) -> None:
        """End a request (its client went away): its blocks are freed, its queue gets nothing more."""
        with self._wake:
            if self._subs.pop(rid, None) is not None and self.engine is not None:
                self.engine.abort(rid)
                self.engine.requests.pop(rid, None)

    def call(self, fn: Callable[[LLMEngine], object]):
        """fn(engine) under the engine's lock (tokenize, metrics, ...)."""
        with self._lock:
            return fn(self.engine)

    # -- the loop thread -------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            engine = self._make_engine()
        except Exception as exc:  # the server says why it cannot serve, and keeps answering
            self.load_error = f"{type(exc).__name__}: {exc}"
            return
        with self._lock:
            self.engine = engine
        while True:
            with self._wake:
                while not self._stop and not engine.has_unfinished():
                    self._wake.wait()
                if self._stop:
                    return
                try:
                    outputs = engine.step()
                except Exception:  # a bug: every live request gets the error, the server stays up
                    self._fail_all(traceback.format_exc(limit=3))
                    continue
                for out in outputs:
                    self._deliver(out)
                if self._on_step is not None:
                    self._on_step(engine)

    def _deliver(self, out: RequestOutput) -> None:
        sub = self._subs.get(out.request_id)
        if out.finished:
            self._subs.pop(out.request_id, None)
            self.engine.requests.pop(out.request_id, None)
        if sub is not None:
            sub.loop.call_soon_threadsafe(sub.queue.put_nowait, out)

    def _fail_all(self, why: str) -> None:
        for rid, sub in list(self._subs.items()):
            self.engine.abort(rid)
            self.engine.requests.pop(rid, None)
            sub.loop.call_soon_threadsafe(sub.queue.put_nowait, RuntimeError(why))
        self._subs.clear()
