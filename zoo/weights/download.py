"""Download one URL into a cache file: a progress bar, resume after a dropped connection, and atomic placement.

The bytes go to DEST.partial (resumed with an HTTP Range request when the server allows it, started over
when it does not), are checked against the expected sha256 (or its prefix, torch.hub's convention), and
only then renamed to DEST. A download killed at any point leaves at most a .partial file, which no loader
opens; only a verified file ever carries the final name.
"""

import hashlib
import http.client
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from zoo.errors import CheckpointError, HubUnavailable
from zoo.weights.reach import unreachable

CHUNK = 1 << 20


def fetch(
    url: str,
    dest: str | os.PathLike,
    sha256_prefix: str | None = None,
    progress: bool = True,
    retries: int = 5,
    timeout: float = 30.0,
) -> Path:
    """DEST, downloaded from url unless it is there already; sha256_prefix (any length, lower-case hex)
    is checked before the file takes its name: a mismatch is a CheckpointError and nothing is placed."""
    dest = Path(dest)
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    down = unreachable(url)  # one quick probe: a server that does not answer is not retried
    if down:
        raise HubUnavailable(
            f"{url}: the server could not be reached ({down}); nothing was downloaded "
            f"(put the file at {dest} to use it without the network)",
            "transient",
        )
    failure = None
    for attempt in range(retries + 1):
        try:
            _transfer(url, partial, progress, timeout)
            break
        except (OSError, http.client.HTTPException) as e:  # URLError, a reset, a timeout, IncompleteRead
            if isinstance(e, urllib.error.HTTPError) and e.code < 500 and e.code != 416:
                raise HubUnavailable(f"{url}: HTTP {e.code} {e.reason}") from None
            if isinstance(e, urllib.error.HTTPError) and e.code == 416:
                partial.unlink(missing_ok=True)  # the partial file is longer than the file: start over
            failure = e
            time.sleep(min(0.2 * 2**attempt, 5))
    else:
        kept = f"; the partial file {partial} is kept for the next try" if partial.exists() else ""
        raise HubUnavailable(
            f"{url}: download failed after {retries + 1} tries ({type(failure).__name__}: {failure}){kept}"
        ) from None
    actual = _sha256(partial)
    if sha256_prefix and not actual.startswith(sha256_prefix):
        partial.unlink(missing_ok=True)
        raise CheckpointError(
            f"{url}: downloaded file's sha256 {actual} does not start with the expected "
            f"{sha256_prefix}; nothing was placed in the cache"
        )
    os.replace(partial, dest)  # atomic on one file system: the name appears only for a complete, checked file
    if sha256_prefix:
        from zoo.weights import verified

        verified.remember(dest, sha256_prefix)  # just hashed: a load right after need not hash it again
    return dest


def _transfer(url: str, partial: Path, progress: bool, timeout: float) -> None:
    have = partial.stat().st_size if partial.exists() else 0
    request = urllib.request.Request(
        url, headers={"User-Agent": "zoo", **({"Range": f"bytes={have}-"} if have else {})}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        if have and response.status != 206:  # the server ignored the range: its answer is the whole file
            have = 0
        length = response.headers.get("Content-Length")
        total = have + int(length) if length is not None else None
        bar = _bar(total, have, partial.name.removesuffix(".partial"), progress)
        try:
            with open(partial, "ab" if have else "wb") as f:
                done = have
                while chunk := response.read(CHUNK):
                    f.write(chunk)
                    done += len(chunk)
                    bar.update(len(chunk))
            if total is not None and done != total:  # the connection closed early without an error
                raise ConnectionError(f"connection closed after {done} of {total} bytes")
        finally:
            bar.close()


def _bar(total, initial, name, enabled):
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        initial=initial,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=name,
        disable=not enabled,
        file=sys.stderr,
    )


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
