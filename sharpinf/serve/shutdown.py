"""Graceful shutdown with a bound: what SIGTERM and SIGINT do to `sharpinf serve`.

The first signal: uvicorn stops accepting connections and the engine takes no new request (503);
running requests go on for up to `timeout` seconds, then every one still running is cut: a
stream gets an error frame and `data: [DONE]`, a whole-answer request a 503, and the engine frees
its blocks. A second signal cuts at once, the same way. The server never force-exits (uvicorn's
second-SIGINT behaviour), which would drop streams without a word; should the engine itself hang,
uvicorn's own graceful timeout, set past ours, cancels what is left. `cut` says how many requests
were cut: the command exits non-zero when any were.
"""

from __future__ import annotations

import threading
from types import FrameType

import uvicorn

from sharpinf.serve.engine_loop import EngineFailure, EngineLoop

ENGINE_HANG_GRACE_S = 10.0  # past the bound: how long uvicorn waits for cut requests before cancelling them


class Shutdown:
    def __init__(self, loop: EngineLoop, timeout: float):
        if timeout < 0:
            raise ValueError(f"the shutdown timeout must be 0 or more seconds, got {timeout}")
        self.loop, self.timeout = loop, timeout
        self.signals = 0
        self.cut = 0  # requests cut so far
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def begin(self) -> None:
        """One signal (called from the signal handler: it never blocks)."""
        self.signals += 1
        self.loop.close()
        self.cancel()
        if self.signals == 1 and self.timeout > 0:
            why = f"the server is shutting down: the request was still running {self.timeout:g} s after the signal"
            self._timer = threading.Timer(self.timeout, self._cut, (why,))
        else:
            self._timer = threading.Timer(0, self._cut, ("the server is shutting down now (a second signal)",))
        self._timer.daemon = True
        self._timer.start()

    def _cut(self, why: str) -> None:
        with self._lock:
            try:
                self.cut += self.loop.cut_all(why)
            except EngineFailure:
                pass  # the engine never loaded or is gone: nothing runs on it

    def cancel(self) -> None:
        """A pending cut has nothing left to do."""
        if self._timer is not None:
            self._timer.cancel()

    def finish(self) -> int:
        """The server has stopped: cancel a pending cut, wait for one under way (its requests may
        have their error frames before it has counted them); how many were cut."""
        self.cancel()
        if self._timer is not None:
            self._timer.join(ENGINE_HANG_GRACE_S)
        return self.cut


class GracefulServer(uvicorn.Server):
    """uvicorn with the bound above: SIGTERM and SIGINT go to Shutdown, never to a force exit."""

    def __init__(self, config: uvicorn.Config, shutdown: Shutdown):
        config.timeout_graceful_shutdown = shutdown.timeout + ENGINE_HANG_GRACE_S
        super().__init__(config)
        self.shutdown_plan = shutdown

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # not recorded in uvicorn's captured signals, which it re-raises once served: the command
        # chooses its exit status itself
        self.shutdown_plan.begin()
        self.should_exit = True
