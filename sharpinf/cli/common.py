"""Helpers the commands share: consoles, model loading by name or path, id lists."""

from __future__ import annotations

import json
import sys

from rich.console import Console
from rich.text import Text

from sharpinf.errors import RequestError, SharpinfError


def make_console(stderr: bool = False) -> Console:
    """A console that prints strings literally: generated text, paths and prompts are the
    user's, so `[/x]` or `:smile:` must never be read as Rich markup or emoji codes.
    Styled output is built from Text objects. Piped or logged output keeps whole table rows
    instead of wrapping them at 80 columns."""
    tty = (sys.stderr if stderr else sys.stdout).isatty()
    return Console(stderr=stderr, markup=False, emoji=False, highlight=False, width=None if tty else 160)


console = make_console()
err_console = make_console(stderr=True)


AUTO_LABELS = {"emu": "the CPU emulator", "reference": "the NumPy reference"}


def say_auto(picked: str, why: str) -> None:
    """One line on stderr when "auto" passed the GPU by, with the probe's reason (brackets kept)."""
    err_console.print(Text(f"auto: using {AUTO_LABELS.get(picked, picked)} ({why})"), soft_wrap=True)


def backend_named(name: str | None):
    """get_backend(name), saying why when "auto" did not pick the GPU."""
    from sharpinf.runtime.select import get_backend, last_auto_choice

    be = get_backend(name)
    choice = last_auto_choice()
    if choice and choice[0] != "cuda":
        say_auto(*choice)
    return be


def load(model: str):
    """A registered name (pulled on first use, with a progress bar) or a GGUF path -> LoadedModel."""
    from sharpinf.model.registry import open_model

    return open_model(model)


def tokenizer_of(loaded):
    from sharpinf.model.tokenizer import Tokenizer

    return Tokenizer.from_gguf_metadata(loaded.metadata, where=str(loaded.path))


def valid_text(s: str, what: str) -> str:
    """s, if it is Unicode a tokenizer can encode. Command-line bytes that are not UTF-8 arrive as
    lone surrogates (Python's surrogateescape), and JSON can spell one ("\\ud800")."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise RequestError(f"{what} is not valid UTF-8 text") from None
    return s


def parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise SharpinfError(f"--prompt-ids must be comma-separated integers, got {text!r}") from None


def print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def one_of(**options):
    """Exactly one of the named options must be given; returns (name, value)."""
    given = [(k, v) for k, v in options.items() if v is not None]
    if len(given) != 1:
        names = ", ".join("--" + k.replace("_", "-") for k in options)
        raise SharpinfError(f"give exactly one of {names}")
    return given[0]


def kernels_help() -> str:
    """--kernels' help: the sets in a line, the rest in `sharpinf kernels list` (the registry)."""
    from sharpinf.ops.variants import OP_NAMES, SETS

    return (f"Kernel variants: auto (default: fast on a GPU, simple on the emulator), a set ({', '.join(SETS)}), "
            f"or op=variant,... (ops: {', '.join(OP_NAMES)}); `sharpinf kernels list` shows every variant and "
            "what each set picks.")


KERNELS_HELP = kernels_help()


def kernels_spec(text: str) -> str:
    """--kernels as given, checked now: a bad op or variant is one line before anything loads."""
    from sharpinf.ops.variants import check_kernels

    check_kernels(text)
    return text


SPECULATIVE_HELP = ("Speculative decoding: ngram (the sequence's own tokens guess what follows their last "
                    "n-gram) or draft:MODEL (a smaller model with the same vocabulary guesses greedily). Outputs "
                    "and logprobs stay identical to plain decoding, bit for bit; only the target passes a token "
                    "change. Turns async scheduling off.")
NUM_SPEC_HELP = "Guesses verified per step and sequence with --speculative (default 4)."


def speculative_spec(method: str | None, k: int | None):
    """--speculative and --num-speculative-tokens as the engine's SpeculativeConfig (None: off)."""
    from sharpinf.engine.spec_config import SpeculativeConfig

    return SpeculativeConfig.parse(method, k)

