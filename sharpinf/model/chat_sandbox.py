"""The sandbox a chat template renders in, and the budget that keeps it from hanging or filling
memory (see chat.py for the limits). Every loop step, call, filter, intercepted operator and
piece of output ticks the clock and is measured before it allocates; a refusal is _Refused.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import re
import time
from contextvars import ContextVar
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.sandbox import MAX_RANGE, ImmutableSandboxedEnvironment
from jinja2.utils import Namespace


RENDER_SECONDS = 2.0
BASE_CHARS = 1 << 20  # what any template may produce, however short the conversation
CHARS_PER_INPUT_CHAR = 4  # plus this much per character of the messages and tools
MAX_INT_BITS = 4096
MAX_JSON_INDENT = 64
MESSAGE_CHARS = 300  # of an error message we pass on: one readable line


# ---------------------------------------------------------------- the budget

class _Refused(Exception):
    """A template hit one of the limits; the message says which."""


class _Budget:
    def __init__(self, max_chars: int, seconds: float):
        self.max_chars, self.seconds = max_chars, seconds
        self.deadline = time.monotonic() + seconds
        self.produced = 0

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise _Refused(f"rendering took longer than {self.seconds:g} s")

    def allow(self, n: int, what: str) -> None:
        if n > self.max_chars:
            raise _Refused(f"{what} would be {n:,} long, over the limit of {self.max_chars:,}")


# Compile time has no render budget, but jinja evaluates constant expressions then: size caps only.
_BUDGET: ContextVar[_Budget] = ContextVar("chat_template_budget", default=_Budget(BASE_CHARS, math.inf))


def _text_size(x: Any, limit: int) -> int:
    """About len(str(x)), counted only until it passes limit: a 10-item list may hold one
    long string 10 times, and nested lists multiply that, so str() itself could exhaust memory."""
    total, stack = 0, [x]
    while stack and total <= limit:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v) + 2
        elif isinstance(v, dict):
            stack += v.keys()
            stack += v.values()
            total += 2
        elif isinstance(v, (list, tuple, set, frozenset)):
            stack += v
            total += 2
        elif isinstance(v, Namespace):  # its repr shows its attributes (held in a private dict)
            stack.append(v._Namespace__attrs)
        else:
            total += 4
    return total


def _allow_text(budget: _Budget, x: Any, what: str) -> None:
    """Refuse to turn x into text when that text would be over the limit."""
    if not isinstance(x, str):
        budget.allow(_text_size(x, budget.max_chars), what)


def _allow_result(budget: _Budget, x: Any, what: str) -> None:
    if isinstance(x, (str, list, tuple, dict)):
        budget.allow(len(x), what)
    elif isinstance(x, int) and x.bit_length() > MAX_INT_BITS:
        raise _Refused(f"{what} is a {x.bit_length()}-bit number, over the limit of {MAX_INT_BITS} bits")


# ---------------------------------------------------------------- growth, checked before it happens

def _check_binop(budget: _Budget, op: str, a: Any, b: Any) -> None:
    ints = isinstance(a, int) and isinstance(b, int)
    if op == "**" and ints and abs(a) > 1 and b > 0 and b * a.bit_length() > MAX_INT_BITS:
        raise _Refused(f"{a} ** {b} is over the limit of {MAX_INT_BITS}-bit numbers")
    if op == "*" and ints and a.bit_length() + b.bit_length() > MAX_INT_BITS + 1:
        raise _Refused(f"'*' would make a number over the limit of {MAX_INT_BITS} bits")
    if op == "*" and isinstance(a, int) != isinstance(b, int):
        seq, n = (b, a) if isinstance(a, int) else (a, b)
        if isinstance(seq, (str, list, tuple)):
            budget.allow(len(seq) * max(n, 0), "repeating with '*'")
    if op == "+" and isinstance(a, (str, list, tuple)) and isinstance(b, (str, list, tuple)):
        budget.allow(len(a) + len(b), "joining with '+'")
    if op == "%" and isinstance(a, str):
        _check_format(budget, a, b if isinstance(b, tuple) else (b,))


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-+ #0]*(\*|\d*)(?:\.(\*|\d*))?")
_BRACE_SPEC = re.compile(r"\{[^{}]*(\{)?")


def _check_format(budget: _Budget, fmt: str, args: Any) -> None:
    """'%9999999s' % x and '{:>9999999}'.format(x) allocate their widths: sum them before."""
    widths = 0
    for m in _PERCENT_SPEC.finditer(fmt):
        if "*" in m.groups():
            raise _Refused("a '*' width in a % format")
        widths += sum(int(g) for g in m.groups() if g)
    for m in _BRACE_SPEC.finditer(fmt.replace("{{", "").replace("}}", "")):  # {{ is a literal brace
        if m.group(1):
            raise _Refused("a nested {} width in a format string")
        widths += sum(int(d) for d in re.findall(r"\d+", m.group(0).partition(":")[2]))
    budget.allow(widths + len(fmt) + _text_size(args, budget.max_chars), "a formatted string")


def _check_str_method(budget: _Budget, name: str, s: str, args: tuple, kwargs: dict) -> tuple:
    """Checks for s.<name>(*args) from a template; returns args (join's iterable, made a list)."""
    for v in (*args, *kwargs.values()):
        if isinstance(v, int):  # center, ljust, rjust, zfill: the width
            budget.allow(abs(v), f"str.{name}({v})")
    if name == "join" and args:
        items = list(args[0])
        sizes = sum(len(x) for x in items if isinstance(x, str))
        budget.allow(sizes + len(s) * max(len(items) - 1, 0), "str.join")
        return (items, *args[1:])
    if name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        budget.allow(_replaced_size(s, args[0], args[1]), "str.replace")
    tab = (args[0] if args else kwargs.get("tabsize", 8)) if name == "expandtabs" else None
    if isinstance(tab, int):
        budget.allow(len(s) + s.count("\t") * tab, "str.expandtabs")
    if name in ("format", "format_map"):
        _check_format(budget, s, (args, kwargs))
    return args


def _replaced_size(s: str, old: str, new: str) -> int:
    n = len(s) + 1 if old == "" else s.count(old)
    return len(s) + n * max(len(new) - len(old), 0)


# Filters that do not turn their input into text: no need to measure it (length runs per message).
_CONTAINER_FILTERS = frozenset(
    "length count first last list reverse sort dictsort unique min max sum map select reject selectattr "
    "rejectattr groupby batch slice items attr default d random abs int float round join".split()
)


def _check_filter(budget: _Budget, name: str, a: dict) -> dict:
    """Checks for value|name(...) with its arguments bound by name; returns them (join's made a list)."""
    value = next(iter(a.values()))
    if name not in _CONTAINER_FILTERS:
        _allow_text(budget, value, f"the input to |{name}")
    for key, v in list(a.items())[1:]:
        if isinstance(v, int) and not isinstance(v, bool):  # center(width), batch(linecount), ...
            budget.allow(abs(v), f"|{name}({key}={v})")
        else:  # replace(old, new), join(d), ... turn their arguments into text too
            _allow_text(budget, v, f"an argument to |{name}")
    text = value if isinstance(value, str) else ""
    if name == "join":
        key = next(iter(a))
        a[key] = items = list(value)
        sep = str(a.get("d", ""))
        budget.allow(sum(_text_size(x, budget.max_chars) for x in items) + len(sep) * len(items), "|join")
    elif name == "replace":
        budget.allow(_replaced_size(text, str(a.get("old", "")), str(a.get("new", ""))), "|replace")
    elif name == "indent":
        width = a.get("width", 4)
        budget.allow(len(text) + (text.count("\n") + 1) * (width if isinstance(width, int) else len(str(width))), "|indent")
    elif name == "wordwrap":
        lines = len(text) // max(int(a.get("width", 79)), 1) + text.count("\n") + 1
        budget.allow(len(text) + lines * len(str(a.get("wrapstring") or "\n")), "|wordwrap")
    elif name == "format":
        _check_format(budget, text, (a.get("args"), a.get("kwargs")))
    elif name == "sum" and not isinstance(a.get("start", 0), (int, float)):
        raise _Refused("|sum of anything but numbers")  # summing lists copies quadratically
    return a


def _guarded_filter(name: str, f):
    sig = inspect.signature(f)
    n_injected = 1 if getattr(f, "jinja_pass_arg", None) else 0  # jinja's pass_context & co. marker

    @functools.wraps(f)  # keeps jinja_pass_arg, so jinja still injects the context/environment
    def guarded(*args, **kwargs):
        budget = _BUDGET.get()
        budget.tick()
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError:
            return f(*args, **kwargs)  # jinja's own error for bad arguments
        arguments = dict(list(bound.arguments.items())[n_injected:])
        if arguments:
            arguments = _check_filter(budget, name, arguments)
            bound.arguments.update(arguments)
        result = f(*bound.args, **bound.kwargs)
        _allow_result(budget, result, f"the result of |{name}")
        return result

    return guarded


# ---------------------------------------------------------------- the sandbox

class _ChatSandbox(ImmutableSandboxedEnvironment):
    """Operators that can grow without bound go through call_binop; every call is checked."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def call_binop(self, context, operator, left, right):
        budget = _BUDGET.get()
        budget.tick()
        _check_binop(budget, operator, left, right)
        result = super().call_binop(context, operator, left, right)
        _allow_result(budget, result, f"the result of '{operator}'")
        return result

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's style: no name clashes)
        budget = _BUDGET.get()
        budget.tick()
        method = getattr(__obj, "__wrapped__", __obj)  # jinja wraps str.format in a sandboxed formatter
        if isinstance(getattr(method, "__self__", None), str):
            args = _check_str_method(budget, method.__name__, method.__self__, args, kwargs)
        result = super().call(__context, __obj, *args, **kwargs)
        _allow_result(budget, result, "the result of a call")
        return result


@jinja2.pass_context
def _each(context, iterable):
    """Every for-loop iterates through this: a loop of loops still checks the clock each step."""
    budget = _BUDGET.get()
    for item in iterable:
        budget.tick()
        yield item


@jinja2.pass_context
def _out(context, value):
    """Every piece of output, in a set block or a macro too, goes through this before str()."""
    budget = _BUDGET.get()
    budget.tick()
    budget.produced += len(value) if isinstance(value, str) else _text_size(value, budget.max_chars)
    budget.allow(budget.produced, "the text produced")
    return value


@jinja2.pass_context
def _concat(context, parts):
    """a ~ b ~ c, measured before it is built (jinja itself does "".join(map(str, parts)))."""
    budget = _BUDGET.get()
    budget.tick()
    budget.allow(sum(_text_size(p, budget.max_chars) for p in parts), "joining with '~'")
    return "".join(map(str, parts))


def _routed(tree: nodes.Template) -> nodes.Template:
    """Send every loop's iterable, '~' and piece of output through _each, _concat and _out.

    Filters marked pass_context are never folded at compile time, so these run at render time.
    """
    def wrap(parent: nodes.Node, field: str, child: Any) -> Any:
        if isinstance(child, nodes.Concat):
            child = nodes.Filter(nodes.Tuple(child.nodes, "load"), "_concat", [], [], None, None, lineno=child.lineno)
        if isinstance(parent, nodes.Output) and field == "nodes":
            if isinstance(child, nodes.TemplateData):
                child = nodes.Const(child.data, lineno=child.lineno)
            child = nodes.Filter(child, "_out", [], [], None, None, lineno=child.lineno)
        if isinstance(parent, nodes.For) and field == "iter":
            child = nodes.Filter(child, "_each", [], [], None, None, lineno=child.lineno)
        return child

    for node in [tree, *tree.find_all(nodes.Node)]:
        for field in node.fields:
            value = getattr(node, field, None)
            if isinstance(value, list):
                setattr(node, field, [wrap(node, field, v) if isinstance(v, nodes.Node) else v for v in value])
            elif isinstance(value, nodes.Node):
                setattr(node, field, wrap(node, field, value))
    return tree


# ---------------------------------------------------------------- helpers templates call

def _raise_exception(message: str):
    # Templates call this to reject a conversation (e.g. roles not alternating).
    _allow_text(_BUDGET.get(), message, "the message")
    raise jinja2.exceptions.TemplateError(str(message)[:MESSAGE_CHARS])


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys: bool = False) -> str:
    # transformers' tojson: non-ASCII kept as is (jinja's default escapes HTML characters).
    if (len(indent) if isinstance(indent, str) else indent or 0) > MAX_JSON_INDENT:  # indent x every line
        raise _Refused(f"tojson indent over the limit of {MAX_JSON_INDENT}")
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _range(*args: int) -> range:
    r = range(*args)  # len() of a range is O(1), however huge
    if len(r) > MAX_RANGE:
        raise _Refused(f"range() of {len(r)} items is over the limit of {MAX_RANGE}")
    return r


