"""Weight paths are untrusted: only regular files are opened. open() on a FIFO blocks until a writer
comes, forever; a directory, a device or a symlink loop fails in ways that name no weights file."""

import errno
import os
import stat

from zoo.errors import CheckpointError

_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def regular_file(path, what: str = "weights file") -> os.stat_result:
    """The stat of `path` if it is a regular file (symlinks followed); CheckpointError otherwise."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such {what}; check the path") from None
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the name
        why = "a symlink loop" if getattr(e, "errno", None) == errno.ELOOP else getattr(e, "strerror", None) or str(e)
        raise CheckpointError(f"{path}: cannot be read as a {what} ({why})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
        raise CheckpointError(f"{path}: {kind}, not a {what}; give the path of a regular file")
    return st


def open_regular(path, what: str = "weights file") -> int:
    """A read-only descriptor of a regular file. O_NONBLOCK: should the path be swapped for a FIFO
    between the check and the open, the open still returns at once (and fstat refuses it)."""
    regular_file(path, what)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot open the {what} ({e.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CheckpointError(f"{path}: changed into something other than a regular file while being opened")
    return fd
