"""A hostile chat template fails fast with one ChatTemplateError line; a benign one renders as before.

The templates come from model files: the sandbox already stops escapes, these tests are about
hanging, unbounded allocation and uncaught exceptions (limits in sharpinf/model/chat.py).
"""

from __future__ import annotations

import json
import time
from datetime import datetime

import jinja2
import pytest
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from sharpinf.model.chat import ChatTemplateError, render_chat
from sharpinf.model.synth_vocab import CHATML_TEMPLATE, synthetic_tokenizer_metadata
from sharpinf.model.tokenizer import Tokenizer, read_tokenizer_metadata

MESSAGES = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
FAST = 5.0  # seconds a refusal may take (the render limit is 2 s)

HOSTILE = {
    # hangs
    "loop of 10**9": "{% for i in range(10**9) %}x{% endfor %}",
    "nested loops, no output": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "nested loops over a string": "{% set s = 'ab' * 50000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
    "nested loops with output": "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    "recursive loop": "{% for a in range(3) recursive %}{{ loop(range(100000)) }}{% endfor %}",
    "huge power": "{{ 10 ** (10 ** 10) }}",
    "sum of lists": "{{ ([[1]] * 100000)|sum(start=[]) }}",
    # unbounded allocation
    "'a' * 10**8": "{{ 'a' * 10**8 }}",
    "'a' * 10**10": "{{ 'a' * 10**10 }}",
    "list * 10**10": "{{ [1, 2] * 10**10 }}",
    "doubling with ~": "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "doubling with +": "{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
    "join of a repeated list": "{{ (['x' * 1000000] * 1000)|join }}",
    "str.join of a repeated list": "{{ ''.join(['x' * 1000000] * 1000) }}",
    "printing a repeated list": "{{ ['x' * 1000000] * 1000 }}",
    "nested list literals": "{% set ns = namespace(a='x' * 500000) %}{% for i in range(40) %}{% set ns.a = [ns.a, ns.a] %}"
                            "{% endfor %}{{ ns.a }}",
    "printing a namespace": "{% set ns = namespace(a='x' * 500000) %}{% for i in range(40) %}{% set ns.a = [ns.a, ns.a] %}"
                            "{% endfor %}{{ ns }}",
    "output captured in a set block": "{% set s %}{% for i in range(100000) %}{{ 'y' * 1000000 }}{% endfor %}{% endset %}",
    "output of a macro": "{% macro m() %}{% for i in range(100000) %}{{ 'y' * 100000 }}{% endfor %}{% endmacro %}{{ m()|length }}",
    "|center": "{{ 'x'|center(10**9) }}",
    "str.ljust": "{{ 'x'.ljust(1000000000) }}",
    "str.format width": "{{ '{:>1000000000}'.format(1) }}",
    "% width": "{{ '%1000000000s' % 'x' }}",
    "|format width": "{{ '%1000000000d'|format(1) }}",
    "|replace of ''": "{{ ('a' * 1000)|replace('', 'b' * 100000) }}",
    "|indent by a long string": "{{ ('a\\n' * 1000)|indent('x' * 100000) }}",
    "|wordwrap": "{{ ('a ' * 100000)|wordwrap(1, wrapstring='x' * 1000) }}",
    "|tojson indent": "{{ messages|tojson(indent=1000000) }}",
    "lipsum": "{{ lipsum(1000000) }}",
    # uncaught errors
    "1/0": "{{ 1/0 }}",
    "range(10**12)": "{{ range(10**12) }}",
    "macro calling itself": "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "x.y.z undefined": "{{ x.y.z }}",
    "float overflow": "{{ 2.0 ** 10000 }}",
    "raise_exception of a huge value": "{{ raise_exception(['x' * 1000000] * 1000) }}",
    "brackets nested 5000 deep": "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}",
}


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_gguf_metadata(synthetic_tokenizer_metadata())


@pytest.mark.parametrize("template", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_template_is_refused_fast(tok, template):
    t0 = time.perf_counter()
    with pytest.raises(ChatTemplateError) as info:
        tok.apply_chat(MESSAGES, template=template)
    took = time.perf_counter() - t0
    msg = str(info.value)
    assert took < FAST, (took, msg)
    assert msg.startswith("chat template") and "\n" not in msg and len(msg) < 400, msg


def test_render_limit_is_time_not_iterations(tok):
    """The nested-loop refusal says it ran out of time, after about the 2 s limit."""
    t0 = time.perf_counter()
    with pytest.raises(ChatTemplateError, match="longer than 2 s"):
        tok.apply_chat(MESSAGES, template=HOSTILE["nested loops, no output"])
    assert 1.9 < time.perf_counter() - t0 < FAST


def test_refusals_say_what(tok):
    cases = {
        "'a' * 10**8": "100,000,000",
        "range(10**12)": "range() of 1000000000000 items",
        "macro calling itself": "recursion too deep",
        "1/0": "ZeroDivisionError",
        "x.y.z undefined": "'x' is undefined",
        "nested loops with output": "the text produced",
    }
    for name, words in cases.items():
        with pytest.raises(ChatTemplateError) as info:
            tok.apply_chat(MESSAGES, template=HOSTILE[name])
        assert words in str(info.value), (name, str(info.value))


# --- benign templates render exactly as the plain sandbox renders them ---------------------------

def plain_render(template: str, messages: list[dict], **kw) -> str:
    """The renderer before the limits: jinja2's immutable sandbox, configured as transformers does."""
    def raise_exception(m):
        raise jinja2.exceptions.TemplateError(m)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda f: datetime.now().strftime(f))
    return env.from_string(template).render(messages=messages, add_generation_prompt=True, bos_token="<s>",
                                            eos_token="</s>", **kw)


FEATURES = """{{ bos_token }}{%- set ns = namespace(n=0, sys='') %}
{%- macro show(v, depth=0) %}{% if v is mapping %}{% for k, x in v|dictsort %}{{ k }}={{ show(x, depth + 1) }};{% endfor %}
{%- elif v is iterable and v is not string %}[{{ v|map('string')|join(', ') }}]{% else %}{{ v }}{% endif %}{% endmacro %}
{%- for m in messages if m.role != 'system' %}{% set ns.n = ns.n + 1 %}
<{{ m.role|upper }} {{ loop.index }}/{{ loop.length }}{{ ' last' if loop.last }}>{{ m.content|trim|replace('  ', ' ') }}
{%- if m.tool %} {{ show(m.tool) }} {{ m.tool|tojson(indent=2) }}{% endif %}
{%- if loop.index is divisibleby 2 %}{% continue %}{% endif %}{{ '%-6s|' % m.role }}{{ '{}:{:>4}'.format(m.role, loop.index) }}
{%- endfor %}{% set text %}{{ ns.n }} turns{% endset %}{{ text ~ '.' ~ eos_token }}{{ 'x' * 3 }}{{ [1] + [2] }}
{{- (messages|length) ** 2 }}{{ range(3)|list }}{% for i in range(2) %}{% for j in 'ab' %}{{ i }}{{ j }}{% endfor %}{% endfor %}
{%- if add_generation_prompt %}{{ '\\n'|indent(2) }}<ASSISTANT>{% endif %}"""

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "  What  is 2+2?  ", "tool": {"name": "calc", "args": [2, 2], "opts": {"exact": True}}},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "Thanks é ✓"},
]


