"""Chat templates (tokenizer.chat_template) rendered the way Hugging Face transformers does.

Templates come from model files we did not write, so they run in jinja2's immutable sandbox:
no attribute access to Python internals, no mutation of the messages passed in.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from sharpinf.errors import SharpinfError


class ChatTemplateError(SharpinfError):
    """A chat template that does not parse, or that fails (or refuses) while rendering."""


def _raise_exception(message: str):
    # Templates call this to reject a conversation (e.g. roles not alternating).
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys: bool = False) -> str:
    # transformers' tojson: non-ASCII kept as is (jinja's default escapes HTML characters).
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(template)
    except jinja2.exceptions.TemplateError as e:
        raise ChatTemplateError(f"chat template does not parse: {e}") from None


def render_chat(
    template: str,
    messages: list[dict],
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    **extra: Any,
) -> str:
    """The prompt text for messages ([{"role": ..., "content": ...}, ...]) under template."""
    compiled = _compile(template)
    try:
        return compiled.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
            **extra,
        )
    except jinja2.exceptions.SecurityError as e:
        raise ChatTemplateError(f"chat template tried something unsafe: {e}") from None
    except (jinja2.exceptions.TemplateError, TypeError, ValueError, KeyError, IndexError) as e:
        raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from None
