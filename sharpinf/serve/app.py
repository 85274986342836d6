"""The FastAPI app: OpenAI's routes over an EngineLoop, plus /health, /metrics, /tokenize, /detokenize.

Handlers never step the engine: they submit (in a worker thread, since a step holds the engine's
lock), then await their request's deltas. A streaming client that goes away, or one waiting for
a whole answer that disconnects, aborts its request: the engine frees its blocks at once.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from typing import AsyncIterator, Sequence

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException

from sharpinf.engine.llm_engine import RequestOutput
from sharpinf.errors import ContextLengthError, SharpinfError
from sharpinf.serve import protocol as P
from sharpinf.serve.engine_loop import EngineFailure, EngineLoop, ShuttingDown
from sharpinf.serve.limits import Limits, PromptLimits, context_error, read_body
from sharpinf.serve.metrics import ServerMetrics

DISCONNECT_POLL_S = 0.25  # how often a non-streaming request checks that its client is still there


class RequestIdHeader:
    """x-request-id on every response, streams and errors too: the client's, else a fresh one. The
    request's id -- the client's when it is a plain token -- is left in scope["request_id"]."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = Headers(scope=scope).get("x-request-id")
        scope["request_id"] = P.request_id(given)
        echo = given or scope["request_id"]

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message).append("x-request-id", echo)
            await send(message)

        await self.app(scope, receive, send_with_id)


