"""`sharpinf serve`: an OpenAI-compatible HTTP server over the engine.

    engine_loop.py  one thread steps the engine while any request is pending; handlers only
                    submit, abort and await their request's deltas
    protocol.py     OpenAI request bodies -> (prompt, SamplingParams); responses, stream chunks,
                    logprobs and errors in OpenAI's shapes
    metrics.py      Prometheus metrics (prometheus-client, a registry of the server's own)
    app.py          the FastAPI routes
"""
