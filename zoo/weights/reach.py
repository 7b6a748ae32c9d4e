"""Whether a server answers at all: one short probe per origin, remembered for a minute.

Without it an unreachable hub (no network, a firewall, a server that accepts and never answers) is found
only after huggingface_hub's retries (five, with 1-8 s of backoff and up to 60 s timeouts) or zoo's own
download retries. The probe is one HEAD request (the hub's whoami API, a download's own URL): any HTTP
answer, whatever its status, means reachable; no answer within TIMEOUT seconds, or no connection, means
unreachable. Proxies in the environment are used as urllib uses them.
"""

import http.client
import ssl
import threading
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from zoo.caching import register, trim

TIMEOUT = 3.0  # seconds, for the connection and for the first answer
REMEMBER = 60.0  # seconds a probe's result holds (a long-running process notices the network coming back)
_known: dict[str, tuple[float, str | None]] = {}
register("reachable servers", _known, 1024)
_lock = threading.Lock()  # one probe at a time: threads downloading shards wait for it


def unreachable(url: str) -> str | None:
    """Why the server of url does not answer a HEAD request of url, in a few words; None when it answers.
    The result holds for every URL of that server for REMEMBER seconds."""
    parts = urlsplit(url)
    origin = f"{parts.scheme}://{parts.netloc}"
    with _lock:
        at, why = _known.get(origin, (None, None))
        if at is None or time.monotonic() - at > REMEMBER:
            why = _probe(url)
            trim(_known, 1024)
            _known[origin] = time.monotonic(), why
    return why


def hub_unreachable() -> str | None:
    """The Hugging Face hub (HF_ENDPOINT) does not answer: why, and what to do; None when it answers or when
    HF_HUB_OFFLINE is set (nothing is tried then)."""
    from huggingface_hub import constants

    if constants.is_offline_mode():
        return None
    why = unreachable(constants.ENDPOINT.rstrip("/") + "/api/whoami-v2")  # 401 without a token: an answer
    return why and (
        f"the hub at {constants.ENDPOINT} could not be reached ({why}); "
        f"HF_HUB_OFFLINE=1 reads the local cache only, without trying the network"
    )


def _probe(url: str) -> str | None:
    request = urllib.request.Request(url, method="HEAD", headers={"User-Agent": "zoo"})
    try:
        urllib.request.urlopen(request, timeout=TIMEOUT).close()
    except urllib.error.HTTPError:
        return None  # an answer
    except urllib.error.URLError as e:
        if isinstance(e.reason, ssl.SSLError):
            return None  # it answered; the request itself reports the certificate
        return _said(e.reason)
    except (OSError, ValueError, http.client.HTTPException) as e:  # a timeout, a reset, no HTTP, a malformed URL
        return _said(e)
    return None


def _said(e) -> str:
    if isinstance(e, TimeoutError):
        return f"no answer within {TIMEOUT:g} s"
    return f"{type(e).__name__}: {e}" if isinstance(e, BaseException) else str(e)
