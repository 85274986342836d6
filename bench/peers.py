"""llama.cpp beside sharpinf on the same GGUF files in the same run: gpu_check's `peers` part.

For each model, sharpinf's figures from the benches it already has, then llama.cpp's own benches
for the same tests on the same file, paired in rows of OUT/<gpu>-<date>/peers.json:

    {"model", "test", "sharpinf_tok_s", "llamacpp_tok_s", "ratio", "sharpinf_kernels", "error"}

ratio = sharpinf / llama.cpp (above 1: sharpinf is faster); a figure that could not be taken is
null and `error` says why in one line (e.g. llama.cpp refusing the file). The tests (the default
sizes; `--peers-sizes` changes them, the names follow):

  pp512       llama-bench -p 512 (one 512-token batch)        sharpinf's prefill suite, 1 prompt x 512
                                                              (the fastest of the kernel sets it times)
  tg128       llama-bench -n 128 (128 tokens one at a time)   bench/single_stream.py --prompt 1 --decode 128
                                                              (through the engine, CUDA graphs)
  decode_sN   llama-batched-bench -npp 128 -ntg 128 -npl N:   the decode suite at B = N, context 128 + 64
              S_TG, N sequences decoding together             (the forward pass, eager)

llama.cpp runs with -ngl 99 -fa 1. It comes from --llamacpp DIR or SHARPINF_LLAMACPP (a build
folder holding bin/llama-bench), else it is built here from .peers/ (a copy of ../shared/peers/:
the pinned source and build_llamacpp.sh; git-ignored, carried to a GPU machine). --llamacpp committed
runs none: its figures from the newest committed run with the same GPU, commit and file (bench/
peer_history.py; each row records the file's sha256, the commit and `llamacpp_from`). The table goes
into the run folder's README between PEERS_BEGIN and PEERS_END, under a roofline row from the
device's own PyTorch (`python bench/peers.py roofline`: bf16 GEMM TFLOP/s, copy GB/s).
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from bench.peer_history import committed_figures, file_sha256

ROOT = Path(__file__).resolve().parents[1]
ENV_VAR = "SHARPINF_LLAMACPP"
SOURCES = (ROOT / ".peers", ROOT.parent / "shared" / "peers")  # carried copy first, then the checkout's neighbour
BUILD_DIR = Path(tempfile.gettempdir()) / "sharpinf-llamacpp"
LLAMACPP_PIN = "0c1e570"  # the commit ../shared/peers/ holds (llama.cpp-<commit>-src.tar.xz), what gets built
COMMITTED = "committed"  # --llamacpp committed: no build, no run; llama.cpp's figures from committed_figures
PEERS_BEGIN, PEERS_END = "<!-- peers: bench/gpu_check.py writes this section -->", "<!-- /peers -->"

Run = Callable[..., tuple]  # gpu_check.run: (cmd, timeout, env=None) -> (rc, stdout, stdout + stderr, seconds)


class PeerError(Exception):
    """llama.cpp missing, failing to build, or refusing a file: one line, recorded, never a crash."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log  # the end of the failing command's output, for the report


@dataclass(frozen=True)
class Sizes:
    pp: int = 512  # llama-bench -p: one prompt of pp tokens
    tg: int = 128  # llama-bench -n: tg tokens one at a time
    npl: tuple[int, ...] = (1, 8, 64)  # llama-batched-bench -npl: sequences decoding together
    npp: int = 128  # llama-batched-bench -npp: each sequence's prompt
    ntg: int = 128  # llama-batched-bench -ntg: tokens each sequence generates
    r: int = 5  # repeats: llama-bench -r, sharpinf's --repeats

    @classmethod
    def parse(cls, text: str) -> "Sizes":
        """"pp=16 tg=4 npl=1,2 npp=8 ntg=4 r=1" (any subset; llama.cpp's flag names)."""
        kw: dict = {}
        for item in text.split():
            key, _, value = item.partition("=")
            if key not in cls.__dataclass_fields__ or not value:
                raise PeerError(f"--peers-sizes: {item!r} is not KEY=VALUE with KEY one of "
                                f"{', '.join(cls.__dataclass_fields__)}")
            try:
                kw[key] = tuple(int(v) for v in value.split(",")) if key == "npl" else int(value)
            except ValueError:
                raise PeerError(f"--peers-sizes: {item!r}: not an integer") from None
        sizes = cls(**kw)
        if min(sizes.npl + (sizes.pp, sizes.tg, sizes.npp, sizes.ntg, sizes.r)) < 1:
            raise PeerError(f"--peers-sizes: every size must be >= 1, got {text!r}")
        return sizes

    @property
    def decode_context(self) -> int:
        """sharpinf's decode context for decode_sN: the middle of batched-bench's npp..npp+ntg."""
        return self.npp + self.ntg // 2

    def tests(self) -> list[str]:
        return [f"pp{self.pp}", f"tg{self.tg}"] + [f"decode_s{n}" for n in self.npl]


