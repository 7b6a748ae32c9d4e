"""timm's own arguments to load_pretrained for a model: recorded at index time, else caught once and remembered.

What timm.create_model(builder, pretrained=True, **kwargs) passes to load_pretrained (the pretrained
cfg, num_classes, in_chans, the model's checkpoint filter, strict) is fixed by the build. It is caught
from a build on meta in which load_pretrained only records its arguments (for that thread's build only:
zoo.scoped). The indexer records it in the row (`load_args`, with timm's version), so a pretrained load
of a registered model builds once; a build with other kwargs, or another timm, catches it again and
remembers it: in this process, and under $ZOO_CACHE for the next ones (keyed by timm's version).
A record names the filter by module and name, and is replayed only for a function of timm's own
modules (or a partial of one with keyword arguments); any other filter (a closure) is caught again in
each process.
"""

import contextvars
import copy
import functools
import hashlib
import importlib
import inspect
import json
import os

from zoo.caching import register, trim
from zoo.constants import cache_dir
from zoo.errors import InvalidArgument
from zoo.scoped import guard, scope

_caught: dict[str, dict] = {}  # record key -> the arguments
register("timm loader arguments", _caught, 4096)


def timm_load_arguments(builder: str, kwargs: dict, recorded: dict | None = None) -> dict:
    """A fresh copy of timm's arguments to load_pretrained for this build (no caller may change the
    remembered cfg). recorded: the row's load_args for exactly this builder and kwargs, replayed when the
    installed timm is the one that recorded it."""
    import timm

    replayed = _replayed(recorded) if recorded and recorded.get("timm") == timm.__version__ else None
    if replayed is not None:
        return replayed
    key = json.dumps([timm.__version__, builder, kwargs], sort_keys=True)
    if key not in _caught:
        trim(_caught, 4096)
        _caught[key] = _recalled(key) or _remember(key, _catch(builder, kwargs))
    caught = _caught[key]
    return {**caught, "cfg": copy.deepcopy(caught["cfg"])}


def record_for_index(builder: str, kwargs: dict) -> dict | None:
    """The arguments as the row's load_args (JSON, with timm's version); None where the build loads no
    weights through load_pretrained, fails, or passes a filter that cannot be named."""
    import timm

    try:
        record = _as_record(_catch(builder, kwargs))
    except Exception:  # the row's build is what the index reports on; this only saves a later build
        return None
    return None if record is None else {"timm": timm.__version__, **record}


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

    from zoo.meta import force_meta
    from zoo.offline import no_downloads

    guard(_builder, "load_pretrained", _recording)
    with scope(_RECORDING, {}) as caught, no_downloads(), force_meta():
        timm.create_model(builder, **{**kwargs, "pretrained": True})
    if not caught:
        raise InvalidArgument(f"timm {builder}: create_model(pretrained=True) loads no weights through "
                              f"load_pretrained; zoo cannot load these weights in place")
    return caught


def _record(key: str):
    return cache_dir() / "timm-loader" / (hashlib.sha256(key.encode()).hexdigest() + ".json")


def _as_record(caught: dict) -> dict | None:
    """The caught arguments as JSON data, the filter as "module:qualname" (a functools.partial of one with
    keyword arguments only, as timm's builders make them: those in "filter_kwargs"); None when the filter is
    no such function of timm's or a value is no JSON."""
    fn, keywords = caught["filter_fn"], {}
    if isinstance(fn, functools.partial) and not fn.args:
        fn, keywords = fn.func, dict(fn.keywords)
    name = None if fn is None else f"{getattr(fn, '__module__', '')}:{getattr(fn, '__qualname__', '')}"
    if name is not None and _function(name) is not fn:
        return None
    record = {**caught, "filter_fn": name, "filter_kwargs": keywords}
    try:
        return json.loads(json.dumps(record))
    except (TypeError, ValueError):
        return None


def _replayed(record: dict) -> dict | None:
    """The arguments from a record, or None: a field missing or of another type, a filter that is no longer a
    function of timm's modules or does not take the recorded keywords, or weights other than those timm
    registers for the cfg's tag (a registry row is data: it must not send a pretrained load anywhere else)."""
    try:
        name, keywords = record["filter_fn"], record.get("filter_kwargs") or {}
        fn = None if name is None else _function(name)
        if name is not None and fn is None:
            return None
        if fn is not None and keywords:
            inspect.signature(fn).bind_partial(**keywords)  # TypeError: a keyword it does not take
            fn = functools.partial(fn, **keywords)
        cfg = {k: tuple(v) if isinstance(v, list) else v for k, v in record["cfg"].items()}  # as timm has them
        args = {"cfg": cfg, "num_classes": record["num_classes"], "in_chans": record["in_chans"], "filter_fn": fn,
                "strict": record["strict"]}
    except (KeyError, TypeError, AttributeError, ValueError, ImportError):
        return None
    typed = (isinstance(args["num_classes"], int) and isinstance(args["in_chans"], int)
             and isinstance(args["strict"], bool))
    return args if typed and _registered_source(cfg) else None


# The cfg keys that decide which weights timm loads (timm.models._builder._resolve_pretrained_source)
_SOURCE_KEYS = ("source", "url", "file", "state_dict", "hf_hub_id", "hf_hub_filename", "custom_load")


def _registered_source(cfg: dict) -> bool:
    """Whether the cfg names the weights that timm's own registry names for its architecture and tag."""
    from timm.models import get_pretrained_cfg

    if not (isinstance(cfg.get("architecture"), str) and isinstance(cfg.get("tag"), str)):
        return False
    try:
        own = get_pretrained_cfg(f"{cfg['architecture']}.{cfg['tag']}")
    except RuntimeError:  # timm's answer for a tag it does not have
        return False
    return own is not None and all(cfg.get(k) == own.to_dict().get(k) for k in _SOURCE_KEYS)


def _remember(key: str, caught: dict) -> dict:
    """Write the record (atomically) when it can be one; where the cache cannot be written, only this
    process remembers."""
    record = _as_record(caught)
    if record is None:
        return caught
    path = _record(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": key, **record}))
        os.replace(tmp, path)
    except OSError:
        pass
    return caught


def _recalled(key: str) -> dict | None:
    """The remembered arguments, or None (no record, another key, an unreadable one, or a filter that
    is no longer a function of timm's modules)."""
    try:
        saved = json.loads(_record(key).read_text())
    except (OSError, ValueError):
        return None
    return _replayed(saved) if isinstance(saved, dict) and saved.get("key") == key else None


def _function(name: str):
    """A module-level function of timm's own modules by `module:qualname`, else None: a record never
    imports anything outside timm."""
    module, _, qualname = name.partition(":")
    if not module.startswith("timm.") or not qualname.isidentifier():
        return None
    fn = getattr(importlib.import_module(module), qualname, None)
    return fn if callable(fn) and getattr(fn, "__module__", None) == module else None
