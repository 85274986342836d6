"""gpu_check's `peers` part (bench/peers.py) without a GPU: stand-ins for llama-bench and
llama-batched-bench print llama.cpp's own output formats (the printf formats and JSON layout of
tools/llama-bench and tools/batched-bench at the pinned commit) with known figures; the part
must parse them, pair them with sharpinf's figures from the emulator on the same file, and
write peers.json rows of the fixed schema, a refused file recorded in its rows."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from bench_scripts import BENCH, load

ROW_KEYS = {"model", "test", "sharpinf_tok_s", "llamacpp_tok_s", "ratio", "sharpinf_kernels", "error", "sha256",
            "llamacpp_commit", "llamacpp_from"}
PP_TS, TG_TS = 4321.25, 123.5  # what the stand-in llama-bench reports
LOAD_ERROR = "llama_model_load: error loading model: error loading model vocabulary: unknown pre-tokenizer type"
S_TG_PER_SEQ = 50.0  # the stand-in llama-batched-bench's S_TG is this x B


peers = load("peers")

# llama-bench -o json: the json_printer's layout (4-space fields, samples last), one test object.
_LLAMA_BENCH_TEST = """  {{
    "build_commit": "0c1e570",
    "build_number": 1,
    "cpu_info": "AMD EPYC 9654 96-Core Processor",
    "gpu_info": "NVIDIA H100 80GB HBM3",
    "backends": "CUDA",
    "model_filename": "{model}",
    "model_type": "llama ?B Q8_0",
    "model_size": 1048576,
    "model_n_params": 1000000,
    "n_batch": 2048,
    "n_ubatch": 512,
    "n_threads": 16,
    "cpu_mask": "0x0",
    "cpu_strict": false,
    "poll": 50,
    "type_k": "f16",
    "type_v": "f16",
    "n_gpu_layers": 99,
    "n_cpu_moe": 0,
    "split_mode": "layer",
    "main_gpu": 0,
    "no_kv_offload": false,
    "flash_attn": 1,
    "devices": "auto",
    "tensor_split": "0.00",
    "tensor_buft_overrides": "none",
    "load_mode": "auto",
    "lazy_mode": "auto",
    "embeddings": false,
    "no_op_offload": 0,
    "no_host": false,
    "repack": true,
    "fit_target": 0,
    "fit_min_ctx": 0,
    "n_prompt": {p},
    "n_gen": {g},
    "n_depth": 0,
    "test_time": "2026-11-24T08:00:00Z",
    "avg_ns": {ns},
    "stddev_ns": 0,
    "avg_ts": {ts:.6f},
    "stddev_ts": 0.000000,
    "samples_ns": [ {ns} ],
    "samples_ts": [ {ts} ]
  }}"""

STAND_IN_COMMON = """
import sys
args = sys.argv[1:]
def opt(flag):
    return args[args.index(flag) + 1]
with open(CALLS_LOG, "a") as f:
    f.write(" ".join([sys.argv[0].rsplit("/", 1)[-1]] + args) + "\\n")
model = opt("-m")
"""

STAND_IN_BENCH = STAND_IN_COMMON + f"""
print("[")  # llama-bench prints its header before it loads the model
if "refuse" in model:
    sys.stderr.write({LOAD_ERROR!r} + "\\n"
                     "llama_model_load_from_file_impl: failed to load model\\n"
                     "main: error: failed to load model '" + model + "'\\n")
    sys.exit(1)
TEST = {_LLAMA_BENCH_TEST!r}
tests = [(int(opt("-p")), 0, {PP_TS}), (0, int(opt("-n")), {TG_TS})]
print(",\\n".join(TEST.format(model=model, p=p, g=g, ts=ts, ns=int((p + g) / ts * 1e9)) for p, g, ts in tests))
print("]")
"""

STAND_IN_BATCHED = STAND_IN_COMMON + f"""
if "refuse" in model:
    sys.stderr.write({LOAD_ERROR!r} + "\\n"
                     "llama_model_load_from_file_impl: failed to load model\\n"
                     "llama_batched_bench: error: unable to load model\\n")
    sys.exit(1)
c, pp, tg, npl = int(opt("-c")), int(opt("-npp")), int(opt("-ntg")), [int(b) for b in opt("-npl").split(",")]
print()
print("llama_batched_bench: n_kv_max = %d, n_batch = 2048, n_ubatch = 512, flash_attn = 1, is_pp_shared = 0, "
      "is_tg_separate = 0, n_gpu_layers = 99, n_threads = 16, n_threads_batch = 16" % c)
