"""The records zoo keeps under $ZOO_CACHE (hash checks, timm's loader arguments): read and written only where the
current user alone can write, opened defensively, written atomically; anything else is a miss, said once.

A cache may be shared or world-writable (ZOO_CACHE=/tmp/zoo, mode 1777, a subdirectory another user made first).
There a planted record could vouch for a tampered weights file, a symlink at a predictable temporary name could
turn a write into one of the victim's files, and a FIFO, a link to /dev/zero or a record nested 100,000 deep could
hang or crash a load. So, as ssh and pip do, the cache directory, the record's subdirectory and the record itself
are trusted only if they belong to the current user and no group or other user may write them; a record is opened
without following a link and without blocking, read up to a size cap, and parsed with every failure caught.
"""

import errno
import json
import os
import stat
import tempfile
import warnings
from pathlib import Path

from zoo.caching import register, trim
from zoo.constants import cache_dir

_said: set = set()  # the causes warned about in this process: one line each, not one per record
register("cache warnings said", _said, 1000)


def warn_once(cause, message: str) -> None:
    """A one-line warning, the first time this process meets `cause` (a hashable naming the problem and where)."""
    if cause not in _said:
        trim(_said, 1000)
        _said.add(cause)
        warnings.warn(message, stacklevel=3)


def _private(st: os.stat_result) -> str | None:
    """Why a file or directory is not the current user's alone, or None where it is."""
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by you (uid {os.geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _trusted_directory(path: Path, create: bool) -> bool:
    """Whether records may be read from (and written to) `path`; made private (0700) when create and missing.
    A link to a directory is followed: only the user could have placed it in a directory of their own."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if not create:
            return False  # nothing remembered yet: a plain miss
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            os.mkdir(path, 0o700)
        except FileExistsError:  # made meanwhile, maybe by someone else: checked below
            pass
        except OSError:  # a read-only file system: only this process remembers
            return False
        return _trusted_directory(path, create=False)
    except OSError as e:
        warn_once(("unreadable", str(path)), f"zoo: {path} cannot be read ({e.strerror}); zoo keeps no records there")
        return False
    why = "not a directory" if not stat.S_ISDIR(st.st_mode) else _private(st)
    if why:
        warn_once(
            ("untrusted", str(path)),
            f"zoo: {path} is {why}: not trusted, so zoo neither reads nor writes its records there; "
            f"use a directory only you can write (chmod go-w, or set ZOO_CACHE)",
        )
        return False
    return True


def _folder(kind: str, create: bool) -> Path | None:
    """$ZOO_CACHE/kind where it and $ZOO_CACHE are trusted, else None."""
    root = cache_dir()
    if _trusted_directory(root, create) and _trusted_directory(root / kind, create):
        return root / kind
    return None


def read_record(kind: str, name: str, limit: int):
    """The JSON value of the record $ZOO_CACHE/kind/name, or None: missing, untrusted, not a regular file of the
    user's own, over `limit` bytes, or not JSON that parses (too deep included). Each is a miss, never an error."""
    folder = _folder(kind, create=False)
    if folder is None:
        return None
    path = folder / name
    try:  # O_NOFOLLOW: a link (to /dev/zero, to another user's file) is refused; O_NONBLOCK: a FIFO cannot hang it
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        why = "a symbolic link" if e.errno == errno.ELOOP else e.strerror
        warn_once(("record unreadable", str(folder)), f"zoo: {path}: {why}; ignored as a cache record")
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        why = (
            "not a regular file"
            if not stat.S_ISREG(st.st_mode)
            else _private(st) or (f"over {limit} bytes" if st.st_size > limit else None)
        )
        data = f.read(limit + 1) if why is None else b""
    if why is None and len(data) > limit:  # grew since the fstat
        why = f"over {limit} bytes"
    if why:
        cause = why.partition(" ")[0]  # "not", "owned", "writable", "over": one warning per kind and folder
        warn_once((f"record {cause}", str(folder)), f"zoo: {path} is {why}; ignored as a cache record")
        return None
    try:
        return json.loads(data)
    except (ValueError, RecursionError):  # not UTF-8, not JSON, nested past the interpreter's recursion limit
        warn_once(("record not JSON", str(folder)), f"zoo: {path} is not a JSON record zoo can read; ignored")
        return None


def write_record(kind: str, name: str, value) -> None:
    """Write the record $ZOO_CACHE/kind/name atomically: a new temporary file of a name no one can plant
    (mkstemp: O_EXCL, mode 0600) in the same directory, then renamed over the record. Where the cache is
    untrusted or cannot be written, nothing is written: the caller's process alone remembers."""
    text = json.dumps(value)
    folder = _folder(kind, create=True)
    if folder is None:
        return
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, folder / name)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
