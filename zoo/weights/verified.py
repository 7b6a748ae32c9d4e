"""Files whose hash zoo has checked, remembered across processes, so that a 1 GB checkpoint is hashed once
and not on every load.

A file is remembered by its real path, inode, size, mtime and ctime (nanoseconds) with the hash it
matched. Any write to the file, or its replacement, changes the mtime and the ctime (which no program
can set back), so the file is hashed again; only a change that bypasses the file system (bit rot on the
disk) goes unseen until then. Records live under $ZOO_CACHE (default $XDG_CACHE_HOME/zoo or ~/.cache/zoo),
one small file each, written atomically; a record is trusted only where the user alone can write it (a record
vouches for a file, so anyone able to plant one could make a tampered file load: zoo.weights.cache_files), and an
unreadable or untrusted record is just a miss.
"""

import hashlib
import os

from zoo.caching import register, trim
from zoo.weights.cache_files import read_record, write_record

_known: set[tuple] = set()  # this process's checks
register("verified files", _known, 10_000)
_KIND = "verified"
_LIMIT = 64 << 10  # a path and five numbers: a 4 KiB path, each character escaped as \uXXXX, still fits


def _state(path) -> tuple:
    real = os.path.realpath(path)
    st = os.stat(real)
    return real, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _record(real: str) -> str:
    return hashlib.sha256(real.encode()).hexdigest()


def known(path, expected: str) -> bool:
    """Whether this exact file (unchanged since) was checked against `expected` before."""
    state = _state(path)
    if (state, expected) in _known:
        return True
    saved = read_record(_KIND, _record(state[0]), _LIMIT)
    if saved == {"state": list(state), "hash": expected}:
        trim(_known, 10_000)
        _known.add((state, expected))
        return True
    return False


def recall(path) -> str | None:
    """The full sha256 remembered for this exact file (unchanged since), if any: what a recorded weights tag
    or a hub blob is checked against, so a load hashes a file once, not every time."""
    state = _state(path)
    saved = read_record(_KIND, _record(state[0]), _LIMIT)
    found = saved.get("hash") if isinstance(saved, dict) and saved.get("state") == list(state) else None
    return found if isinstance(found, str) and len(found) == 64 else None  # not a torch.hub name's prefix


def remember(path, expected: str) -> None:
    """Note that the file matched `expected`; where the cache cannot be written, only for this process."""
    state = _state(path)
    trim(_known, 10_000)
    _known.add((state, expected))
    write_record(_KIND, _record(state[0]), {"state": list(state), "hash": expected})
