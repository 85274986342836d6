"""A server on 127.0.0.1 in this process: uvicorn in a thread over an EngineLoop, for tests and
the serve benchmark. `with LoopbackServer(make_engine, name) as s: ... s.url ...`"""

from __future__ import annotations

import socket
import threading
import time
from typing import Callable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LoopbackServer:
    def __init__(self, make_engine: Callable, model_name: str, ready_timeout: float = 600.0, limits=None,
                 shutdown_timeout: float = 30.0):
        import uvicorn

        from sharpinf.serve.app import create_app
        from sharpinf.serve.engine_loop import EngineLoop
        from sharpinf.serve.shutdown import GracefulServer, Shutdown

        self.loop = EngineLoop(make_engine)
        self.app = create_app(self.loop, model_name, limits)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ready_timeout = ready_timeout
        self.shutdown = Shutdown(self.loop, shutdown_timeout)
        self.uv = GracefulServer(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="error"),
                                 self.shutdown)
        self.thread = threading.Thread(target=self.uv.run, name="sharpinf-uvicorn", daemon=True)

    def __enter__(self) -> "LoopbackServer":
        import httpx

        self.loop.start()
        self.thread.start()
        deadline = time.time() + self.ready_timeout
        while time.time() < deadline and not self.loop.load_error:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.__exit__(None, None, None)
        raise RuntimeError(f"the server did not become ready: {self.loop.load_error or 'timed out'}")

    def __exit__(self, *exc) -> None:
        self.uv.should_exit = True
        self.thread.join(10)
        self.shutdown.finish()
        self.loop.stop()

    def signal(self) -> None:
        """What SIGTERM or SIGINT does to `sharpinf serve` (a thread cannot take signals)."""
        self.uv.handle_exit(15, None)

    def idle(self, timeout: float = 30.0) -> bool:
        """True once no request is live and no KV block is in use (prefix-cached blocks count as free)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.loop.query(lambda e: (e.has_unfinished(), len(e.requests), e.blocks.usage)) == (False, 0, 0.0):
                return True
            time.sleep(0.05)
        return False
