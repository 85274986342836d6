"""Chat templates (tokenizer.chat_template) rendered the way Hugging Face transformers does.

Templates come from model files we did not write. jinja2's immutable sandbox keeps them away from
Python internals and from mutating the messages passed in; a budget per render keeps them from
hanging or filling memory:
  - time: RENDER_SECONDS (2 s), checked at every loop step, call, filter, operator and output;
  - size: 1 MiB + 4 x the size of the messages (and tools), for the text produced in all (set
    blocks and macro output included) and for any one string, list or argument built on the way,
    checked before the operation that would allocate it (repetition, joins, padding, formats);
  - range() of at most MAX_RANGE (100,000) items, integers of at most MAX_INT_BITS (4,096) bits,
    and Python's own recursion limit for macros that call themselves.
Whatever goes wrong, parse error, refused limit or exception, is one ChatTemplateError line.
"""

from __future__ import annotations

import functools
import math
from datetime import datetime
from typing import Any

import jinja2
from jinja2.ext import loopcontrols

from sharpinf.errors import SharpinfError
from sharpinf.model.chat_sandbox import (BASE_CHARS, CHARS_PER_INPUT_CHAR, MESSAGE_CHARS, RENDER_SECONDS, _BUDGET,
                                         _Budget, _ChatSandbox, _concat, _each, _guarded_filter, _out, _raise_exception,
                                         _range, _Refused, _routed, _text_size, _tojson)

class ChatTemplateError(SharpinfError):
    """A chat template that does not parse, or that fails (or refuses) while rendering."""


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = _ChatSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.filters = {name: _guarded_filter(name, f) for name, f in env.filters.items()}
    env.filters.update(_each=_each, _out=_out, _concat=_concat)
    env.globals.pop("lipsum", None)  # lipsum(n) writes n paragraphs; no chat template needs it
    env.globals.update(range=_range, raise_exception=_raise_exception, strftime_now=_strftime_now)
    try:
        tree = _routed(env.parse(template))
        tree.set_environment(env)
        return env.from_string(tree)
    except jinja2.exceptions.TemplateError as e:
        raise ChatTemplateError(_one_line(f"chat template does not parse: {e}")) from None
    except Exception as e:  # e.g. RecursionError on thousands of nested brackets
        raise ChatTemplateError(_one_line(f"chat template does not compile: {type(e).__name__}: {e}")) from None


def _one_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else text
    return line if len(line) <= MESSAGE_CHARS else line[:MESSAGE_CHARS] + "..."


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
    input_chars = _text_size((messages, extra), math.inf)
    budget = _Budget(BASE_CHARS + CHARS_PER_INPUT_CHAR * input_chars, RENDER_SECONDS)
    token = _BUDGET.set(budget)
    try:
        return compiled.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
            **extra,
        )
    except _Refused as e:
        raise ChatTemplateError(_one_line(f"chat template: {e}")) from None
    except jinja2.exceptions.SecurityError as e:
        raise ChatTemplateError(_one_line(f"chat template tried something unsafe: {e}")) from None
    except RecursionError:
        raise ChatTemplateError("chat template: recursion too deep (a macro that calls itself?)") from None
    except MemoryError:
        raise ChatTemplateError("chat template: out of memory") from None
    except Exception as e:  # template code is the model file's code: any failure is the template's
        raise ChatTemplateError(_one_line(f"chat template failed: {type(e).__name__}: {e}")) from None
    finally:
        _BUDGET.reset(token)
