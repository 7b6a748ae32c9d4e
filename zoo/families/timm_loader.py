"""timm's own arguments to load_pretrained for a model: recorded at index time, else caught once and remembered.

What timm.create_model(builder, pretrained=True, **kwargs) passes to load_pretrained (the pretrained
cfg, num_classes, in_chans, the model's checkpoint filter, strict) is fixed by the build. It is caught
from a build on meta in which load_pretrained only records its arguments (for that thread's build only:
zoo.scoped). The indexer records it in the row (`load_args`, with timm's version), so a pretrained load
of a registered model builds once; a build with other kwargs, or another timm, catches it again and
remembers it: in this process, and under $ZOO_CACHE for the next ones (keyed by timm's version).
A record names the filter by module and name (a partial of one: with its keywords); a closure cannot be
named and is caught again in each process. A record, the row's or the cache's, is data: it is replayed
only where it is what timm would pass (_replayed), never naming weights or code timm would not use.
"""

import contextvars
import copy
import functools
import hashlib
import importlib
import inspect
import json

from zoo.caching import register, trim
from zoo.errors import InvalidArgument
from zoo.scoped import guard, scope
from zoo.weights.cache_files import read_record, write_record

_caught: dict[str, dict] = {}  # record key -> the arguments
register("timm loader arguments", _caught, 4096)


def timm_load_arguments(builder: str, kwargs: dict, recorded: dict | None = None, model=None) -> dict:
    """A fresh copy of timm's arguments to load_pretrained for this build (no caller may change the
    remembered cfg). recorded: the row's load_args for exactly this builder and kwargs, replayed when the
    installed timm recorded them and they pass _replayed's checks; model: the meta module they are for."""
    import timm

    if isinstance(recorded, dict) and recorded.get("timm") == timm.__version__:
        replayed = _replayed(recorded, builder, kwargs, model)
        if replayed is not None:
            return replayed
    key = json.dumps([timm.__version__, builder, kwargs], sort_keys=True)
    if key not in _caught:
        trim(_caught, 4096)
        _caught[key] = _recalled(key, builder, kwargs, model) or _remember(key, _catch(builder, kwargs))
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
    caught.update(
        cfg=dict(pretrained_cfg or model.pretrained_cfg),
        num_classes=num_classes,
        in_chans=in_chans,
        filter_fn=filter_fn,
        strict=strict,
    )


def _catch(builder: str, kwargs: dict) -> dict:
    import timm
    from timm.models import _builder

    from zoo.meta import force_meta
    from zoo.offline import no_downloads

    guard(_builder, "load_pretrained", _recording)
    with scope(_RECORDING, {}) as caught, no_downloads(), force_meta():
        timm.create_model(builder, **{**kwargs, "pretrained": True})
    if not caught:
        raise InvalidArgument(
            f"timm {builder}: create_model(pretrained=True) loads no weights through "
            f"load_pretrained; zoo cannot load these weights in place"
        )
    return caught


_KIND = "timm-loader"  # records under $ZOO_CACHE, trusted only where the user alone can write (zoo.weights.cache_files)
_LIMIT = 1 << 20  # a cfg and a key: a few KiB


