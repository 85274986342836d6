"""`sharpinf serve`'s shutdown has a bound: on SIGTERM/SIGINT it takes no new request, lets running
ones finish until --shutdown-timeout, then cuts the rest (a stream gets an error frame and
[DONE], a whole-answer request a 503), frees their blocks and exits non-zero; a second signal
cuts at once."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from sharpinf.engine.llm_engine import LLMEngine  # noqa: E402
from sharpinf.params import SamplingParams  # noqa: E402
from sharpinf.serve.engine_loop import ShuttingDown  # noqa: E402
from sharpinf.model.synth import synthetic_model  # noqa: E402
from sharpinf.serve.loopback import LoopbackServer, free_port  # noqa: E402

NAME = "tiny"
CONFIG = dict(num_blocks=96, max_num_seqs=16, max_num_batched_tokens=128)
LONG = {"model": NAME, "prompt": "count", "max_tokens": 1000, "temperature": 0, "ignore_eos": True}


def _model():
    return synthetic_model("llama", "Q8_0", n_embd=128)


class Stream(threading.Thread):
    """A streaming request read to its end: its data frames and when each came."""

    def __init__(self, url: str, body: dict):
        super().__init__(daemon=True)
        self.status = None
        self.url, self.body, self.frames, self.started = url, {**body, "stream": True}, [], threading.Event()

    def run(self):
        with httpx.stream("POST", self.url + "/v1/completions", json=self.body, timeout=60) as r:
            self.status = r.status_code
            for line in r.iter_lines():
                if line.startswith("data: "):
                    self.frames.append((time.monotonic(), line[6:]))
                    self.started.set()

    def error(self) -> tuple[float, dict] | None:
        errors = [(t, json.loads(f)["error"]) for t, f in self.frames if f.startswith('{"error"')]
        return errors[0] if errors else None


def _is_cut(stream: Stream) -> None:
    assert stream.frames[-1][1] == "[DONE]", stream.frames[-3:]
    err = stream.error()
    assert err and err[1]["code"] == "server_shutting_down" and err[1]["type"] == "server_error", stream.frames[-3:]


def test_a_second_signal_cuts_every_request_at_once_and_frees_its_blocks():
    with LoopbackServer(lambda: LLMEngine(_model(), backend="emu", **CONFIG), NAME, ready_timeout=120,
                        shutdown_timeout=60) as s:
        streams = [Stream(s.url, LONG) for _ in range(3)]
        for st in streams:
            st.start()
        whole = {}
        waiter = threading.Thread(target=lambda: whole.update(r=httpx.post(s.url + "/v1/completions", json=LONG,
                                                                            timeout=60)), daemon=True)
        waiter.start()
        assert all(st.started.wait(30) for st in streams)
        deadline = time.monotonic() + 30
        while s.loop.query(lambda e: len(e.live)) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        s.signal()
        time.sleep(0.2)
        with pytest.raises(httpx.ConnectError):  # the listening socket is closed
            httpx.post(s.url + "/v1/completions", json={**LONG, "max_tokens": 2}, timeout=10)
        late = s.loop.submit  # a request already past the door (say, tokenizing) is refused by the engine
        with pytest.raises(ShuttingDown):
            late([5, 6], SamplingParams(max_tokens=2), asyncio.new_event_loop())
        assert all(st.is_alive() for st in streams), "the first signal let running requests go on"
        t0 = time.monotonic()
        s.signal()  # the second: at once
        for st in streams + [waiter]:
            st.join(10)
        assert time.monotonic() - t0 < 5  # usually ~0.1 s: one step and the frames
        for st in streams:
            _is_cut(st)
        assert whole["r"].status_code == 503 and whole["r"].json()["error"]["code"] == "server_shutting_down"
        assert s.shutdown.finish() == 4
        assert s.idle(), "the cut requests still hold KV blocks"


def _serve(timeout_s: float, *extra: str) -> tuple[subprocess.Popen, str]:
    """`sharpinf serve` in its own process (its own signal handling), answering /health."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-c", "from sharpinf.cli import main; main()", "serve", str(_model()), "--backend", "emu",
           "--port", str(port), "--served-model-name", NAME, "--num-blocks", "96", "--max-num-batched-tokens", "128",
           "--shutdown-timeout", str(timeout_s), *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)


def test_sigterm_lets_requests_finish_until_the_bound_then_cuts_with_error_frames(tmp_path):
    """A real process and a real SIGTERM, --shutdown-timeout 2: a short request finishes, two long
    streams get their error frame about 2 s after the signal, and the command exits 1."""
    proc, url = _serve(2)
    try:
        long = [Stream(url, LONG) for _ in range(2)]
        short = Stream(url, {**LONG, "max_tokens": 30})
        for st in long:
            st.start()
        assert all(st.started.wait(30) for st in long), [st.status for st in long]
        short.start()  # the signal at its first frame: 29 tokens still to come, whatever the machine's speed
        assert short.started.wait(30), short.status
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        for st in long + [short]:
            st.join(15)
        rc = proc.wait(15)
        assert short.error() is None and short.frames[-1][1] == "[DONE]"
        assert short.frames[-1][0] > t0, "the short request ended before the signal: it shows nothing"
        assert json.loads(short.frames[-2][1])["choices"][0]["finish_reason"] == "length"
        for st in long:
            _is_cut(st)
            assert 1.5 < st.error()[0] - t0 < 6, st.error()[0] - t0  # the bound, and slack for a busy machine
        assert rc == 1, proc.stderr.read()
        assert "2 request(s)" in proc.stderr.read()
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("signals", [1, 2], ids=["sigint-all-finish", "sigint-twice"])
def test_sigint_exits_0_when_every_request_finished_and_a_second_one_cuts_at_once(signals):
    """A real process and SIGINT (Ctrl-C), --shutdown-timeout 30: one signal lets a short stream
    finish and the command exits 0 (nothing was cut); a second signal soon after cuts a long stream
    at once (an error frame and [DONE] well inside the bound) and the command exits 1. (And a limit
    flag reaches the server: --max-stop-strings 1 makes two stop strings a 400.)"""
    proc, url = _serve(30, "--max-stop-strings", "1")
    try:
        r = httpx.post(url + "/v1/completions", json={**LONG, "max_tokens": 2, "stop": ["a", "b"]}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "stop", r.text
        st = Stream(url, LONG if signals == 2 else {**LONG, "max_tokens": 20})
        st.start()
        assert st.started.wait(30), st.status
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        if signals == 2:
            time.sleep(0.3)
            proc.send_signal(signal.SIGINT)
        st.join(20)
        rc = proc.wait(20)
        err = proc.stderr.read()
        if signals == 1:
            assert st.error() is None and st.frames[-1][1] == "[DONE]" and st.frames[-1][0] > t0
            assert json.loads(st.frames[-2][1])["choices"][0]["finish_reason"] == "length"
            assert rc == 0, err
        else:
            _is_cut(st)
            assert st.error()[0] - t0 < 5, st.error()[0] - t0  # not the 30 s bound: at once
            assert rc == 1, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
