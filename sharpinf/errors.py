"""Errors a user can act on. The CLI prints them as one line, without a traceback."""


class SharpinfError(Exception):
    """Base for every error that is the user's input, not our bug."""


class ModelError(SharpinfError):
    """A GGUF file we cannot use: truncated, corrupt, unknown arch or quant type, missing tensor."""

    def __init__(self, path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class BackendError(SharpinfError):
    """A backend that cannot run here, a kernel that does not compile, a bad launch."""


class RequestError(SharpinfError):
    """A request the engine rejects: empty or over-long prompt, bad sampling parameters.
    `param` names the field at fault when one is (an HTTP server reports it as OpenAI's `param`)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class ContextLengthError(RequestError):
    """A request longer than the context (or the KV pool) can ever hold: a bigger model might take it."""


class EngineStuck(SharpinfError):
    """The engine stopped making progress with requests pending (a bug): raised instead of looping
    forever, naming the stuck requests and where each stands."""
