"""sha256 of a weights file, or of a sharded checkpoint's files, and the check before loading."""

import hashlib
import os
from pathlib import Path

from zoo.errors import CheckpointError
from zoo.weights.paths import open_regular


def weight_files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith((".safetensors", ".json")))
    if path.name.endswith(".safetensors.index.json"):
        from zoo.weights.sources import safetensors_files

        return [path, *safetensors_files(path)]
    return [path]


def file_sha256(path: Path) -> str:
    """The file's sha256, read once per state of the file (zoo.weights.verified: any write changes its ctime)."""
    from zoo.weights import verified

    with open(open_regular(path), "rb") as f:  # a FIFO would block open() forever
        known = verified.recall(path)
        if known:
            return known
        before = os.fstat(f.fileno()).st_ctime_ns
        found = hashlib.file_digest(f, "sha256").hexdigest()
    if os.stat(path).st_ctime_ns == before:  # not written while it was read
        verified.remember(path, found)
    return found


def digest(path: str | Path) -> tuple[str, int]:
    """(sha256 hex, bytes): of the file itself, or over `name sha256` lines of a checkpoint's files."""
    path = Path(path)
    files = weight_files(path)
    if len(files) == 1 and files[0] == path:
        return file_sha256(path), path.stat().st_size
    lines, total = [], 0
    for file in files:
        lines.append(f"{file.name} {file_sha256(file)}\n")
        total += file.stat().st_size
    return hashlib.sha256("".join(lines).encode()).hexdigest(), total


def verify(path: str | Path, sha256: str) -> None:
    if not Path(path).exists():
        raise CheckpointError(f"{path}: the recorded weights file is gone")
    actual, _ = digest(path)
    if actual != sha256:
        raise CheckpointError(f"{path}: sha256 {actual} differs from the recorded {sha256}; the file changed")