def create_app(loop: EngineLoop, model_name: str, limits: Limits | None = None,
               allowed_origins: Sequence[str] = ("*",)) -> FastAPI:
    app = FastAPI(title="sharpinf", description="OpenAI-compatible server over sharpinf's engine")
    # a browser page on another origin may call the API (vLLM's default: any origin, no credentials)
    app.add_middleware(CORSMiddleware, allow_origins=list(allowed_origins), allow_methods=["*"], allow_headers=["*"],
                       expose_headers=["x-request-id"])
    app.add_middleware(RequestIdHeader)  # added last: outermost, so preflights get one too
    limits = limits or Limits()
    started = int(time.time())  # the model card's `created`
    prompt_limits: list[PromptLimits] = []  # built once the engine is ready (it reads the vocabulary)
    metrics = ServerMetrics(lambda: loop.snapshot)
    app.state.metrics = metrics

    @app.exception_handler(P.ApiError)
    async def api_error(_request: Request, exc: P.ApiError):
        if exc.status < 500 and exc.status != 404 or exc.code == "model_not_found":
            metrics.requests.labels("bad_request").inc()
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(P.ApiError(exc.status_code, str(exc.detail), kind).body(), status_code=exc.status_code)

    def ensure_ready() -> None:
        if loop.load_error:
            raise P.ApiError(503, f"the model failed to load: {loop.load_error}", "server_error")
        if not loop.ready:
            raise P.ApiError(503, "the model is loading; retry when /health says ok", "server_error")

    @functools.cache
    def fingerprint() -> str:  # once the engine is ready (it reads the model file)
        return P.system_fingerprint(loop.engine)

    def checks() -> PromptLimits:
        if not prompt_limits:
            prompt_limits.append(PromptLimits.of(limits, loop.engine))
        return prompt_limits[0]

    async def json_body(request: Request):
        raw = await read_body(request, limits.max_body_bytes)
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise P.bad("the request body is not valid JSON (or nests too deeply)") from None

    def check_model(body) -> None:
        name = body.get("model") if isinstance(body, dict) else None
        if name is not None and not isinstance(name, str):
            raise P.bad(f"'model' must be a string, got {type(name).__name__}", "model")
        if name is not None and name != model_name:
            raise P.ApiError(404, f"the model '{name}' does not exist; this server serves '{model_name}'",
                             "invalid_request_error", "model", "model_not_found")

    # -- health, models, metrics ------------------------------------------------------------------
    @app.get("/health")
    async def health():
        if loop.load_error:
            return JSONResponse({"status": "error", "error": loop.load_error}, status_code=503)
        if not loop.ready:
            return JSONResponse({"status": "loading"}, status_code=503)
        return {"status": "ok"}

    def card() -> dict:
        c = {"id": model_name, "object": "model", "created": started, "owned_by": "sharpinf"}
        if loop.ready:
            c["max_model_len"] = loop.engine.max_model_len
        return c

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{model_id:path}")  # :path -- served names may hold a slash (org/model)
    async def model(model_id: str):
        check_model({"model": model_id})
        return card()

    @app.get("/metrics")
    async def prometheus():
        data = await asyncio.to_thread(metrics.exposition)
        return Response(data, media_type="text/plain; version=0.0.4; charset=utf-8")

    # -- tokenizer ---------------------------------------------------------------------------------
    @app.post("/tokenize")
    async def tokenize(request: Request):
        ensure_ready()
        body = await json_body(request)
        check_model(body)
        if not isinstance(body, dict) or ("prompt" in body) == ("messages" in body):
            raise P.bad("give 'prompt' (a string) or 'messages' (a chat), one of them")
        prompt = P._messages(body) if "messages" in body else body["prompt"]
        if "prompt" in body and not isinstance(prompt, str):
            raise P.bad("'prompt' must be a string", "prompt")
        if isinstance(prompt, str):
            P.text_field(prompt, "prompt")
        checks().check_prompt(prompt, "messages" if "messages" in body else "prompt")
        ids = await encode(prompt)
        return {"tokens": ids, "count": len(ids), "max_model_len": loop.engine.max_model_len}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        ensure_ready()
        body = await json_body(request)
        check_model(body)
        ids = body.get("tokens") if isinstance(body, dict) else None
        vocab = loop.engine.cfg.n_vocab

        def decode() -> str | None:  # in a worker thread: a long list is not checked on the event loop
            if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
                                                    for t in ids):
                return None
            return loop.engine.tokenizer.decode(ids)  # the tokenizer is read-only: no lock

        text = await asyncio.to_thread(decode)
        if text is None:
            raise P.bad(f"'tokens' must be a list of token ids in [0, {vocab})", "tokens")
        return {"prompt": text}

    # -- completions ---------------------------------------------------------------------------------
    async def encode(prompt) -> list[int]:
        """Text or a chat -> ids in a worker thread, off the engine's thread (the tokenizer is read-only)."""
        try:
            return await asyncio.to_thread(loop.engine.encode, prompt)
        except SharpinfError as exc:  # a chat template that refuses the messages, no template, ...
            raise P.bad(str(exc)) from None

    async def submit(parsed: P.Parsed):
        param = "messages" if parsed.chat else "prompt"
        checks().check_prompt(parsed.prompt, param)
        ids = await encode(parsed.prompt)
        checks().check_tokens(len(ids), param)
        grammar = None
        if parsed.params.structured is not None:  # compiled here, off the engine thread (a schema may take long)
            try:
                grammar = await asyncio.to_thread(loop.engine.grammars.compile, parsed.params.structured)
            except SharpinfError as exc:
                raise P.bad(str(exc), parsed.field(getattr(exc, "param", None))) from None
        try:
            return await asyncio.to_thread(loop.submit, ids, parsed.params, asyncio.get_running_loop(), grammar)
        except ShuttingDown as exc:
            raise P.ApiError(503, str(exc), "server_error", None, "server_shutting_down") from None
        except EngineFailure as exc:
            raise P.ApiError(503, f"the engine is not running: {exc}", "server_error") from None
        except ContextLengthError as exc:
            raise context_error(loop.engine.token_limit(), str(exc), param) from None
        except SharpinfError as exc:  # a bad logit_bias id, a grammar llguidance rejects, n > max_num_seqs, ...
            raise P.bad(str(exc), parsed.field(getattr(exc, "param", None))) from None

    def _abort(rid: str) -> None:
        try:
            loop.abort(rid)
        except EngineFailure:
            pass  # the engine is gone: nothing left to free

    def abort_later(rid: str) -> None:
        """Abort from a worker thread (it waits for the engine's next step boundary), not awaited."""
        asyncio.get_running_loop().run_in_executor(None, _abort, rid)

    async def complete(request: Request, chat: bool):
        ensure_ready()
        body = await json_body(request)
        check_model(body)
        if isinstance(body, dict):
            checks().check_stops(body)
        parsed = P.parse(body, chat)
        t0 = time.perf_counter()
        rid, queue = await submit(parsed)
        # one id, one `created`, one fingerprint for the whole answer, in every chunk of a stream
        head = P.Head(P.new_id(chat, request.scope["request_id"]), model_name, int(time.time()), fingerprint())
        tok = loop.engine.tokenizer
        if parsed.stream:
            return StreamingResponse(stream(request, parsed, rid, queue, head, tok, t0), media_type="text/event-stream")
        return await whole(request, parsed, rid, queue, head, tok, t0)

    def timing(t0: float):
        last = [None]

        def tick() -> None:
            now = time.perf_counter()
            if last[0] is None:
                metrics.ttft.observe(now - t0)
            else:
                metrics.itl.observe(now - last[0])
            last[0] = now

        return tick

    def ended(exc: Exception) -> P.ApiError:
        """The error for a request the engine ended: a failure, or cut at shutdown."""
        if isinstance(exc, ShuttingDown):
            metrics.requests.labels("cut").inc()
            return P.ApiError(503, str(exc), "server_error", None, "server_shutting_down")
        metrics.requests.labels("error").inc()
        return P.ApiError(500, f"the engine failed: {exc}", "server_error")

    async def whole(request, parsed: P.Parsed, rid, queue, head: P.Head, tok, t0):
        tick, out, get, checked = timing(t0), None, None, time.perf_counter()
        last: dict[int, RequestOutput] = {}  # each choice's latest output (its whole text so far)
        lps: dict[int, list] = {}
        while out is None or not out.all_done:
            get = get or asyncio.ensure_future(queue.get())  # kept across polls: no output is ever dropped
            await asyncio.wait({get}, timeout=DISCONNECT_POLL_S)
            now = time.perf_counter()
            if not get.done() or now - checked >= DISCONNECT_POLL_S:  # tokens may come faster than the poll
                checked = now
                if await request.is_disconnected():
                    get.cancel()
                    abort_later(rid)
                    metrics.requests.labels("aborted").inc()
                    return Response(status_code=499)
            if not get.done():
                continue
            out, get = get.result(), None
            if isinstance(out, Exception):
                raise ended(out)
            if out.new_token_ids:
                tick()
                metrics.generation_tokens.inc(len(out.new_token_ids))
            last[out.index] = out
            lps.setdefault(out.index, []).extend(out.new_logprobs or [])
        if out.finish_reason == "rejected":
            raise P.bad(out.error or "the request could not run")
        metrics.requests.labels("ok").inc()
        metrics.prompt_tokens.inc(len(out.prompt_ids))
        choices = []
        for i in sorted(last):
            o, lp = last[i], None
            if parsed.logprobs is not None:
                lp = P.chat_logprobs(tok, lps[i]) if parsed.chat else P.completion_logprobs(tok, lps[i], P.TextOffsets(tok))
            choices.append(P.choice_body(i, o.text, P.FINISH.get(o.finish_reason, o.finish_reason), lp, parsed.chat,
                                         reasoning=parsed.reasoning))
        use = P.usage(len(out.prompt_ids), sum(len(o.token_ids) for o in last.values()))
        return P.completion_body(head, choices, use, parsed.chat)

    async def stream(request, parsed: P.Parsed, rid, queue, head: P.Head, tok, t0) -> AsyncIterator[str]:
        def sse(obj) -> str:
            return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

        tick, finished = timing(t0), False
        firsts: set[int] = set()  # choices whose first chunk went out
        offsets: dict[int, P.TextOffsets] = {}
        generated: dict[int, int] = {}
        try:
            while not finished:
                out: RequestOutput | Exception = await queue.get()
                if isinstance(out, Exception):  # the engine ended the request (or shutdown cut it)
                    finished = True
                    yield sse(ended(out).body())
                    break
                finished = out.all_done
                if out.finish_reason == "rejected":
                    metrics.requests.labels("bad_request").inc()
                    yield sse(P.bad(out.error or "the request could not run").body())
                    break
                if out.new_token_ids:
                    tick()
                    metrics.generation_tokens.inc(len(out.new_token_ids))
                generated[out.index] = len(out.token_ids)
                lp = None
                if parsed.logprobs is not None and out.new_logprobs:
                    lp = (P.chat_logprobs(tok, out.new_logprobs) if parsed.chat
                          else P.completion_logprobs(tok, out.new_logprobs, offsets.setdefault(out.index, P.TextOffsets(tok))))
                first = out.index not in firsts
                if out.new_text or lp or out.finished or (first and parsed.chat):
                    finish = P.FINISH.get(out.finish_reason, out.finish_reason) if out.finished else None
                    choice = P.choice_body(out.index, out.new_text, finish, lp, parsed.chat, chunk=True, first=first)
                    yield sse(P.completion_body(head, [choice], None, parsed.chat, chunk=True))
                    firsts.add(out.index)
                if finished:
                    metrics.requests.labels("ok").inc()
                    metrics.prompt_tokens.inc(len(out.prompt_ids))
                    if parsed.include_usage:
                        yield sse(P.usage_chunk(head, parsed.chat, P.usage(len(out.prompt_ids), sum(generated.values()))))
            yield "data: [DONE]\n\n"
        finally:
            if not finished:  # the client went away (or the engine failed): free the request's blocks
                abort_later(rid)
                metrics.requests.labels("aborted").inc()

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await complete(request, chat=True)

    return app
