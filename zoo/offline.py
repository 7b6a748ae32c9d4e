"""No downloads during a build: for the building thread only, torch.hub refuses and huggingface_hub is offline.

Below the families, so that a family's index-time hooks (zoo.families.timm_loader's catch) run under it as builds do.
"""

import contextlib
import contextvars

from zoo.errors import DownloadBlocked
from zoo.scoped import guard, scope

_NO_DOWNLOADS = contextvars.ContextVar("zoo_no_downloads", default=False)


def _refusing(download_url_to_file):
    def guarded(url, *args, **kwargs):
        if _NO_DOWNLOADS.get():
            raise DownloadBlocked(f"a meta build tried to download {url}; builds never download")
        return download_url_to_file(url, *args, **kwargs)

    return guarded


def _offline(is_offline_mode):
    # huggingface_hub reads HF_HUB_OFFLINE from the environment once, at import; at call time its HTTP
    # hook (every request of its session) and transformers ask is_offline_mode(), so that is the switch.
    def guarded():
        return _NO_DOWNLOADS.get() or is_offline_mode()

    return guarded


@contextlib.contextmanager
def no_downloads():
    """For this thread's build only: torch.hub refuses to download (DownloadBlocked) and huggingface_hub
    is offline (it reads its cache, or raises). Other threads, meanwhile, download as before."""
    import torch.hub

    guard(torch.hub, "download_url_to_file", _refusing)
    hf_constants = _hf_constants()
    if hf_constants:
        guard(hf_constants, "is_offline_mode", _offline)
    with scope(_NO_DOWNLOADS, True):
        yield


def _hf_constants():
    try:
        from huggingface_hub import constants
    except ImportError:
        return None
    return constants
