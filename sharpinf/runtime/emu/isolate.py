"""run_isolated: call fn(*args) in a forked child so a kernel that faults
(out-of-bounds write, stack overflow) or hangs cannot take the caller down.

The child's return value comes back pickled; an exception in the child is
re-raised in the parent; death by a signal or a timeout raises BackendError.
Use it in tests for kernels that are expected to (or might) crash."""

from __future__ import annotations

import os
import pickle
import select
import signal
import time
from typing import Any, Callable

from sharpinf.errors import BackendError


def run_isolated(fn: Callable[..., Any], *args: Any, timeout: float = 120.0) -> Any:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into the caller's stack
        os.close(r)
        try:
            import faulthandler

            faulthandler.disable()  # the parent reports the crash; no traceback dump
            try:
                payload = pickle.dumps(("ok", fn(*args)))
            except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
                try:
                    payload = pickle.dumps(("err", exc))
                except Exception:
                    payload = pickle.dumps(("err", BackendError(f"{type(exc).__name__}: {exc}")))
            with os.fdopen(w, "wb") as f:
                f.write(payload)
        finally:
            os._exit(0)
    os.close(w)
    chunks, deadline = [], time.monotonic() + timeout
    with os.fdopen(r, "rb") as f:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([f], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise BackendError(f"run_isolated: {getattr(fn, '__name__', fn)} timed out after {timeout:g} s")
            b = os.read(f.fileno(), 1 << 16)
            if not b:
                break
            chunks.append(b)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sig = signal.Signals(os.WTERMSIG(status)).name
        raise BackendError(f"run_isolated: {getattr(fn, '__name__', fn)} crashed with {sig}")
    if not chunks:
        raise BackendError(f"run_isolated: child exited with status {os.waitstatus_to_exitcode(status)} and no result")
    tag, val = pickle.loads(b"".join(chunks))
    if tag == "err":
        raise val
    return val