# -- llama.cpp: found or built ---------------------------------------------------------------
@dataclass
class Llama:
    bin_dir: Path
    env: dict = field(default_factory=dict)  # LD_LIBRARY_PATH for a cuBLAS the build took from a pip wheel
    how: str = ""

    def exe(self, name: str) -> str:
        return str(self.bin_dir / name)


def _bin_dir(d: Path) -> Path | None:
    for b in (d / "bin", d):
        if (b / "llama-bench").is_file() and (b / "llama-batched-bench").is_file():
            return b
    return None


def find_llamacpp(explicit: str | None, mode: str | None, run: Run) -> Llama:
    """--llamacpp DIR, else $SHARPINF_LLAMACPP, else a build from the first of SOURCES that holds
    build_llamacpp.sh into BUILD_DIR (mode: cuda; None: no build, e.g. on the emulator, where a CPU
    build would take half an hour)."""
    given = explicit or os.environ.get(ENV_VAR)
    if given:
        b = _bin_dir(Path(given).expanduser())
        if b is None:
            raise PeerError(f"llama.cpp: {given} holds no bin/llama-bench and bin/llama-batched-bench")
        return Llama(b, how=f"given: {b}")
    if mode is None:
        raise PeerError(f"llama.cpp: pass --llamacpp DIR (a build with bin/llama-bench) or ${ENV_VAR}; it is "
                        "built here only for --backend cuda")
    src = next((s for s in SOURCES if (s / "build_llamacpp.sh").is_file()), None)
    if src is None:
        raise PeerError(f"llama.cpp: pass --llamacpp DIR (a build with bin/llama-bench) or ${ENV_VAR}, or copy "
                        f"../shared/peers/ into {ROOT / '.peers'} to build it here")
    rc, out, log, secs = run(["bash", str(src / "build_llamacpp.sh"), mode, str(BUILD_DIR)], 1800)
    lines = out.strip().splitlines()
    b = _bin_dir(Path(lines[-1]).parent) if rc == 0 and lines else None
    if b is None:
        raise PeerError(f"llama.cpp: build_llamacpp.sh {mode} failed (exit {rc}): {_reason(log)}", log[-3000:])
    env = {}
    cub = re.search(r"cuBLAS from (\S+)", log)
    if cub:  # the script's symlink folder and the wheel's own: what llama-bench loads at run time
        paths = [str(BUILD_DIR / "cublas-shim" / "lib"), cub.group(1), os.environ.get("LD_LIBRARY_PATH", "")]
        env["LD_LIBRARY_PATH"] = ":".join(p for p in paths if p)
    return Llama(b, env, how=f"built from {src} ({mode}) in {secs:.0f} s: {b}")


def _reason(log: str) -> str:
    """The line of a failed command's output that says why: llama.cpp's load error, else the last
    error, else the last line."""
    lines = [l.strip() for l in log.splitlines() if l.strip()]
    load = [l for l in lines if "error loading model" in l]
    errors = [l for l in lines if re.search(r"\berror\b|failed", l, re.I)]
    return (load[:1] or errors[-1:] or lines[-1:] or ["no output"])[0]


# -- llama.cpp's output ----------------------------------------------------------------------
def parse_llama_bench(text: str) -> dict[str, float]:
    """llama-bench -o json: a list of test objects -> {"pp512": avg_ts, "tg128": avg_ts}
    (named as llama-bench's markdown names them: ppN, tgN, ppN+tgN)."""
    out = {}
    for t in json.loads(text):
        p, g = int(t["n_prompt"]), int(t["n_gen"])
        name = f"pp{p}" if g == 0 else f"tg{g}" if p == 0 else f"pp{p}+tg{g}"
        out[name] = float(t["avg_ts"])
    return out


BATCHED_COLUMNS = ("pp", "tg", "b", "n_kv", "t_pp", "s_pp", "t_tg", "s_tg", "t", "s")


