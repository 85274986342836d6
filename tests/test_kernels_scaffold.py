"""`sharpinf kernels new`: a new attention variant touches its own .cu file and one registry entry,
and is at once in `kernels list`, the --kernels help, `--kernels all`, the kernels bench, the kernel
tests and verify -- done here as a researcher would, in a sandbox (a copy of kernels_cu/ and of the
registry, pointed at by SHARPINF_KERNELS_DIR and SHARPINF_VARIANTS), through the command line."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sharpinf.errors import SharpinfError
from sharpinf.model.synth import synthetic_model
from sharpinf.ops import variants as V
from sharpinf.ops.scaffold import body_of, new_variant
from test_kernel_headers import problems as header_problems
from sharpinf.runtime.paths import kernels_dir

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.once  # its kernel runs are a copy of attention.cu, re-run in reverse by its own tests


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _sharpinf(env, *args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_a_new_attention_variant_is_two_files_and_everywhere(tmp_path):
    # the kernel files linked, not copied: the emulator's builds key on the resolved source, so the
    # kernels the new variant does not touch come from the cache (the scaffold only adds a file)
    shutil.copytree(kernels_dir(), tmp_path / "kernels_cu", copy_function=os.symlink)
    shutil.copy(V.REGISTRY_FILE, tmp_path / "variants.toml")
    env = {**os.environ, "SHARPINF_KERNELS_DIR": str(tmp_path / "kernels_cu"),
           "SHARPINF_VARIANTS": str(tmp_path / "variants.toml"), "SHARPINF_PROGRESS": "0"}
    before = _tree(tmp_path)

    r = _sharpinf(env, "sharpinf", "kernels", "new", "attention", "mine", "--json")
    assert r.returncode == 0, r.stderr
    made = json.loads(r.stdout)
    assert (made["file"], made["like"]) == (str(tmp_path / "kernels_cu" / "attention_mine.cu"), "warp")
    after = _tree(tmp_path)
    changed = sorted(k for k in after if before.get(k) != after[k])
    assert changed == ["kernels_cu/attention_mine.cu", "variants.toml"], changed  # nothing else touched
    assert after["variants.toml"].startswith(before["variants.toml"])  # the registry only gained an entry
    made_text = after["kernels_cu/attention_mine.cu"].decode()
    assert made_text.endswith(body_of(before["kernels_cu/attention.cu"].decode()))  # a copy, under a header of its own
    assert header_problems("attention_mine.cu", made_text) == []  # a contract, as every kernel's header

    listed = json.loads(_sharpinf(env, "sharpinf", "kernels", "list", "--json").stdout)
    assert {"op": "attention", "variant": "mine", "like": "warp"}.items() <= next(
        row for row in listed if row["variant"] == "mine").items()
    assert "sharpinf kernels list" in re.sub(r"[\s│]+", " ", _sharpinf(env, "sharpinf", "verify", "--help").stdout)
    r = _sharpinf(env, "sharpinf", "kernels", "new", "attention", "mine")
    assert r.returncode == 1 and "attention=mine is already registered" in r.stderr

    tiny = str(synthetic_model("llama", "Q8_0", n_layer=1, n_embd=64, n_head=2, n_head_kv=1, n_ff=128))
    probe = ("from sharpinf.ops.variants import choices_for; from sharpinf.step.forward import ForwardPass; "
             "from sharpinf.model.loader import load_model; from sharpinf.runtime.emu_backend import EmuBackend; "
             f"fp = ForwardPass(load_model({tiny!r}), EmuBackend(), kernels='attention=mine', compile_ahead=False); "
             "print(choices_for('all')); print(sorted({f for f, _ in fp.kernels_used('f16')}))")
    r = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "attention=mine" in r.stdout.splitlines()[0]  # --kernels all
    assert "attention_mine.cu" in r.stdout.splitlines()[1] and "'attention.cu'" not in r.stdout  # dispatched

    r = _sharpinf(env, "sharpinf", "bench", tiny, "--backend", "emu", "--suite", "kernels", "--op", "attention",
                  "--variant", "mine", "--batch-sizes", "1", "--prefill-sizes", "16", "--quick", "--json",
                  "--out", str(tmp_path / "bench"))
    assert r.returncode == 0, r.stderr
    results = json.loads(r.stdout)["suites"]["kernels"]["results"]
    rows = results["rows"]
    assert {row["variant"] for row in rows} == {"warp", "mine"} and all(row["repeats"] >= 5 for row in rows)
    if results["ptxas"]["available"]:  # NVRTC there: the new file's kernels in the registers/spills report
        assert {e["file"] for e in results["ptxas"]["entries"]} == {"attention_mine.cu"}

    r = _sharpinf(env, "pytest", "-q", "-p", "no:cacheprovider", "tests/test_kernels_attention.py",
                  "-k", "mine and (one_key or decode_and_mixed)")
    passed = re.search(r"(\d+) passed", r.stdout)
    assert r.returncode == 0 and passed and int(passed.group(1)) >= 4, r.stdout  # every KV dtype, and one key

    r = _sharpinf(env, "sharpinf", "verify", tiny, "--backend", "emu", "--kernels", "attention=mine", "--only",
                  "kernel,packed-vs-sequential", "--kv-dtype", "f16", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    results = json.loads(r.stdout)
    assert len(results) == 2 and all(x["passed"] and "attention=mine" in x["case"] for x in results)


def test_the_scaffold_refuses_clashes_in_one_line(tmp_path, monkeypatch):
    for bad, why in (("Mine", "lowercase identifier"), ("fast", "names a kernel set"), ("split", "already registered"),
                     ("1x", "lowercase identifier")):
        with pytest.raises(SharpinfError, match=why):
            new_variant("attention", bad)
    with pytest.raises(SharpinfError, match="unknown op 'softmax'"):
        new_variant("softmax", "mine")
    with pytest.raises(SharpinfError, match="unknown attention variant 'nope'"):
        new_variant("attention", "mine", like="nope")


def test_a_new_variant_that_needs_scratch_runs_with_its_scratch_allocated(tmp_path):
    """`kernels new sample wide --from radix`: radix needs scratch (each row's counts, masses and
    histograms), and so does its copy -- the entry says so (`scratch = ...`, written out), the Workspace
    holds it for --kernels sample=wide (ws.sample_acc, the copy's), and the copy's own kernels run on it,
    sampling radix's tokens; nothing but its .cu file and one registry entry is touched."""
    shutil.copytree(kernels_dir(), tmp_path / "kernels_cu", copy_function=os.symlink)
    shutil.copy(V.REGISTRY_FILE, tmp_path / "variants.toml")
    env = {**os.environ, "SHARPINF_KERNELS_DIR": str(tmp_path / "kernels_cu"),
           "SHARPINF_VARIANTS": str(tmp_path / "variants.toml"), "SHARPINF_PROGRESS": "0"}
    before = _tree(tmp_path)
    r = _sharpinf(env, "sharpinf", "kernels", "new", "sample", "wide", "--from", "radix", "--json")
    assert r.returncode == 0, r.stderr
    after = _tree(tmp_path)
    assert sorted(k for k in after if before.get(k) != after[k]) == ["kernels_cu/sample_wide.cu", "variants.toml"]
    entry = after["variants.toml"][len(before["variants.toml"]):].decode()
    assert 'like = "radix"' in entry and 'scratch = "sharpinf.ops.sampling:radix_scratch"' in entry, entry

    tiny = str(synthetic_model("llama", "Q8_0", n_layer=1, n_embd=64, n_head=2, n_head_kv=1, n_ff=128))
    probe = ("from sharpinf.llm import LLM; from sharpinf.params import SamplingParams; "
             "sp = SamplingParams(max_tokens=6, temperature=1.0, top_p=0.9, seed=3, ignore_eos=True); "
             "runs = {k: LLM(" + repr(tiny) + ", backend='emu', kernels=k, num_blocks=16) for k in ('sample=wide', 'sample=radix')}; "
             "fp = runs['sample=wide'].engine.fp; print(fp.ws.scratch_of); "
             "print(sorted({f for f, _ in fp.kernels_used('f16')})); "
             "print([llm.generate([[5, 6, 7], [9]], sp)[i].token_ids for llm in runs.values() for i in range(2)])")
    r = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    scratch, files, tokens = r.stdout.splitlines()[-3:]
    assert scratch == "{'sample_acc': 'sample=wide'}", scratch  # allocated for the copy, by its declaration
    assert "'sample_wide.cu'" in files and "'sampling_radix.cu'" not in files, files  # its own kernels ran
    toks = eval(tokens)  # [wide's two requests, radix's two]
    assert toks[:2] == toks[2:] and all(len(t) == 6 for t in toks), toks