@pytest.mark.parametrize("template", [CHATML_TEMPLATE, FEATURES], ids=["chatml", "features"])
def test_benign_templates_render_as_before(template):
    assert render_chat(template, CONVERSATION, bos_token="<s>", eos_token="</s>") == plain_render(template, CONVERSATION)


def test_real_template_renders_as_before(smollm2_path):
    template = read_tokenizer_metadata(smollm2_path)["tokenizer.chat_template"]
    assert render_chat(template, CONVERSATION, bos_token="<s>", eos_token="</s>") == plain_render(template, CONVERSATION)


def test_long_conversation_is_not_refused(tok):
    """The size limit grows with the messages: 4 MB of conversation renders, quickly."""
    long = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "word " * 800} for i in range(1000)]
    t0 = time.perf_counter()
    out = render_chat(CHATML_TEMPLATE, long, bos_token="<s>", eos_token="</s>")
    assert time.perf_counter() - t0 < 1.0
    assert out == plain_render(CHATML_TEMPLATE, long) and len(out) > 4_000_000


def test_a_refusal_leaves_the_next_render_alone(tok):
    with pytest.raises(ChatTemplateError):
        tok.apply_chat(MESSAGES, template=HOSTILE["'a' * 10**8"])
    assert tok.decode(tok.apply_chat(MESSAGES)) == render_chat(CHATML_TEMPLATE, MESSAGES)