def parse_batched_bench(text: str) -> list[dict]:
    """llama-batched-bench's markdown table (| PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s |
    S_TG t/s | T s | S t/s |) -> a dict per data row; the header and the |---| rule are skipped."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.lstrip().startswith("|") else []
        if len(cells) == len(BATCHED_COLUMNS) and all(re.fullmatch(r"-?[\d.]+", c) for c in cells):
            rows.append({k: (float(c) if "." in c else int(c)) for k, c in zip(BATCHED_COLUMNS, cells)})
    return rows


def llama_bench(llama: Llama, model: Path, sizes: Sizes, run: Run) -> dict[str, float]:
    rc, out, log, _ = run([llama.exe("llama-bench"), "-m", str(model), "-p", str(sizes.pp), "-n", str(sizes.tg),
                           "-r", str(sizes.r), "-ngl", "99", "-fa", "1", "-o", "json"], 900, env=llama.env)
    if rc != 0:
        raise PeerError(f"llama-bench (exit {rc}): {_reason(log)}")
    try:
        return parse_llama_bench(out)
    except (ValueError, KeyError, TypeError) as exc:
        raise PeerError(f"llama-bench printed no JSON test list ({type(exc).__name__}: {exc})") from None


def batched_bench(llama: Llama, model: Path, sizes: Sizes, run: Run) -> dict[int, float]:
    """{N: S_TG tokens/s} for each N of sizes.npl. The context holds every sequence whole (a row
    that would not fit is skipped by llama-batched-bench without a word)."""
    ctx = max(sizes.npl) * (sizes.npp + sizes.ntg)
    rc, out, log, _ = run([llama.exe("llama-batched-bench"), "-m", str(model), "-c", str(ctx), "-npp", str(sizes.npp),
                           "-ntg", str(sizes.ntg), "-npl", ",".join(map(str, sizes.npl)), "-ngl", "99", "-fa", "1"],
                          900, env=llama.env)
    if rc != 0:
        raise PeerError(f"llama-batched-bench (exit {rc}): {_reason(log)}")
    got = {r["b"]: float(r["s_tg"]) for r in parse_batched_bench(out) if (r["pp"], r["tg"]) == (sizes.npp, sizes.ntg)}
    missing = [n for n in sizes.npl if n not in got]
    if missing:
        raise PeerError(f"llama-batched-bench printed no row for B = {missing}: {_reason(log)}")
    return got


# -- sharpinf's figures for the same tests -----------------------------------------------------
def sharpinf_figures(model: Path, backend: str, kernels: str, sizes: Sizes, run: Run,
                     keep: Path | None = None) -> dict[str, tuple]:
    """{test: (tok/s, kernel set) or (None, error)} from the existing benches, run on the same file;
    keep: a folder for their files (decode.json, prefill.json, single_stream.json), else a temporary one."""
    py, figs = sys.executable, {}
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sharpinf-peers-") as scratch:
        tmp = str(keep) if keep is not None else scratch
        rc, out, log, _ = run([py, "-m", "sharpinf", "bench", str(model), "--backend", backend, "--kernels", kernels,
                               "--suite", "decode,prefill", "--batch-sizes", ",".join(map(str, sizes.npl)),
                               "--context", str(sizes.decode_context), "--prefill-prompts", "1", "--prefill-len",
                               str(sizes.pp), "--repeats", str(sizes.r), "--out", tmp, "--json"], 3600)
        suites = _last_json(out).get("suites", {}) if rc == 0 else {}
        decode, prefill = suites.get("decode"), suites.get("prefill")
        why = f"sharpinf bench (exit {rc}): {_reason(log)}"
        for n in sizes.npl:
            rows = [r for r in (decode or {}).get("results", {}).get("rows", []) if r["batch_size"] == n]
            figs[f"decode_s{n}"] = (rows[0]["tok_per_s"], decode["kernels"]) if rows else (None, why)
        best = [(r["prefill_tok_s"][str(sizes.pp)], k) for k, r in (prefill or {}).get("results", {})
                .get("ratios", {}).items() if str(sizes.pp) in r["prefill_tok_s"]]
        figs[f"pp{sizes.pp}"] = max(best) if best else (None, why)

        ss = Path(tmp) / "single_stream.json"
        rc, out, log, _ = run([py, str(ROOT / "bench" / "single_stream.py"), "--model", str(model), "--backend",
                               backend, "--kernels", kernels, "--prompt", "1", "--decode", str(sizes.tg),
                               "--repeats", str(sizes.r), "--out", str(ss)], 3600)
        figs[f"tg{sizes.tg}"] = ((json.loads(ss.read_text())["decode_tokens_per_s"], kernels) if rc == 0 else
                                 (None, f"single_stream (exit {rc}): {_reason(log)}"))
    return figs


def _last_json(out: str) -> dict:
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {}


# -- rows, the table, the files --------------------------------------------------------------
def pair(model: str, sizes: Sizes, sharp: dict[str, tuple], llama: dict[str, float | str],
         facts: dict | None = None) -> list[dict]:
    """One row per test; llama maps a test to tok/s or to the one-line reason it has none; facts (the file's
    sha256, llama.cpp's commit, where its figures came from) go into every row."""
    rows = []
    for test in sizes.tests():
        s, how = sharp.get(test, (None, "not measured"))
        l = llama.get(test, "not measured")
        errors = [e for e in ((how if s is None else None), (l if isinstance(l, str) else None)) if e]
        lt = None if isinstance(l, str) else l
        rows.append({"model": model, "test": test, "sharpinf_tok_s": s and round(s, 2),
                     "llamacpp_tok_s": lt and round(lt, 2), "ratio": float(f"{s / lt:.4g}") if s and lt else None,
                     "sharpinf_kernels": how if s is not None else None, "error": "; ".join(errors) or None,
                     **(facts or {})})
    return rows


def markdown(rows: list[dict], sizes: Sizes, roofline: dict, how: str) -> str:
    fmt = lambda v: "-" if v is None else f"{v:,.1f}"  # noqa: E731
    lines = ["| model | test | sharpinf tok/s | llama.cpp tok/s | sharpinf / llama.cpp | sharpinf kernels | note |",
             "| --- | --- | ---: | ---: | ---: | --- | --- |"]
    for r in rows:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        lines.append(f"| {r['model']} | {r['test']} | {fmt(r['sharpinf_tok_s'])} | {fmt(r['llamacpp_tok_s'])} | "
                     f"{ratio} | {r['sharpinf_kernels'] or '-'} | {(r['error'] or '').replace('|', '/')} |")
    if roofline.get("available"):
        ceiling = (f"PyTorch {roofline['torch']} on this device: bf16 GEMM {roofline['gemm']} "
                   f"{roofline['bf16_gemm_tflops']:,.0f} TFLOP/s; device copy {roofline['copy_gb_s']:,.0f} GB/s "
                   f"(read + write)")
    else:
        ceiling = f"no PyTorch roofline: {roofline.get('reason', 'not measured')}"
    return "\n".join([
        f"Roofline: {ceiling}.", "",
        *lines, "",
        f"pp{sizes.pp}: llama-bench -p {sizes.pp} vs sharpinf's prefill suite, 1 prompt x {sizes.pp} (fastest kernel "
        f"set). tg{sizes.tg}: llama-bench -n {sizes.tg} vs bench/single_stream.py --prompt 1 --decode {sizes.tg} "
        f"(engine, graphs). decode_sN: llama-batched-bench -npp {sizes.npp} -ntg {sizes.ntg} -npl N (S_TG) vs the "
        f"decode suite at B = N, context {sizes.decode_context} (forward pass, eager). llama.cpp: -ngl 99 -fa 1, "
        f"{how}.",
    ])


def write(out_dir: Path, rows: list[dict], table: str) -> None:
    """peers.json, and the table into out_dir/README.md between the markers (the rest of it kept)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "peers.json").write_text(json.dumps(rows, indent=2) + "\n")
    readme = out_dir / "README.md"
    section = f"{PEERS_BEGIN}\n## sharpinf beside llama.cpp (same files, same run)\n\n{table}\n{PEERS_END}"
    text = readme.read_text() if readme.exists() else f"# {out_dir.name}\n"
    if PEERS_BEGIN in text and PEERS_END in text:
        head, rest = text.split(PEERS_BEGIN, 1)
        text = head + section + rest.split(PEERS_END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    readme.write_text(text)


# -- the part --------------------------------------------------------------------------------
def llama_figures(llama: Llama, model: Path, sizes: Sizes, run: Run) -> dict[str, float | str]:
    """{test: tok/s, or the one line saying why llama.cpp gave none (a refused file)}."""
    figs: dict = {}
    try:
        figs.update(llama_bench(llama, model, sizes, run))
    except PeerError as exc:
        figs.update({f"pp{sizes.pp}": str(exc), f"tg{sizes.tg}": str(exc)})
    try:
        figs.update({f"decode_s{n}": v for n, v in batched_bench(llama, model, sizes, run).items()})
    except PeerError as exc:
        figs.update({f"decode_s{n}": str(exc) for n in sizes.npl})
    return figs


def part(models: list[tuple[str, Path]], backend: str, kernels: str, sizes: Sizes, out_dir: Path,
         llamacpp: str | None, run: Run) -> dict:
    """models: (label, GGUF path) pairs. The rows are written after each model, so a run cut short
    keeps the models it finished."""
    rc, out, log, _ = run([sys.executable, str(Path(__file__)), "roofline"], 600)
    roofline = _last_json(out) if rc == 0 else {"available": False, "reason": f"exit {rc}: {_reason(log)}"}
    llama = None
    if llamacpp != COMMITTED:
        try:
            llama = find_llamacpp(llamacpp, "cuda" if backend == "cuda" else None, run)
        except PeerError as exc:
            return {"ok": False, "error": str(exc), "log": exc.log, "roofline": roofline, "rows": []}
    how = llama.how if llama else "figures from the newest committed run with the same commit and file"
    gpu_slug = out_dir.name.rsplit("-", 1)[0]  # out_dir: <gpu>-<date>
    rows: list[dict] = []
    for label, path in models:
        keep = out_dir / f"peers-{re.sub(r'[^A-Za-z0-9]+', '-', label).strip('-')}"  # the suites' own files
        sha = file_sha256(path)
        facts = {"sha256": sha, "llamacpp_commit": LLAMACPP_PIN, "llamacpp_from": "run"}
        if llama is not None:
            theirs = llama_figures(llama, path, sizes, run)
        else:
            found = committed_figures(gpu_slug, LLAMACPP_PIN, sha)
            why = (f"no llama.cpp build at hand and no committed run on {gpu_slug} with llama.cpp {LLAMACPP_PIN} "
                   f"on this file (sha256 {sha[:12]})")
            theirs = found[0] if found else {t: why for t in sizes.tests()}
            facts["llamacpp_from"] = found[1] if found else None
        rows += pair(label, sizes, sharpinf_figures(path, backend, kernels, sizes, run, keep), theirs, facts)
        write(out_dir, rows, markdown(rows, sizes, roofline, how))
    return {"ok": all(r["error"] is None for r in rows), "llamacpp": how, "sizes": asdict(sizes),
            "roofline": roofline, "rows": rows, "files": [str(out_dir / "peers.json"), str(out_dir / "README.md")]}


def summary(r: dict) -> str:
    """gpu_check's line: each model's ratios, and the first error."""
    if not r["rows"]:
        return r.get("error", "no rows")
    by_model: dict = {}
    for row in r["rows"]:
        v = f"{row['ratio']:.2f}x" if row["ratio"] is not None else "-"
        by_model.setdefault(row["model"], []).append(f"{row['test']} {v}")
    errors = [row["error"] for row in r["rows"] if row["error"]]
    return ("sharpinf / llama.cpp: " + "; ".join(f"{m}: {', '.join(v)}" for m, v in by_model.items())
            + (f" ({len(errors)} without a ratio; first: {errors[0]})" if errors else ""))


# -- the ceiling -----------------------------------------------------------------------------
def torch_roofline(n: int = 8192, copy_bytes: int = 1 << 30, iters: int = 20) -> dict:
    """bf16 GEMM n x n x n TFLOP/s and device-to-device copy GB/s (bytes read + written) from the
    device's own PyTorch: the ceilings the figures above sit under."""
    try:
        import torch
    except ImportError:
        return {"available": False, "reason": "torch is not installed"}
    if not torch.cuda.is_available():
        return {"available": False, "reason": f"torch {torch.__version__} sees no CUDA device"}

    def seconds(fn) -> float:
        for _ in range(3):  # cuBLAS picks its kernel, the clocks rise
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters

    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    gemm = seconds(lambda: a @ b)
    src = torch.empty(copy_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy = seconds(lambda: dst.copy_(src))
    return {"available": True, "torch": torch.__version__, "device": torch.cuda.get_device_name(),
            "gemm": f"{n}x{n}x{n}", "bf16_gemm_tflops": round(2 * n**3 / gemm / 1e12, 1),
            "copy_bytes": copy_bytes, "copy_gb_s": round(2 * copy_bytes / copy / 1e9, 1)}


if __name__ == "__main__":
    if sys.argv[1:] != ["roofline"]:
        raise SystemExit("usage: python bench/peers.py roofline   (gpu_check.py --only peers runs the rest)")
    print(json.dumps(torch_roofline()))
