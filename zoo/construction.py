"""A build's outermost constructor call: a pretrained variant whose call equals its architecture's builds the same
module.

timm's builders turn a tag ("resnet50.a1_in1k") into constructor arguments (num_classes, in_chans, img_size, ...)
and then construct the model class with them, once. Two builds that reach that construction with equal class and
arguments construct equal modules, so a variant whose call equals its architecture's needs no build of its own:
`watch` notes the first nn.Module construction of a build (its class and arguments, described as zoo.structure
describes attributes) and can stop the build right there. What a family does to the module after constructing it
must not depend on the tag; families that guarantee this say so (CONSTRUCTION_DECIDES).
"""

import contextlib
import inspect
import sys

from torch import nn

from zoo.structure import stable_description


class _Stop(BaseException):
    """Unwinds a build from the construction `watch` stops at; `watch` itself catches it, so it never leaves this
    module. A BaseException, not an Exception: a model's own `except Exception` must not swallow it."""


_VARARGS, _VARKW = inspect.CO_VARARGS, inspect.CO_VARKEYWORDS


class Construction:
    """What `watch` saw: `call`, the description of the first construction (None where an argument has no stable
    description), `first`, the module that construction made (the one a builder returns, if it wraps nothing), and
    whether the build was `stopped` there."""

    def __init__(self):
        self.call: str | None = None
        self.first = None
        self.stopped = False


@contextlib.contextmanager
def watch(stop_at: str | None = None):
    """Note the first nn.Module construction in this thread while the block runs (the first ``__init__`` called on a
    module, read at its call, before its body has changed anything); when its description equals `stop_at`, stop
    the block there (it ends at once, `stopped` set, the module never built). A profile hook does the watching and
    removes itself at that call, so the construction itself runs at full speed; under another profiler (cProfile)
    nothing is watched."""
    seen = Construction()
    if sys.getprofile() is not None:
        yield seen
        return

    def profile(frame, event, arg):
        if event != "call" or frame.f_code.co_name != "__init__":
            return
        code = frame.f_code
        instance = frame.f_locals.get(code.co_varnames[0]) if code.co_argcount else None
        if not isinstance(instance, nn.Module):
            return
        sys.setprofile(None)
        count = (
            code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & _VARARGS) + bool(code.co_flags & _VARKW)
        )
        arguments = {name: frame.f_locals[name] for name in code.co_varnames[1:count]}
        try:
            seen.call = stable_description((type(instance), arguments))
        except ValueError:  # an argument with no stable description: this construction matches nothing
            return
        seen.first = instance
        if seen.call == stop_at:
            raise _Stop

    sys.setprofile(profile)
    try:
        yield seen
    except _Stop:
        seen.stopped = True
    finally:
        sys.setprofile(None)
