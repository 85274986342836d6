"""`sharpinf serve MODEL`: an OpenAI-compatible server (FastAPI + uvicorn) over the engine."""

from __future__ import annotations

import typer
from rich.text import Text

from sharpinf.cli.app import app
from sharpinf.cli.common import KERNELS_HELP, NUM_SPEC_HELP, SPECULATIVE_HELP, err_console, kernels_spec, speculative_spec
from sharpinf.errors import SharpinfError


def build_server(model: str, backend: str = "auto", served_model_name: str | None = None, limits=None,
                 allowed_origins=("*",), **engine_config):
    """(FastAPI app, EngineLoop): the engine is built in the loop's thread once start() is called."""
    from pathlib import Path

    from sharpinf.cli.common import backend_named, load
    from sharpinf.engine.llm_engine import LLMEngine
    from sharpinf.serve.app import create_app
    from sharpinf.serve.engine_loop import EngineLoop

    name = served_model_name or (Path(model).stem if model.endswith(".gguf") else model)

    def make_engine():
        return LLMEngine(load(model), backend=backend_named(backend), **engine_config)

    loop = EngineLoop(make_engine)
    return create_app(loop, name, limits, allowed_origins), loop


@app.command()
def serve(
    model: str = typer.Argument(..., help="Registered name or path to a .gguf."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8000, help="TCP port."),
    served_model_name: str = typer.Option(None, help="The model's name in the API (default: MODEL, or the "
                                          "file's stem for a path); requests naming another model get a 404."),
    backend: str = typer.Option("auto", help="auto (a GPU when one is usable, else the CPU emulator), cuda or emu."),
    kernels: str = typer.Option("auto", "--kernels", help=KERNELS_HELP),
    kv_dtype: str = typer.Option("fp16", help="KV cache dtype: fp16, bf16, fp32, q8_0."),
    num_blocks: int = typer.Option(None, help="KV pool blocks (default: measured on a GPU, 256 on emu)."),
    max_num_seqs: int = typer.Option(None, help="Most sequences in one step (default: the engine's)."),
    max_num_batched_tokens: int = typer.Option(512, help="Per-step token budget of the engine."),
    max_model_len: int = typer.Option(None, help="Longest prompt + output (default: the model's context)."),
    enforce_eager: bool = typer.Option(False, "--enforce-eager", help="No CUDA graphs."),
    speculative: str = typer.Option(None, "--speculative", help=SPECULATIVE_HELP + " The API is unchanged; "
                                    "/metrics adds the acceptance rate, accepted lengths and target passes."),
    num_speculative_tokens: int = typer.Option(None, "--num-speculative-tokens", help=NUM_SPEC_HELP),
    log_level: str = typer.Option("warning", help="uvicorn's log level: critical, error, warning, info, debug."),
    max_body_bytes: int = typer.Option(4 * 2**20, help="Largest request body; a larger one is a 413."),
    max_prompt_chars: int = typer.Option(None, help="Longest prompt in characters, refused before tokenizing "
                                         "(default: max_model_len x the vocabulary's longest token in bytes, "
                                         "which no longer prompt can fit)."),
    max_stop_strings: int = typer.Option(16, help="Most stop strings in one request."),
    max_stop_chars: int = typer.Option(512, help="Longest stop string."),
    allowed_origins: str = typer.Option("*", help="Origins a browser page may call the API from (CORS), "
                                        "comma-separated, e.g. https://app.example.com. Default *: any origin, as "
                                        "vLLM allows; set it when the server is reachable beyond loopback."),
    shutdown_timeout: float = typer.Option(30.0, help="On SIGTERM or SIGINT: seconds running requests may go on "
                                           "before they are cut (a stream gets an error frame, others a 503); a "
                                           "second signal cuts at once. Exits 1 when any request was cut."),
):
    """Serve MODEL over HTTP with OpenAI's API: /v1/completions, /v1/chat/completions (streaming
    with stream: true), /v1/models and /v1/models/ID, /health, /metrics (Prometheus), /tokenize, /detokenize.

    Requests over the limits are refused before any work: a body over --max-body-bytes is a 413, a
    prompt that can never fit the context a 400 with code context_length_exceeded. Every response
    has an x-request-id header (the client's, echoed, or a fresh one); CORS allows --allowed-origins.

    \b
    curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
      -d '{"model": "smollm2-135m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16}'
    """
    try:
        import uvicorn
    except ImportError:
        raise SharpinfError('serving needs fastapi and uvicorn: pip install -e ".[serve]"') from None
    if backend == "reference":
        raise SharpinfError("serve runs the engine: choose --backend auto, cuda or emu")
    config = dict(kv_dtype=kv_dtype, num_blocks=num_blocks, max_num_batched_tokens=max_num_batched_tokens,
                  enforce_eager=enforce_eager, kernels=kernels_spec(kernels),
                  speculative=speculative_spec(speculative, num_speculative_tokens))
    if max_num_seqs is not None:
        config["max_num_seqs"] = max_num_seqs
    if max_model_len is not None:
        config["max_model_len"] = max_model_len
    from sharpinf.serve.limits import Limits

    try:
        limits = Limits(max_body_bytes, max_prompt_chars, max_stop_strings, max_stop_chars)
    except ValueError as exc:
        raise SharpinfError(str(exc)) from None
    origins = [o.strip() for o in allowed_origins.split(",") if o.strip()]
    if not origins:
        raise SharpinfError("--allowed-origins needs at least one origin (or *)")
    api, loop = build_server(model, backend, served_model_name, limits, origins, **config)
    from sharpinf.serve.shutdown import GracefulServer, Shutdown

    try:
        shutdown = Shutdown(loop, shutdown_timeout)
    except ValueError as exc:
        raise SharpinfError(str(exc)) from None
    loop.start()
    err_console.print(Text(f"serving {model} on http://{host}:{port} (loading; /health says ok when ready)"))
    try:
        GracefulServer(uvicorn.Config(api, host=host, port=port, log_level=log_level), shutdown).run()
    finally:
        shutdown.finish()
        loop.stop()
        if loop.load_error:
            err_console.print(Text.assemble(("error:", "bold red"), f" the model failed to load: {loop.load_error}"))
    if shutdown.cut:
        when = "at a second signal" if shutdown.signals > 1 else f"{shutdown_timeout:g} s after the signal"
        err_console.print(Text.assemble(("error:", "bold red"), f" {shutdown.cut} request(s) still running "
                                        f"{when} were cut"))
        raise typer.Exit(1)