def _record(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest() + ".json"


def _as_record(caught: dict) -> dict | None:
    """The caught arguments as JSON data, the filter as "module:qualname" (a functools.partial of one with
    keyword arguments only, as timm's builders make them: those in "filter_kwargs"); None when the filter is
    no such function of timm's or a value is no JSON."""
    fn, keywords = caught["filter_fn"], {}
    if isinstance(fn, functools.partial) and not fn.args:
        keywords = dict(fn.keywords)
        fn = fn.func
    name = None if fn is None else f"{getattr(fn, '__module__', '')}:{getattr(fn, '__qualname__', '')}"
    if name is not None and _function(name) is not fn:
        return None
    record = {**caught, "filter_fn": name, "filter_kwargs": keywords}
    try:
        return json.loads(json.dumps(record))
    except (TypeError, ValueError):
        return None


def _replayed(record: dict, builder: str, kwargs: dict, model=None, own_cache: bool = False) -> dict | None:
    """The arguments from a record where they are what timm.create_model(builder, pretrained=True, **kwargs) passes
    for `model`, else None. A record (a registry row, a cache file) is data, so it is checked against all that is
    known without a build: the cfg is timm's own for the builder (so the weights are the ones timm names), the
    class count and channels are what timm derives, strict is timm's default, and the filter is a checkpoint
    filter of the model's own modules that takes the recorded keywords. Anything else is caught from a build.
    own_cache: zoo's own record under $ZOO_CACHE (trusted there as its hash checks are), whose strictness, which
    only a build can tell, is taken as recorded: models timm loads with strict=False build once per cache, not
    once per process."""
    from timm.models import get_pretrained_cfg

    try:
        own = json.loads(json.dumps(get_pretrained_cfg(builder).to_dict()))
    except (RuntimeError, AttributeError, TypeError, ValueError):  # a builder timm lacks, a cfg that is no JSON
        return None
    classes = own.get("num_classes")
    if model is not None:  # as timm's build_model_with_cfg derives the count it passes
        classes = 0 if kwargs.get("features_only") else getattr(model, "num_classes", kwargs.get("num_classes", 1000))
    strict = record.get("strict")
    if not (strict is True or (own_cache and strict is False)):
        return None
    in_chans = kwargs.get("in_chans", 3)
    if record.get("cfg") != own or (record.get("num_classes"), record.get("in_chans")) != (classes, in_chans):
        return None
    fn = _filter(record.get("filter_fn"), record.get("filter_kwargs") or {}, builder, model)
    if fn is False:
        return None
    cfg = {k: tuple(v) if isinstance(v, list) else v for k, v in own.items()}  # as timm has them
    return {"cfg": cfg, "num_classes": classes, "in_chans": in_chans, "filter_fn": fn, "strict": strict}


def _filter(name, keywords, builder: str, model):
    """The recorded filter: None for none, False where refused. It must be a function with "filter" in its name,
    of the module timm registers the model's entrypoint in or of a module defining one of the model's classes,
    and take the keywords after its (state_dict, model) parameters; so a record can name no other timm code."""
    from timm.models import model_entrypoint

    if name is None:
        return False if keywords else None
    if not isinstance(name, str) or not isinstance(keywords, dict):
        return False
    try:
        owners = {model_entrypoint(builder.split(".")[0]).__module__}
    except RuntimeError:  # timm has no such model
        return False
    owners |= {c.__module__ for c in type(model).__mro__} if model is not None else set()
    module, _, qualname = name.partition(":")
    fn = _function(name) if module in owners and "filter" in qualname.lower() else None
    if fn is None or not set(keywords) <= set(list(inspect.signature(fn).parameters)[2:]):
        return False
    return functools.partial(fn, **keywords) if keywords else fn


def _remember(key: str, caught: dict) -> dict:
    """Write the record (atomically) when it can be one; where the cache cannot be written, only this
    process remembers."""
    record = _as_record(caught)
    if record is None:
        return caught
    write_record(_KIND, _record(key), {"key": key, **record})
    return caught


def _recalled(key: str, builder: str, kwargs: dict, model=None) -> dict | None:
    """The remembered arguments, or None (no record, another key, an unreadable one, or one _replayed refuses)."""
    saved = read_record(_KIND, _record(key), _LIMIT)
    if not (isinstance(saved, dict) and saved.get("key") == key):
        return None
    return _replayed(saved, builder, kwargs, model, own_cache=True)


def _function(name: str):
    """A module-level function of timm's own modules by `module:qualname`, else None: a record never
    imports anything outside timm."""
    module, _, qualname = name.partition(":")
    if not module.startswith("timm.") or not qualname.isidentifier():
        return None
    fn = getattr(importlib.import_module(module), qualname, None)
    return fn if callable(fn) and getattr(fn, "__module__", None) == module else None
