"""A reasoning model's thinking apart from its answer, for a chat request that asks for it
(`"reasoning_format": "auto"`, llama.cpp server's name; the default "none" returns the text as generated,
thinking and markers included, in `content`).

Two formats, told apart by their markers in the generated text:
  harmony (gpt-oss): messages `<|channel|>NAME<|message|>BODY<|end|>`, each after the first opened by
    `<|start|>ROLE`; the `analysis` channel is the thinking, `final` the answer, any other (`commentary`:
    tool calls) stays in the answer as generated;
  think tags (DeepSeek-R1 and its distills, Qwen3): `<think>THINKING</think>ANSWER`, the opening tag
    possibly in the prompt (the template's), so a text with only `</think>` splits there.
A text with neither is all answer. The split is of the final text only: a stream cannot ask for it."""

from __future__ import annotations

import re

REASONING_FORMATS = ("none", "auto")
_HARMONY = re.compile(r"<\|channel\|>([^<]*?)<\|message\|>(.*?)(?:<\|end\|>|<\|return\|>|$)", re.S)


def split_reasoning(text: str) -> tuple[str | None, str]:
    """(thinking or None, answer) of a generated text."""
    if "<|channel|>" in text and "<|message|>" in text:
        thinking, answer, other, end = [], [], [], 0
        for m in _HARMONY.finditer(text):
            channel, body = m.group(1).strip(), m.group(2)
            if channel == "analysis":
                thinking.append(body)
            elif channel == "final":
                answer.append(body)
            else:  # a tool call: as generated, its <|start|>assistant to=... header too
                other.append(text[end:m.end()])
            end = m.end()
        return ("".join(thinking) or None), "".join(answer + other)
    if "</think>" in text:
        head, _, answer = text.partition("</think>")
        return head.removeprefix("<think>").strip() or None, answer.lstrip()
    return None, text