print()
print("|%6s | %6s | %4s | %6s | %8s | %8s | %8s | %8s | %8s | %8s |" % ("PP", "TG", "B", "N_KV", "T_PP s", "S_PP t/s",
                                                                     "T_TG s", "S_TG t/s", "T s", "S t/s"))
print("|%6s-|-%6s-|-%4s-|-%6s-|-%8s-|-%8s-|-%8s-|-%8s-|-%8s-|-%8s-|"
      % ("------", "------", "----", "------", "--------", "--------", "--------", "--------", "--------", "--------"))
for b in npl:
    if b * (pp + tg) > c:
        continue  # as llama-batched-bench does: a row the context cannot hold is skipped without a word
    t_pp, s_tg = 0.01 * b, {S_TG_PER_SEQ} * b
    t_tg = b * tg / s_tg
    print("|%6d | %6d | %4d | %6d | %8.3f | %8.2f | %8.3f | %8.2f | %8.3f | %8.2f |"
          % (pp, tg, b, b * (pp + tg), t_pp, b * pp / t_pp, t_tg, s_tg, t_pp + t_tg, b * (pp + tg) / (t_pp + t_tg)))
print()
sys.stderr.write("llama_perf_context_print:        load time =      10.00 ms\\n")
"""


def _stand_ins(folder: Path) -> Path:
    """folder/bin/llama-bench and llama-batched-bench; each appends its argv to folder/calls.log."""
    (folder / "bin").mkdir(parents=True)
    for name, body in (("llama-bench", STAND_IN_BENCH), ("llama-batched-bench", STAND_IN_BATCHED)):
        exe = folder / "bin" / name
        exe.write_text(f"#!{sys.executable}\nCALLS_LOG = {str(folder / 'calls.log')!r}\n" + body)
        exe.chmod(0o755)
    return folder


def test_parsers_read_llamacpp_formats(tmp_path):
    folder = _stand_ins(tmp_path / "llama")
    out = subprocess.run([str(folder / "bin" / "llama-bench"), "-m", "m.gguf", "-p", "512", "-n", "128"],
                         capture_output=True, text=True, check=True).stdout
    assert peers.parse_llama_bench(out) == {"pp512": PP_TS, "tg128": TG_TS}
    out = subprocess.run([str(folder / "bin" / "llama-batched-bench"), "-m", "m.gguf", "-c", "2048", "-npp", "128",
                          "-ntg", "128", "-npl", "1,8,64"], capture_output=True, text=True, check=True).stdout
    rows = peers.parse_batched_bench(out)  # B = 64 needs 64 x 256 > 2048 tokens of context: skipped
    assert [(r["pp"], r["tg"], r["b"], r["n_kv"]) for r in rows] == [(128, 128, 1, 256), (128, 128, 8, 2048)]
    assert [r["s_tg"] for r in rows] == [S_TG_PER_SEQ, 8 * S_TG_PER_SEQ]
    # the README's sample row, as llama-batched-bench prints it
    readme = "|   128 |    128 |   32 |   8192 |    3.408 |  1201.73 |    8.801 |   465.40 |   12.209 |   670.96 |"
    assert peers.parse_batched_bench(readme)[0] == {"pp": 128, "tg": 128, "b": 32, "n_kv": 8192, "t_pp": 3.408,
                                                    "s_pp": 1201.73, "t_tg": 8.801, "s_tg": 465.40, "t": 12.209,
                                                    "s": 670.96}


def test_sizes_name_the_tests_and_refuse_nonsense():
    s = peers.Sizes.parse("pp=16 tg=4 npl=1,2 npp=8 ntg=4 r=1")
    assert s.tests() == ["pp16", "tg4", "decode_s1", "decode_s2"] and s.decode_context == 10
    assert peers.Sizes.parse("").tests() == ["pp512", "tg128", "decode_s1", "decode_s8", "decode_s64"]
    for bad in ("pp=0", "tp=5", "npl=1,x", "pp"):
        with pytest.raises(peers.PeerError, match="--peers-sizes"):
            peers.Sizes.parse(bad)


def test_llamacpp_found_given_or_built_or_a_one_line_error(tmp_path, monkeypatch):
    gpu_check = load("gpu_check")
    monkeypatch.delenv(peers.ENV_VAR, raising=False)
    with pytest.raises(peers.PeerError, match="holds no bin/llama-bench"):
        peers.find_llamacpp(str(tmp_path), "cuda", gpu_check.run)
    with pytest.raises(peers.PeerError, match="built here only for --backend cuda"):
        peers.find_llamacpp(None, None, gpu_check.run)
    monkeypatch.setattr(peers, "SOURCES", (tmp_path / "nowhere",))
    with pytest.raises(peers.PeerError, match=r"pass --llamacpp DIR .* copy \.\./shared/peers/"):
        peers.find_llamacpp(None, "cuda", gpu_check.run)
    monkeypatch.setenv(peers.ENV_VAR, str(_stand_ins(tmp_path / "given")))
    assert peers.find_llamacpp(None, None, gpu_check.run).bin_dir == tmp_path / "given" / "bin"
    monkeypatch.delenv(peers.ENV_VAR)

    # a build: build_llamacpp.sh MODE DEST prints llama-bench's path last, and where it found cuBLAS
    src = tmp_path / "src"
    src.mkdir()
    built = _stand_ins(tmp_path / "built")
    script = src / "build_llamacpp.sh"
    script.write_text(f'[ "$1" = cuda ] || exit 3\necho "cuBLAS from /wheel/cublas/lib (LD_LIBRARY_PATH ...)" >&2\n'
                      f'echo {built}/bin/llama-bench\n')
    monkeypatch.setattr(peers, "SOURCES", (src,))
    llama = peers.find_llamacpp(None, "cuda", gpu_check.run)
    assert llama.bin_dir == built / "bin" and "/wheel/cublas/lib" in llama.env["LD_LIBRARY_PATH"].split(":")
    script.write_text('echo "-- Configuring incomplete"\n'
                      'echo "CMake Error: No CMAKE_CUDA_COMPILER could be found." >&2\nexit 1\n')
    with pytest.raises(peers.PeerError, match=r"build_llamacpp.sh cuda failed \(exit 1\): CMake Error: No CMAKE_CUDA"):
        peers.find_llamacpp(None, "cuda", gpu_check.run)


def test_readme_section_is_replaced_not_repeated(tmp_path):
    (tmp_path / "README.md").write_text("# A run\n\nnotes above\n")
    rows = peers.pair("m", peers.Sizes.parse("npl=1"), {"pp512": (10.0, "fast"), "tg128": (None, "sharpinf: boom")},
                      {"pp512": 20.0, "tg128": 5.0, "decode_s1": "llama-batched-bench (exit 1): refused"})
    assert [r["ratio"] for r in rows] == [0.5, None, None]
    assert rows[2]["error"] == "not measured; llama-batched-bench (exit 1): refused"
    for _ in range(2):
        peers.write(tmp_path, rows, peers.markdown(rows, peers.Sizes(), {"available": False, "reason": "r"}, "given"))
    text = (tmp_path / "README.md").read_text()
    assert text.startswith("# A run\n\nnotes above\n") and text.count(peers.PEERS_BEGIN) == 1
    assert "| m | pp512 | 10.0 | 20.0 | 0.50x | fast |  |" in text
    assert json.loads((tmp_path / "peers.json").read_text()) == rows


def test_peers_part_pairs_llamacpp_with_sharpinf_on_the_same_files(tmp_path):
    from sharpinf.model.synth import synthetic_model

    model = synthetic_model("llama", "Q8_0", n_embd=64, n_layer=1, n_head=2, n_head_kv=1, n_ff=128)
    refused = tmp_path / "refuse-me.gguf"  # the stand-ins refuse it, as llama.cpp would a file it cannot load
    shutil.copy(model, refused)
    llama = _stand_ins(tmp_path / "llama")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(BENCH / "gpu_check.py"), "--backend", "emu", "--only", "peers",
                           "--model", str(model), "--kernels", "fast", "--peers-models", f"{model},{refused}",
                           "--llamacpp", str(llama), "--peers-sizes", "pp=16 tg=4 npl=1,2 npp=8 ntg=4 r=1",
                           "--out", str(out)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]  # a refused file fails the part
    assert "peers   FAIL" in proc.stdout and f"[{model.name}, {refused.name}]" in proc.stdout
    assert f"(4 without a ratio; first: llama-bench (exit 1): {LOAD_ERROR})" in proc.stdout

    (report,) = out.glob("*.json")
    part = json.loads(report.read_text())["parts"]["peers"]
    rows = json.loads((out / report.stem / "peers.json").read_text())
    assert rows == part["rows"] and all(set(r) == ROW_KEYS for r in rows)
    tests = ["pp16", "tg4", "decode_s1", "decode_s2"]
    assert [(r["model"], r["test"]) for r in rows] == [(m.name, t) for m in (model, refused) for t in tests]
    good, bad = {r["test"]: r for r in rows[:4]}, {r["test"]: r for r in rows[4:]}

    assert [good[t]["llamacpp_tok_s"] for t in tests] == [PP_TS, TG_TS, S_TG_PER_SEQ, 2 * S_TG_PER_SEQ]
    for r in good.values():
        assert r["error"] is None and r["sharpinf_tok_s"] > 0
        # the ratio of the unrounded figures (4 digits); the rows' tok/s are rounded to 0.01, which on the
        # emulator's small figures moves their quotient by up to ~1%
        assert r["ratio"] == pytest.approx(r["sharpinf_tok_s"] / r["llamacpp_tok_s"], rel=2e-2)
    # pp: the fastest of the kernel sets the prefill suite timed (fast, mma beside it, tensor); the rest: fast
    assert good["pp16"]["sharpinf_kernels"] in {"fast", "tensor"} | {
        f"matmul={m},attention=split,rope_kv=fused,moe=grouped" for m in ("dp4a", "mma")}
    assert {good[t]["sharpinf_kernels"] for t in tests[1:]} == {"fast"}
    # the suites' own files are kept beside peers.json, a folder a model
    kept = out / report.stem / ("peers-" + re.sub(r"[^A-Za-z0-9]+", "-", model.name).strip("-"))
    assert {"decode.json", "prefill.json", "single_stream.json"} <= {f.name for f in kept.iterdir()}

    for t, r in bad.items():  # llama.cpp refused the file: recorded, sharpinf's figure kept
        assert r["llamacpp_tok_s"] is None and r["ratio"] is None and r["sharpinf_tok_s"] > 0
        tool = "llama-batched-bench" if t.startswith("decode") else "llama-bench"
        assert r["error"] == f"{tool} (exit 1): {LOAD_ERROR}"

    calls = (llama / "calls.log").read_text().splitlines()
    assert f"llama-bench -m {model} -p 16 -n 4 -r 1 -ngl 99 -fa 1 -o json" in calls
    assert f"llama-batched-bench -m {model} -c 24 -npp 8 -ntg 4 -npl 1,2 -ngl 99 -fa 1" in calls

    readme = (out / report.stem / "README.md").read_text()
    assert f"| {model.name} | decode_s2 | {good['decode_s2']['sharpinf_tok_s']:,.1f} | 100.0 |" in readme
    if importlib.util.find_spec("torch") is None:
        assert part["roofline"] == {"available": False, "reason": "torch is not installed"}
        assert "Roofline: no PyTorch roofline: torch is not installed." in readme


def test_committed_figures_only_from_the_same_gpu_commit_and_file(tmp_path):
    """--llamacpp committed: llama.cpp's figures from the newest committed run whose rows name the same GPU
    model, llama.cpp commit and file sha256; a run that recorded no sha256 (before 2026-12) never matches."""
    from bench.peer_history import committed_figures

    def run(name, rows):
        (tmp_path / name).mkdir()
        (tmp_path / name / "peers.json").write_text(json.dumps(rows))

    row = {"test": "tg128", "llamacpp_tok_s": 950.0, "sha256": "ab", "llamacpp_commit": "c1", "llamacpp_from": "run"}
    run("gpu-20261101", [row])
    run("gpu-20261201", [{**row, "llamacpp_tok_s": 990.0}])
    run("gpu-nvl-20261215", [{**row, "llamacpp_tok_s": 1.0}])  # another GPU model, whose name starts the same
    run("gpu-20261210", [{k: v for k, v in row.items() if k != "sha256"}])  # before the rows said which file
    assert committed_figures("gpu", "c1", "ab", tmp_path) == ({"tg128": 990.0}, str(tmp_path / "gpu-20261201" / "peers.json"))
    assert committed_figures("gpu", "c2", "ab", tmp_path) is None
    assert committed_figures("gpu", "c1", "cd", tmp_path) is None
