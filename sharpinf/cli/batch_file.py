"""`generate --batch FILE.jsonl`: one request per line, all through the engine, results in input order.

A line that cannot become a request (not UTF-8, not JSON, not an object, no prompt, an
unknown or invalid field) gets a "rejected" result whose error names its line; the other
lines still run. Blank lines are skipped.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from rich.text import Text

from sharpinf.cli.common import backend_named, console, err_console, print_json, valid_text
from sharpinf.errors import RequestError, SharpinfError
from sharpinf.params import SamplingParams
from sharpinf.textgen import GenerationResult

PROMPT_KINDS = ("prompt", "chat", "prompt_ids")
SAMPLING_FIELDS = tuple(SamplingParams.__dataclass_fields__)

BATCH_HELP = ('A .jsonl file (UTF-8): one request per line with "prompt" (text), "chat" (text or a list of '
              '{"role", "content"}) or "prompt_ids" (list of ints), plus optional sampling fields '
              f"({', '.join(SAMPLING_FIELDS)}). All run through the engine, results in input order. A line "
              "that is no valid request (not UTF-8, not JSON, an unknown field, a bad value) is reported as "
              "rejected with its line number; the others still run.")


@dataclasses.dataclass
class BatchLine:
    where: str  # "FILE:N", so every message names its line
    prompt: object = None
    params: SamplingParams | None = None
    error: str | None = None  # set when the line is no request


def _json_type(v) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(v), "a number")


def _prompt(kind: str, value):
    """The prompt of a line, shaped as the engine takes it; the engine checks its contents."""
    if kind == "prompt" and isinstance(value, str):
        return valid_text(value, "prompt")
    if kind == "chat" and isinstance(value, str):
        return [{"role": "user", "content": valid_text(value, "chat")}]
    if kind == "chat" and isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
        for m in value:
            if isinstance(m.get("content"), str):
                valid_text(m["content"], "chat")
        return value
    if kind == "prompt_ids" and isinstance(value, list) and all(type(t) is int for t in value):
        return value
    want = {"prompt": "a string", "chat": "a string or a non-empty array of {role, content} objects",
            "prompt_ids": "an array of integers"}[kind]
    raise RequestError(f"{kind} must be {want}, got {json.dumps(value)[:60]}")


def parse_line(raw: bytes, defaults: SamplingParams) -> tuple[object, SamplingParams]:
    """One line -> (prompt, params); a RequestError says why it is no request."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(f"not UTF-8 text (byte {exc.start + 1} of the line)") from None
    try:
        obj = json.loads(text.removeprefix("\ufeff"))  # a BOM some editors write
    except json.JSONDecodeError as exc:
        raise RequestError(f"not JSON ({exc.msg}, column {exc.colno})") from None
    except (ValueError, RecursionError) as exc:  # an integer of 5000 digits, arrays nested 10**5 deep
        raise RequestError(f"not usable JSON ({type(exc).__name__}: {str(exc)[:80]})") from None
    if not isinstance(obj, dict):
        raise RequestError(f"a request is a JSON object, got {_json_type(obj)}")
    kinds = [k for k in PROMPT_KINDS if k in obj]
    if len(kinds) != 1:
        raise RequestError(f"give exactly one of {', '.join(PROMPT_KINDS)}")
    prompt = _prompt(kinds[0], obj.pop(kinds[0]))
    unknown = sorted(set(obj) - set(SAMPLING_FIELDS))
    if unknown:
        raise RequestError(f"unknown field(s) {', '.join(map(repr, unknown))}: besides the prompt a line takes "
                           f"{', '.join(SAMPLING_FIELDS)}")
    return prompt, dataclasses.replace(defaults, **obj)  # SamplingParams validates the values


def read_batch_file(path: Path, defaults: SamplingParams) -> list[BatchLine]:
    """Every non-blank line, in order: a request, or the reason it is none."""
    if not path.is_file():
        raise SharpinfError(f"{path}: no such file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SharpinfError(f"{path}: cannot read ({exc.strerror})") from None
    lines = []
    # bytes.splitlines splits at \n and \r only: a JSON string may hold U+2028, str.splitlines would cut there
    for n, raw in enumerate(data.splitlines(), 1):
        if not raw.strip():
            continue
        line = BatchLine(f"{path}:{n}")
        try:
            line.prompt, line.params = parse_line(raw, defaults)
        except RequestError as exc:
            line.error = f"{line.where}: {exc}"
        lines.append(line)
    if not lines:
        raise SharpinfError(f"{path}: no requests (every line is blank)")
    return lines


def run_batch_file(loaded, path: Path, defaults: SamplingParams, backend: str, engine_config: dict,
                   json_out: bool) -> None:
    if backend == "reference":
        raise SharpinfError("--batch runs through the engine: use --backend emu, cuda or auto")
    lines = read_batch_file(path, defaults)
    results = [GenerationResult([], [], "", "rejected", error=line.error) for line in lines]
    todo = [i for i, line in enumerate(lines) if line.error is None]
    llm = None
    if todo:  # no engine to build when every line was rejected
        from rich.progress import Progress

        from sharpinf.llm import LLM

        llm = LLM(loaded, backend=backend_named(backend).name if backend == "auto" else backend, **engine_config)
        with Progress(console=err_console, transient=True) as bar:
            task = bar.add_task("generating", total=len(todo))
            outs = llm.generate([lines[i].prompt for i in todo], [lines[i].params for i in todo],
                                on_step=lambda eng: bar.update(task, completed=eng.metrics.finished))
        for i, out in zip(todo, outs):
            if out.error is not None:
                out.error = f"{lines[i].where}: {out.error}"
            results[i] = out
    for i, r in enumerate(results):
        if json_out:
            print_json(r.to_json())
        else:
            console.print(Text.assemble((f"#{i}", "bold"), f" ({r.finish_reason}) ", r.error or r.text))
    if llm is not None and not json_out:
        m = llm.metrics()
        console.print(Text(f"{m['generated_tokens']} tokens in {m['steps']} steps, {m['throughput_tok_per_s']:.1f} "
                           f"tok/s, {m['preemptions']} preemptions, prefix-cache hit rate "
                           f"{m['prefix_cache_hit_rate']:.0%}", style="dim"))
