"""`sharpinf bench --backend emu --quick` runs every suite end to end and writes its results.

Structure and sanity only: timings are measured and reported, never asserted."""

from __future__ import annotations

import json

import pytest

from sharpinf.cli import main


def test_bench_all_suites_write_json_and_plots(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--backend", "emu", "--suite", "all", "--quick", "--out", str(tmp_path), "--json"])
    assert exit_info.value.code == 0
    for suite in ("throughput", "decode", "prefill", "chunking"):
        data = json.loads((tmp_path / f"{suite}.json").read_text())
        assert data["backend"] == "emu" and data["results"]
        assert (tmp_path / f"{suite}.png").stat().st_size > 1000
    thr = json.loads((tmp_path / "throughput.json").read_text())["results"]
    assert thr["finished"] == thr["requests"] and thr["output_tok_per_s"] > 0
    pre = json.loads((tmp_path / "prefill.json").read_text())["results"]
    assert pre["packed"]["tokens"] == pre["sequential"]["tokens"] > 0
    printed = json.loads(capsys.readouterr().out)
    assert set(printed["suites"]) == {"throughput", "decode", "prefill", "chunking"}


def test_single_stream_script_runs_on_the_emulator(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parents[1] / "bench" / "single_stream.py"
    proc = subprocess.run([sys.executable, str(script), "--model", "synth", "--backend", "emu", "--prompt", "32",
                           "--decode", "4", "--repeats", "1"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["backend"] == "emu" and out["decode_tokens_per_s"] > 0 and out["prefill_tokens_per_s"] > 0
