"""What comes back: ONE tarball (the result folder <gpu>-<date>/ with the runs' logs, the slot's state and
summary.md inside) and summary.md beside it, rewritten after every stage and published atomically (written
aside, then renamed into $OUT), so a command cut at any moment leaves the last whole pack. With the runner's
slot.log that is three files in $OUT, whatever happens."""

from __future__ import annotations

import errno
import io
import os
import shutil
import tarfile
from pathlib import Path

OUT_FILES = ("results.tgz", "summary.md", "slot.log")  # everything the runbook writes into $OUT
LOG_TAIL = 256 * 1024  # a log's last bytes in the tarball: the reason a run failed is at its end


def publish(src: Path, out_dir: Path, name: str) -> Path:
    """src to out_dir/name by a rename: a reader (the device tool's copy) sees the old file or the new one.
    Across file systems the copy lands first as name.part in out_dir, then is renamed (the one moment a
    fourth file exists there)."""
    dst = out_dir / name
    try:
        os.replace(src, dst)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        part = out_dir / (name + ".part")
        shutil.copyfile(src, part)
        os.replace(part, dst)
        os.unlink(src)
    return dst


def _add_tail(tar: tarfile.TarFile, path: Path, arcname: str) -> None:
    data = path.read_bytes()
    if len(data) > LOG_TAIL:
        data = b"[... the first %d bytes left out]\n" % (len(data) - LOG_TAIL) + data[-LOG_TAIL:]
    info = tarfile.TarInfo(arcname)
    info.size, info.mtime = len(data), int(path.stat().st_mtime)
    tar.addfile(info, io.BytesIO(data))


def pack(run_dir: Path, logs: Path, state_path: Path, summary: str, out_dir: Path, work: Path) -> None:
    """results.tgz (run_dir as <gpu>-<date>/, its logs/ and slot-state.json) and summary.md into out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "summary.md").write_text(summary)
    tmp = work / "results.tgz.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(run_dir, arcname=run_dir.name)
        for log in sorted(logs.glob("*.log")) if logs.is_dir() else []:
            _add_tail(tar, log, f"{run_dir.name}/logs/{log.name}")
        if state_path.exists():
            tar.add(state_path, arcname=f"{run_dir.name}/slot-state.json")
    publish(tmp, out_dir, "results.tgz")
    side = work / "summary.md.tmp"
    side.write_text(summary)
    publish(side, out_dir, "summary.md")
