"""timm's own arguments to load_pretrained for a model, caught once and remembered.

What timm.create_model(builder, pretrained=True, **kwargs) passes to load_pretrained (the pretrained
cfg, num_classes, in_chans, the model's checkpoint filter, strict) is fixed by the build. It is caught
from a build on meta in which load_pretrained only records its arguments (for that thread's build only:
zoo.scoped), then remembered: in this process, and under $ZOO_CACHE for the next ones (keyed by timm's
version, so an upgrade catches again), so a first pretrained load in a process builds the model once.
A record names the filter by module and name, and is replayed only for a function of timm's own
modules; a filter that is no such function (a partial, a closure) is caught again in each process.
"""

import contextvars
import copy
import hashlib
import importlib
import json
import os

from zoo.caching import register, trim
from zoo.constants import cache_dir
from zoo.errors import InvalidArgument
from zoo.scoped import guard, scope

_caught: dict[str, dict] = {}  # record key -> the arguments
register("timm loader arguments", _caught, 4096)


def timm_load_arguments(builder: str, kwargs: dict) -> dict:
    """A fresh copy of timm's arguments to load_pretrained for this build (no caller may change the
    remembered cfg)."""
    import timm

    key = json.dumps([timm.__version__, builder, kwargs], sort_keys=True)
    if key not in _caught:
        trim(_caught, 4096)
        _caught[key] = _recalled(key) or _remember(key, _catch(builder, kwargs))
    caught = _caught[key]
    return {**caught, "cfg": copy.deepcopy(caught["cfg"])}


_RECORDING = contextvars.ContextVar("zoo_timm_load_pretrained", default=None)  # a dict while catching


def _recording(load_pretrained):
    def guarded(*args, **kwargs):
        caught = _RECORDING.get()
        if caught is None:
            return load_pretrained(*args, **kwargs)
        _note(caught, *args, **kwargs)
    return guarded


def _note(caught, model, pretrained_cfg=None, num_classes=1000, in_chans=3, filter_fn=None, strict=True, **_):
    caught.update(cfg=dict(pretrained_cfg or model.pretrained_cfg), num_classes=num_classes,
                  in_chans=in_chans, filter_fn=filter_fn, strict=strict)


def _catch(builder: str, kwargs: dict) -> dict:
    import timm
    from timm.models import _builder

    from zoo.build import no_downloads
    from zoo.meta import force_meta

    guard(_builder, "load_pretrained", _recording)
    with scope(_RECORDING, {}) as caught, no_downloads(), force_meta():
        timm.create_model(builder, **{**kwargs, "pretrained": True})
    if not caught:
        raise InvalidArgument(f"timm {builder}: create_model(pretrained=True) loads no weights through "
                              f"load_pretrained; zoo cannot load these weights in place")
    return caught


def _record(key: str):
    return cache_dir() / "timm-loader" / (hashlib.sha256(key.encode()).hexdigest() + ".json")


def _remember(key: str, caught: dict) -> dict:
    """Write the record (atomically) when the filter can be named; where the cache cannot be written,
    or a value is no JSON, only this process remembers."""
    fn = caught["filter_fn"]
    name = None if fn is None else f"{getattr(fn, '__module__', '')}:{getattr(fn, '__qualname__', '')}"
    if name is not None and _function(name) is not fn:
        return caught
    record = _record(key)
    try:
        text = json.dumps({"key": key, **caught, "filter_fn": name})
        record.parent.mkdir(parents=True, exist_ok=True)
        tmp = record.with_name(f"{record.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, record)
    except (OSError, TypeError, ValueError):
        pass
    return caught


def _recalled(key: str) -> dict | None:
    """The remembered arguments, or None (no record, another key, an unreadable one, or a filter that
    is no longer a function of timm's modules)."""
    try:
        saved = json.loads(_record(key).read_text())
        if saved.pop("key") != key:
            return None
        name = saved["filter_fn"]
        saved["filter_fn"] = None if name is None else _function(name)
        if name is not None and saved["filter_fn"] is None:
            return None
        saved["cfg"] = {k: tuple(v) if isinstance(v, list) else v for k, v in saved["cfg"].items()}  # as timm has them
        return saved
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _function(name: str):
    """A module-level function of timm's own modules by `module:qualname`, else None: a record never
    imports anything outside timm."""
    module, _, qualname = name.partition(":")
    if not module.startswith("timm.") or not qualname.isidentifier():
        return None
    fn = getattr(importlib.import_module(module), qualname, None)
    return fn if callable(fn) and getattr(fn, "__module__", None) == module else None
