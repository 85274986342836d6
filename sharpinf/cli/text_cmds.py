"""`sharpinf tokenize | generate | score`: text in, tokens and logits out."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import typer
from rich.table import Table
from rich.text import Text

from sharpinf.cli.app import app
from sharpinf.cli.batch_file import BATCH_HELP, run_batch_file
from sharpinf.cli.common import (KERNELS_HELP, NUM_SPEC_HELP, SPECULATIVE_HELP, console, kernels_spec, load, one_of,
                                 parse_ids, print_json, say_auto, speculative_spec, tokenizer_of, valid_text)
from sharpinf.errors import SharpinfError

BACKEND_HELP = ("reference (the NumPy oracle), emu (kernels on the CPU emulator), cuda (kernels on the GPU), "
                "or auto: cuda when a GPU is usable, else reference (the fastest path on a CPU).")


def pick_backend(backend: str, engine: bool = False) -> str:
    """auto: cuda when a GPU is usable, else the reference -- or, for work only the engine does
    (engine=True: speculation), the emulator."""
    if backend != "auto":
        return backend
    from sharpinf.runtime.select import cuda_status

    ok, why = cuda_status()
    fallback = "emu" if engine else "reference"
    if not ok:
        say_auto(fallback, why)
    return "cuda" if ok else fallback


@app.command()
def tokenize(model: str = typer.Argument(..., help="Registered name or path to a .gguf."),
             text: str = typer.Argument(..., help="Text; special tokens like <|im_start|> are parsed."),
             add_bos: bool | None = typer.Option(None, help="Prepend BOS (default: what the model says)."),
             json_out: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    """Token ids and pieces of TEXT, as llama.cpp would tokenize it."""
    tok = tokenizer_of(load(model))
    ids = tok.encode(valid_text(text, "TEXT"), add_bos=add_bos)
    pieces = [tok.decode([i]) for i in ids]
    if json_out:
        return print_json({"token_ids": ids, "pieces": pieces})
    t = Table("#", "id", "piece")
    for n, (i, p) in enumerate(zip(ids, pieces)):
        t.add_row(str(n), str(i), repr(p))
    console.print(t)


def prompt_ids_from(tok, prompt, chat, prompt_ids) -> list[int]:
    kind, value = one_of(prompt=prompt, chat=chat, prompt_ids=prompt_ids)
    if kind == "prompt":
        return tok.encode(valid_text(value, "--prompt"))
    if kind == "chat":
        return tok.apply_chat([{"role": "user", "content": valid_text(value, "--chat")}])
    return parse_ids(value)


def structured_option(json_schema: str | None, regex: str | None):
    """--json-schema (text or a file) / --regex -> a StructuredOutput (None: neither)."""
    from sharpinf.params import StructuredOutput

    if json_schema is not None and regex is not None:
        raise SharpinfError("give --json-schema or --regex, not both")
    if regex is not None:
        return StructuredOutput("regex", regex)
    if json_schema is None:
        return None
    path = Path(json_schema)
    if not json_schema.lstrip().startswith(("{", "true", "false")) and path.is_file():
        json_schema = path.read_text(encoding="utf-8")
    return StructuredOutput.json_schema(json_schema)


@app.command()
def generate(
    model: str = typer.Argument(..., help="Registered name or path to a .gguf."),
    prompt: str = typer.Option(None, help="Raw text prompt."),
    chat: str = typer.Option(None, help="A user message, wrapped in the model's chat template."),
    prompt_ids: str = typer.Option(None, help="Comma-separated token ids."),
    batch: Path = typer.Option(None, help=BATCH_HELP),
    max_tokens: int = typer.Option(64, help="Most tokens to generate."),
    temperature: float = typer.Option(0.0, help="0 = greedy (the default)."),
    top_k: int = typer.Option(0, help="Keep the k most likely tokens (0 = off)."),
    top_p: float = typer.Option(1.0, help="Nucleus sampling mass (1 = off)."),
    min_p: float = typer.Option(0.0, help="Drop tokens below min_p x the top probability (0 = off)."),
    repetition_penalty: float = typer.Option(1.0, help="> 1 discourages repeats (1 = off)."),
    presence_penalty: float = typer.Option(0.0, help="In [-2, 2]: subtracted once from every token already generated."),
    frequency_penalty: float = typer.Option(0.0, help="In [-2, 2]: times how often a token was generated."),
    json_schema: str = typer.Option(None, "--json-schema", help="Structured output: the answer is JSON valid "
                                    "under this schema (JSON text, or a path to a .json file; llguidance)."),
    regex: str = typer.Option(None, "--regex", help="Structured output: the answer matches this regex."),
    seed: int = typer.Option(None, help="Seed for sampling: same seed, same tokens on reference, emu and cuda "
                             "(one rule, kernels_cu/sampling_rule.cuh)."),
    backend: str = typer.Option("auto", help=BACKEND_HELP),
    kv_dtype: str = typer.Option("fp16", help="KV cache dtype: fp16, bf16, fp32, q8_0."),
    num_blocks: int = typer.Option(None, help="KV pool blocks (default: measured on a GPU, 256 on emu)."),
    max_num_batched_tokens: int = typer.Option(512, help="Per-step token budget of the engine."),
    enforce_eager: bool = typer.Option(False, "--enforce-eager", help="Launch each step's kernels one by one "
                                       "instead of replaying the CUDA graphs captured at start-up."),
    kernels: str = typer.Option("auto", "--kernels", help=KERNELS_HELP),
    speculative: str = typer.Option(None, "--speculative", help=SPECULATIVE_HELP),
    num_speculative_tokens: int = typer.Option(None, "--num-speculative-tokens", help=NUM_SPEC_HELP),
    json_out: bool = typer.Option(False, "--json", help="One JSON object per request: prompt_ids, token_ids, text, "
                                  "finish_reason (with --speculative, its metrics too)."),
):
    """Generate a continuation (streams to the terminal unless --json); --batch runs many requests."""
    from sharpinf.params import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                            min_p=min_p, repetition_penalty=repetition_penalty, seed=seed,
                            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                            structured=structured_option(json_schema, regex))
    kernels = kernels_spec(kernels)
    spec = speculative_spec(speculative, num_speculative_tokens)
    if spec is not None and backend == "reference":
        raise SharpinfError("--speculative runs in the engine: choose --backend auto, cuda or emu")
    if spec is not None and batch is None:  # auto must not fall back to the reference, which has no speculation
        backend = pick_backend(backend, engine=True)
    loaded = load(model)
    engine_config = dict(kv_dtype=kv_dtype, num_blocks=num_blocks, max_num_batched_tokens=max_num_batched_tokens,
                         enforce_eager=enforce_eager, kernels=kernels, speculative=spec)
    if batch is not None:
        if any(v is not None for v in (prompt, chat, prompt_ids)):
            raise SharpinfError("--batch runs the requests in the file: give no --prompt/--chat/--prompt-ids")
        return run_batch_file(loaded, batch, params, backend, engine_config, json_out)
    tok = tokenizer_of(loaded)
    ids = prompt_ids_from(tok, prompt, chat, prompt_ids)

    def stream(_token: int, delta: str) -> None:
        console.print(Text(delta), end="", soft_wrap=True)  # the model's text, printed literally

    result = run_generation(loaded, tok, ids, params, backend, None if json_out else stream, engine_config)
    sm = result.metrics.get("speculative")
    if json_out:
        return print_json({**result.to_json(), **({"speculative": sm} if sm else {})})
    said = "" if not sm else (f"; speculative {sm['method']}: {sm['accepted_tokens']}/{sm['draft_tokens']} guesses kept, "
                              f"{sm['target_passes_per_token']:.2f} target passes a token")
    console.print(Text(f"\n({len(result.token_ids)} tokens, finish: {result.finish_reason}{said})", style="dim"))


def run_generation(loaded, tok, ids, params, backend: str, on_token, engine_config=None):
    backend = pick_backend(backend)
    if backend == "reference":
        from oracles.generation import generate_reference
        from oracles.reference import Reference

        return generate_reference(Reference(loaded), tok, ids, params, on_token)
    from sharpinf.llm import LLM
    from sharpinf.textgen import GenerationResult

    llm = LLM(loaded, backend=backend, **(engine_config or {}))
    last = None
    for delta in llm.stream(ids, params):
        if on_token is not None and (delta.new_token_ids or delta.new_text):  # a verified run: one delta
            on_token(delta.new_token_ids[-1] if delta.new_token_ids else None, delta.new_text)
        last = delta
    spec = llm.engine.engine_metrics()["speculative"]
    return GenerationResult(list(ids), last.token_ids, last.text, last.finish_reason,
                            {"speculative": spec} if spec else {})


def score_rows(logits: np.ndarray, ids: list[int], top_k: int) -> dict:
    """Teacher-forced: for each position t, top-k after reading 0..t, and log p(ids[t+1])."""
    z = logits.astype(np.float64)
    logp = z - z.max(axis=1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
    top = np.argsort(-logits, axis=1, kind="stable")[:, :top_k]
    nxt = [float(logp[t, ids[t + 1]]) for t in range(len(ids) - 1)]
    return {
        "token_ids": list(ids),
        "top_ids": top.tolist(),
        "top_logits": np.take_along_axis(logits, top, axis=1).astype(float).tolist(),
        "next_token_logprob": nxt,
        "perplexity": math.exp(-sum(nxt) / len(nxt)) if nxt else None,
    }


@app.command()
def score(
    model: str = typer.Argument(..., help="Registered name or path to a .gguf."),
    prompt: str = typer.Option(None, help="Raw text."),
    prompt_ids: str = typer.Option(None, help="Comma-separated token ids."),
    top_k: int = typer.Option(5, help="How many top next tokens to show per position."),
    backend: str = typer.Option("auto", help=BACKEND_HELP),
    kernels: str = typer.Option("auto", "--kernels", help=KERNELS_HELP),
    json_out: bool = typer.Option(False, "--json", help="JSON keys: token_ids, top_ids, top_logits, next_token_logprob, perplexity."),
):
    """Teacher-forced scoring: top-k next tokens at every position, log-probs and perplexity."""
    kernels = kernels_spec(kernels)
    loaded = load(model)
    tok = tokenizer_of(loaded)
    _, _ = one_of(prompt=prompt, prompt_ids=prompt_ids)
    ids = tok.encode(valid_text(prompt, "--prompt")) if prompt is not None else parse_ids(prompt_ids)
    if not ids:
        raise SharpinfError("empty input: nothing to score")
    if top_k < 1:
        raise SharpinfError("--top-k must be >= 1")
    logits = teacher_forced_logits(loaded, ids, backend, kernels)
    rows = score_rows(logits, ids, min(top_k, logits.shape[1]))
    if json_out:
        return print_json(rows)
    t = Table("pos", "token", "log p(token | before)", f"top-{top_k} next")
    for i, tid in enumerate(ids):
        lp = rows["next_token_logprob"][i - 1] if i > 0 else None
        nxt = ", ".join(repr(tok.decode([j])) for j in rows["top_ids"][i])
        t.add_row(str(i), repr(tok.decode([tid])), "" if lp is None else f"{lp:.3f}", nxt)
    console.print(t)
    if rows["perplexity"] is not None:
        console.print(f"perplexity: {rows['perplexity']:.3f}")


def teacher_forced_logits(loaded, ids: list[int], backend: str, kernels: str = "auto") -> np.ndarray:
    from sharpinf.textgen import check_prompt

    check_prompt(ids, loaded.config.n_vocab, loaded.config.context_length + 1)
    backend = pick_backend(backend)
    if backend == "reference":
        from oracles.reference import Reference

        return Reference(loaded).logits(ids)
    from sharpinf.step.forward import ForwardPass
    from sharpinf.runtime.select import get_backend
    from sharpinf.scoring import teacher_forced_logits as fp_logits

    return fp_logits(ForwardPass(loaded, get_backend(backend), kernels=kernels), ids)
