"""`sharpinf bench --suite all --quick` on the emulator: files written, numbers sane (no timing asserted)."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("matplotlib")


def test_bench_quick_all_suites(tmp_path):
    from typer.testing import CliRunner

    import sharpinf.cli.bench_cmd  # noqa: F401  (registers `bench` if the CLI does not import it yet)
    from sharpinf.cli import app
    from sharpinf.ops.matmul_dp4a import member_groups

    res = CliRunner().invoke(app, ["bench", "--backend", "emu", "--suite", "all", "--quick", "--out", str(tmp_path),
                                   "--json"])
    assert res.exit_code == 0, res.output
    for suite in ("throughput", "decode", "prefill", "chunking"):
        assert (tmp_path / f"{suite}.png").stat().st_size > 1000
        doc = json.loads((tmp_path / f"{suite}.json").read_text())
        assert doc["suite"] == suite and doc["backend"] == "emu" and doc["device"]["name"]
        assert doc["model"]["config"]["n_embd"] == 128

    t = json.loads((tmp_path / "throughput.json").read_text())["results"]
    assert t["finished"] == t["requests"] == 8
    assert t["output_tok_per_s"] > 0 and t["total_tok_per_s"] > t["output_tok_per_s"]
    assert t["ttft_s"]["n"] == 8 and t["ttft_s"]["p50"] > 0 and t["itl_s"]["n"] > 0
    assert 0 <= t["prefix_cache_hit_rate"] <= 1 and 0 < t["kv_usage_max"] <= 1 and t["preemptions"] >= 0

    d = json.loads((tmp_path / "decode.json").read_text())["results"]["rows"]
    assert [r["batch_size"] for r in d] == [1, 2, 4, 8]
    assert all(r["step_s"] > 0 and r["tok_per_s"] > 0 for r in d)
    ratios = json.loads((tmp_path / "decode.json").read_text())["results"]["ratios"]  # of B = 1, 8, 64: those run
    assert ratios["step_ms"] == {"1": d[0]["step_s"] * 1e3, "8": d[3]["step_s"] * 1e3}
    assert ratios["step_time_x_vs_1"] == {"8": d[3]["step_s"] / d[0]["step_s"]}
    (gap,) = json.loads((tmp_path / "decode.json").read_text())["results"]["host_gap"]  # --quick: B = 1
    assert gap["batch_size"] == 1 and gap["device_ms"] > 0
    assert all(gap[m]["step_ms"] > 0 and gap[m]["host_gap_ms"] == gap[m]["step_ms"] - gap["device_ms"] for m in ("sync", "async"))

    p = json.loads((tmp_path / "prefill.json").read_text())["results"]["configs"][0]
    assert (p["prompts"], p["prompt_len"]) == (4, 16)
    assert p["packed"]["tokens"] == p["sequential"]["tokens"] == 4 * 16
    assert p["packed"]["steps"] == 1 and p["sequential"]["steps"] == 4
    assert p["packed"]["tok_per_s"] > 0 and p["sequential"]["tok_per_s"] > 0
    assert p["next_token_agreement"] == 1.0
    ratios = json.loads((tmp_path / "prefill.json").read_text())["results"]["ratios"]  # no S = 1 configuration here
    assert ratios == {"simple": {"prefill_tok_s": {}, "packed_vs_sequential": {"4x16": p["speedup"]}}}

    c = json.loads((tmp_path / "chunking.json").read_text())["results"]
    budget = json.loads((tmp_path / "chunking.json").read_text())["config"]["budget"]
    assert c["on"]["max_step_tokens"] <= budget < c["off"]["max_step_tokens"]  # structure, not timing
    assert c["on"]["long_prompt_prefill_steps"] > 1 and c["off"]["long_prompt_prefill_steps"] == 1
    assert c["on"]["max_gap_s"] > 0 and c["off"]["max_gap_s"] > 0

    h = json.loads((tmp_path / "host.json").read_text())
    assert h["backend"] == "trace" and (tmp_path / "host.png").stat().st_size > 1000
    kinds = {"decode_s1", "decode_s64", "mixed"}
    assert set(h["results"]["launches_per_step"]) == set(h["results"]["host_us_per_step"]) == kinds
    for k in kinds:  # structure, not timing: graphs replace the step's launches with two replays
        assert h["results"]["launches_per_step"][k]["eager"] > 10 and h["results"]["launches_per_step"][k]["graph"] == 2
        assert all(h["results"]["host_us_per_step"][k][m] > 0 for m in ("eager", "graph"))
    steps = {k: h["results"]["detail"][k]["eager"]["step"] for k in kinds}
    assert steps["decode_s1"]["tokens"] == 1 and steps["decode_s64"]["tokens"] == 64 and steps["mixed"]["seqs"] == 64
    assert any(k["kernel"].startswith("matmul") and k["bytes_read"] > 0 for k in h["results"]["detail"]["decode_s1"]["eager"]["kernels"])

    assert h["results"]["kernels"] == "fast" and h["results"]["launches_per_layer"] == 9

    k = json.loads((tmp_path / "kernels.json").read_text())  # every variant whatever --kernels (auto: simple on emu)
    assert (tmp_path / "kernels.png").stat().st_size > 1000 and k["kernels"] == "simple"
    rows = k["results"]["rows"]
    decode = [r for r in rows if r["phase"] == "decode"]
    seen = {(r["op"], r["variant"]) for r in decode}
    assert seen == {("norm", "float"), ("norm", "dp4a"), ("matmul", "float"), ("matmul", "dp4a"),
                    ("matmul", "gemv"), ("ffn_in", "gemv"),  # gemv serves steps of <= 8 tokens: decode's
                    ("matmul", "best"), ("ffn_in", "best"),  # what the fast set runs (here: dp4a's kernels)
                    ("matmul", "timed"), ("ffn_in", "timed"),  # no clock here: best's rule
                    ("ffn_in", "float"), ("ffn_in", "dp4a"), ("rope_kv", "separate"), ("rope_kv", "fused"),
                    ("attention", "warp"), ("attention", "split"), ("attention", "flash"),
                    ("sample", "block"), ("sample", "radix"),
                    ("ffn", "separate"), ("ffn", "fused"),  # the fused FFN beside dp4a's three launches
                    ("link", "separate"), ("link", "layer")}  # the link beside dp4a's eight
    assert {r["tokens"] for r in decode} == {1} and all(r["us"] > 0 and r["gb_s"] > 0 and r["bytes"] > 0 for r in rows)
    baselines = {"float", "warp", "separate", "block"}
    assert all(r["speedup"] == 1.0 for r in rows if r["variant"] in baselines)
    assert {r["shape"].split(" ")[0] for r in decode if r["op"] == "matmul"} == {"qkv", "o", "down", "lm_head"}
    # prefill: the GEMMs at N = 16 (no LM head) in all three matmul variants, with TFLOP/s; attention
    # over one 24-token prompt in all three attention variants
    prefill = [r for r in rows if r["phase"] == "prefill"]
    assert {(r["op"], r["variant"], r["tokens"]) for r in prefill if r["op"] != "attention"} == {
        (op, v, 16) for op in ("matmul", "ffn_in") for v in ("float", "dp4a", "mma", "mmq", "mmq_narrow", "best",
                                                           "timed")}
    assert {r["shape"].split(" ")[0] for r in prefill if r["op"] == "matmul"} == {"qkv", "o", "down"}
    assert {(r["variant"], r["tokens"]) for r in prefill if r["op"] == "attention"} == {
        ("warp", 24), ("split", 24), ("flash", 24)}
    assert all(r["tflops"] > 0 for r in prefill if r["variant"] != "float" or r["op"] == "attention")
    # each row's grid, recorded: mmq's is its tiles times the groups of members (split-K), narrow's 16-row tiles
    assert all(r["blocks"] >= r["launches"] >= 1 for r in rows)
    for r in prefill:
        if r["op"] == "matmul" and r["variant"] in ("mmq", "mmq_narrow"):
            n_out, n_in = map(int, r["shape"].split()[1].split("x"))
            rows_a_block = 64 if r["variant"] == "mmq" else 16
            assert (r["launches"], r["blocks"]) == (1, -(-n_out // rows_a_block) * member_groups(n_in)), r
    p = k["results"]["ptxas"]
    if p["available"]:  # NVRTC installed (the check extra): the fast and tensor kernels this model runs, none spilling
        assert p["spills"] == 0 and {e["entry"] for e in p["entries"]} >= {"matmul_dp4a_q8_0", "rmsnorm_q8_1",
                                                                            "attention_flash_f16_d32"}

    sv = json.loads((tmp_path / "serve.json").read_text())  # a real server on loopback, streamed requests
    assert (tmp_path / "serve.png").stat().st_size > 1000
    r = sv["results"]
    assert r["completed"] == r["requests"] == 12 and r["failed"] == 0 and r["server_idle_after"] is True
    assert r["output_tokens"] > 0 and r["request_throughput_per_s"] > 0 and r["output_tok_per_s"] > 0
    assert r["ttft_s"]["n"] == 12 and all(r[k]["p99"] >= r[k]["p50"] > 0 for k in ("ttft_s", "e2e_s"))
    st = r["structured"]  # the same requests with a JSON schema, and its cost beside the plain run
    assert st["completed"] == 12 and st["failed"] == 0 and st["output_tokens"] > 0
    assert r["structured_vs_plain"]["output_tok_per_s_ratio"] > 0

    sp = json.loads((tmp_path / "speculative.json").read_text())["results"]
    assert (tmp_path / "speculative.png").stat().st_size > 1000
    runs = sp["ngram"] + sp["draft"]
    assert [r["streams"] for r in sp["ngram"]] == [1] and len(sp["draft"]) == 3 and all(r["identical"] for r in runs)
    assert all(r["plain"]["generated_tokens"] == r["speculative"]["generated_tokens"] == 8 for r in runs)
    selfd = sp["draft"][-1]["speculative"]  # the model as its own draft: every greedy guess is the target's pick
    assert sp["draft"][-1]["pair"] == "self" and selfd["accepted_tokens"] == selfd["draft_tokens"] > 0
    assert selfd["target_passes_per_token"] < 1 and selfd["draft_steps"] > 0
    assert all(0 < r["speculative"]["target_passes_per_token"] <= 1 for r in runs)
    assert [(r["batch_size"], r["tokens_per_seq"]) for r in sp["step"]] == [(1, 1), (1, 4)]
    assert sp["step"][0]["x_vs_1"] == 1.0 and sp["step"][1]["step_s"] > 0
    from bench.slot.figures import figures  # what a GPU slot's summary sets beside the previous run's

    fig = figures(tmp_path)
    assert fig[f"speculative {tmp_path.name} step B=1 t=4 / t=1"] == (sp["step"][1]["x_vs_1"], "x")
    assert fig[f"speculative {tmp_path.name} self streams=1 target passes a token"][0] == selfd["target_passes_per_token"]

    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert set(out["suites"]) == {"throughput", "decode", "prefill", "chunking", "kernels", "host", "serve",
                                  "speculative"}


def test_speculative_suite_says_when_outputs_differ(monkeypatch):
    """Its `identical` can fail: guesses accepted without checking change the output, and the row says so."""
    from pathlib import Path

    from bench.suites.common import BenchContext, default_model_path
    from bench.suites.speculative import edit_prompts, run_pair
    from sharpinf.engine import speculative
    from sharpinf.model.loader import load_model
    from sharpinf.runtime.select import get_backend

    model = load_model(default_model_path())
    ctx = BenchContext(get_backend("emu"), model, "synth", Path("/nonexistent"))
    monkeypatch.setattr(speculative, "accept", lambda guesses, picks: list(guesses) + [picks[-1]])
    row = run_pair(ctx, model, edit_prompts(model, 1), 8, {"method": "ngram"}, 3)
    assert row["speculative"]["draft_tokens"] > 0 and not row["identical"] and row["first_difference_in_request"] == 0


def test_prefill_suite_sets_the_other_q8_matmuls_and_the_tensor_set_beside_fast(tmp_path):
    from typer.testing import CliRunner

    import sharpinf.cli.bench_cmd  # noqa: F401
    from sharpinf.cli import app

    res = CliRunner().invoke(app, ["bench", "--backend", "emu", "--suite", "prefill", "--quick", "--kernels", "fast",
                                   "--prefill-prompts", "2", "--prefill-len", "20", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "prefill.json").read_text())
    assert doc["config"]["configs"] == [[2, 20]]
    r = doc["results"]
    c = r["configs"][0]
    others = [f"matmul={m},attention=split,rope_kv=fused,moe=grouped" for m in ("dp4a", "mma")]
    assert r["kernels"] == "fast" and list(c["variants"]) == others + ["tensor"]
    for name in others:  # bit-identical q8_1 matmuls: the same next tokens as fast's best
        v = c["variants"][name]
        assert v["must_agree"] and v["same_next_tokens"] is True
        assert v["packed"]["tokens"] == c["packed"]["tokens"] == 40
    t = c["variants"]["tensor"]
    assert not t["must_agree"] and t["next_token_agreement"] == 1.0  # packed = sequential with flash too
    assert r["ratios"] == {k: {"prefill_tok_s": {}, "packed_vs_sequential": {"2x20": m["speedup"]}}
                           for k, m in [("fast", c), *c["variants"].items()]}


def test_host_suite_counts_the_simple_kernels_launches(tmp_path):
    """--kernels simple: the readable baselines' 14 launches a layer (llama); fast: 9."""
    from typer.testing import CliRunner

    import sharpinf.cli.bench_cmd  # noqa: F401
    from sharpinf.cli import app

    res = CliRunner().invoke(app, ["bench", "--suite", "host", "--quick", "--kernels", "simple", "--out",
                                   str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    h = json.loads((tmp_path / "host.json").read_text())["results"]
    assert h["kernels"] == "simple" and h["launches_per_layer"] == 14


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


@pytest.mark.slow
def test_gpu_check_script_writes_its_report(tmp_path):
    """bench/gpu_check.py's plumbing (subprocesses, parsing, the report), run on the emulator
    with a tiny model; on a GPU machine `make gpu-check` runs the same code with --backend cuda."""
    import subprocess
    import sys
    from pathlib import Path

    from sharpinf.model.synth import synthetic_model

    script = Path(__file__).parents[1] / "bench" / "gpu_check.py"
    model = synthetic_model("llama", "Q8_0", n_embd=64, n_layer=1, n_head=2, n_head_kv=1, n_ff=128)
    # CI: two kernel sets (verify then runs those two, not `all`), the suites whose summaries the script
    # computes (test_bench_quick_all_suites runs every suite through the same CLI) and no big model (the
    # same code runs it as MODEL); make test-all: the script's defaults, as `make gpu-check` runs them
    every = os.environ.get("SHARPINF_TEST_TIER") == "all"
    sets = ["fast", "tensor", "simple"] if every else ["fast", "simple"]
    suites = ["decode", "prefill", "throughput", "chunking", "kernels", "host", "serve"] if every else \
        ["decode", "prefill", "kernels"]
    big = synthetic_model("qwen3", "Q4_K", n_embd=256, n_layer=1) if every else ""  # stands in for the 8B shape
    proc = subprocess.run([sys.executable, str(script), "--backend", "emu", "--model", str(model), "--big-model",
                           str(big), "--only", "verify,stream,bench", "--out", str(tmp_path), "--suites",
                           ",".join(suites)] + ([] if every else ["--kernels", ",".join(sets)]),
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (report,) = tmp_path.glob("*.json")
    doc = json.loads(report.read_text())
    verify = doc["parts"]["verify"]
    assert verify["passed"] == verify["total"] > 20
    assert {f"kernels {k}" for k in sets} <= {r["case"].rsplit(", ", 1)[-1] for r in verify["results"]}
    runs = doc["parts"]["stream"]["runs"]
    assert len(runs) == (2 if big else 1) * len(sets) and {k.rsplit(" / ", 1)[1] for k in runs} == set(sets)
    assert all(r["decode_tokens_per_s"] > 0 and r["decode_tokens_per_s_eager"] > 0 for r in runs.values())
    bench = doc["parts"]["bench"]
    mine = [f"{big} {k}" for k in ("kernels", "prefill", "decode")] if big else []
    assert set(bench["suites"]) == {*suites, *mine}
    shown = f"{big} decode" if big else "decode"  # the model the ratios are printed for
    assert set(bench["ratios"]) == {"decode", "prefill"} | ({f"{big} decode", f"{big} prefill"} if big else set())
    assert set(bench["ratios"][shown]["step_time_x_vs_1"]) == {"8"}  # --quick: B = 1, 2, 4, 8
    assert f"{shown}: decode step at B = 1, 8: " in proc.stdout
    assert set(bench["kernels"]) == {"kernels", *mine[:1]} and bench["kernels"]["kernels"]["n1"]


def test_kernels_suite_times_the_routed_ffn_of_an_moe_model(tmp_path):
    """qwen3moe: the dense parts an MoE layer has (no ffn_in, no down matmul), and the moe op in both
    variants at decode and prefill N, each row with its launch's expert load and the bytes of the
    experts that load touched."""
    from typer.testing import CliRunner

    import sharpinf.cli.bench_cmd  # noqa: F401
    from sharpinf.cli import app
    from sharpinf.errors import SharpinfError
    from sharpinf.model import quants
    from sharpinf.model.synth import synthetic_model

    model = synthetic_model("qwen3moe", "Q8_0")  # n_embd 64, 8 experts of 128, 2 a token
    n_expert, k, n_embd, n_ff = 8, 2, 64, 128
    res = CliRunner().invoke(app, ["bench", str(model), "--backend", "emu", "--suite", "kernels", "--quick",
                                   "--variant", "grouped", "--repeats", "1", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    rows = json.loads((tmp_path / "kernels.json").read_text())["results"]["rows"]
    assert {(r["phase"], r["op"], r["variant"], r["tokens"]) for r in rows if r["op"] == "moe"} == {
        (phase, "moe", v, n) for phase, n in (("decode", 1), ("prefill", 16)) for v in ("warp", "grouped")}
    assert {(r["op"], r["variant"]) for r in rows if r["op"] != "moe"} == {  # the baselines (--variant grouped)
        ("norm", "float"), ("matmul", "float"), ("rope_kv", "separate"), ("attention", "warp"), ("sample", "block")}
    assert {r["shape"].split(" ")[0] for r in rows if r["op"] == "matmul" and r["phase"] == "decode"} == {
        "qkv", "o", "lm_head"}
    expert_bytes = 2 * n_ff * quants.row_bytes(quants.qtype_from_name("Q8_0"), n_embd) + n_embd * quants.row_bytes(
        quants.qtype_from_name("Q8_0"), n_ff)
    for r in (r for r in rows if r["op"] == "moe"):
        load, N = r["expert_load"], r["tokens"]
        assert r["us"] > 0 and len(load) == n_expert and sum(load) == N * k and all(n >= 0 for n in load)
        acts = N * n_embd * (9 / 8 if r["variant"] == "grouped" else 4)  # the normed rows as the variant reads them
        assert r["bytes"] == 4 * n_expert * n_embd + 8 * N * n_embd + acts + expert_bytes * sum(n > 0 for n in load)
    out = " ".join(res.output.split())
    assert "expert load, moe grouped decode N = 1: max 1, mean 0.25 (max/mean 4.00), 2 of 8 experts used" in out

    dense = synthetic_model("llama", "Q8_0", n_embd=64, n_layer=1, n_head=2, n_head_kv=1, n_ff=128)
    for m, op, why in ((model, "ffn_in", "an MoE model (qwen3moe) has no such layer"),
                       (dense, "moe", "a dense model (llama) has no such layer")):
        res = CliRunner().invoke(app, ["bench", str(m), "--backend", "emu", "--suite", "kernels", "--quick", "--op",
                                       op, "--out", str(tmp_path)])
        assert isinstance(res.exception, SharpinfError) and str(res.exception) == f"--op {op}: {why}"
