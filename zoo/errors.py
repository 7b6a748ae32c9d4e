"""Every exception zoo raises, each subclassing the matching built-in, and how a cause is told in one line."""

from collections.abc import Iterable


class ZooError(Exception):
    """Base of every zoo error."""


class ModelNotFound(ZooError, KeyError):
    """No registered model has this name; the message lists the closest names."""

    def __init__(self, name: str, suggestions: Iterable[str] = ()):
        self.name = name
        self.suggestions = list(suggestions)
        hint = f"; did you mean {', '.join(self.suggestions)}?" if self.suggestions else ""
        super().__init__(f"no model named {name!r} in the registry{hint}")

    def __str__(self) -> str:  # KeyError would quote the whole message
        return self.args[0]


class AmbiguousName(ZooError, KeyError):
    """A bare name matches models of several families; the message lists them."""

    def __init__(self, name: str, candidates: list[str]):
        self.name = name
        self.candidates = list(candidates)
        super().__init__(f"{name!r} is ambiguous: use one of {', '.join(self.candidates)}")

    def __str__(self) -> str:
        return self.args[0]


class HardwareNotFound(ZooError, KeyError):
    """A plan's hardware is neither a device of catalog/hardware.csv (by name or short name) nor an amount of
    memory ("24GiB"); the message lists the close names."""

    def __init__(self, name: str, suggestions: Iterable[str] = ()):
        self.name = name
        self.suggestions = list(suggestions)
        super().__init__(
            f"no hardware named {name!r}: use one of {', '.join(self.suggestions)}, 'cpu' (this machine's RAM), "
            "or an amount of memory such as '24GiB'"
        )

    def __str__(self) -> str:
        return self.args[0]


class SearchSyntaxError(ZooError, ValueError):
    """A search expression that does not parse; `column` is 1-based."""

    def __init__(self, message: str, expression: str = "", column: int = 0):
        self.expression = expression
        self.column = column
        where = ""
        if expression:
            where = f"\n  {expression}\n  {' ' * max(column - 1, 0)}^ (column {column})"
        super().__init__(f"{message}{where}")


class InvalidComparison(SearchSyntaxError):
    """One comparison that is well formed but wrong (a word for a number field, a glob on a number);
    `at_op`: the operator, not the value, is at fault. The parser adds the column."""

    def __init__(self, message: str, at_op: bool = False):
        super().__init__(message)
        self.message, self.at_op = message, at_op


class UnknownFamily(ZooError, KeyError):
    """A family name that zoo has no plug-in for."""

    def __str__(self) -> str:
        return self.args[0]


class UntrustedBuilder(ZooError, PermissionError):
    """A recipe names a builder outside the known families; it is not imported."""


class InvalidRecipe(ZooError, ValueError):
    """A recipe or override that zoo refuses (not JSON, or would download weights)."""


class BuildFailed(ZooError, RuntimeError):
    """The model's own constructor raised while building on meta."""


class NotBuildable(ZooError, TypeError):
    """The registry row describes tensors only (an indexed checkpoint): there is no module to build."""


class RegistryError(ZooError, RuntimeError):
    """The registry cannot be opened or written (not a database, unreachable, read-only, locked, an unknown
    kind of URL); the message names it, password masked, and says what to do."""


class RegistryLocked(RegistryError):
    """Another writer holds the registry's lock for longer than ZOO_LOCK_TIMEOUT: trying again later can succeed."""


class SchemaOutdated(RegistryError):
    """The registry database is at another schema revision than this zoo (older: upgrade it; newer: upgrade zoo)."""


class DownloadBlocked(ZooError, ConnectionError):
    """Something tried to download during a meta build, which never downloads."""


class CheckpointError(ZooError, ValueError):
    """A checkpoint file that cannot be read safely (corrupt, lying header, code in a pickle)."""


class RegistryDrift(ZooError, RuntimeError):
    """The installed library builds a model differently from what the registry recorded."""


class RegistryNotFound(RegistryError, FileNotFoundError):
    """No registry database at the configured path (only `zoo index` and `zoo db upgrade` create one)."""


class ModelExists(ZooError, FileExistsError):
    """Indexing would replace a model of another family or builder under the same name (force=True replaces it)."""


class WeightsMismatch(ZooError, ValueError):
    """A checkpoint's keys or shapes do not fit the module; the message names them. `tied`: pairs of keys that
    name one tensor of the module (a tie) and hold different values in the checkpoint."""

    def __init__(self, missing=(), unexpected=(), misshaped=(), hint: str = "", tied=()):
        self.missing, self.unexpected, self.misshaped = list(missing), list(unexpected), list(misshaped)
        self.tied = list(tied)
        parts = []
        for label, keys in (("missing", self.missing), ("unexpected", self.unexpected)):
            if keys:
                parts.append(f"{len(keys)} {label}: {_first(keys)}")
        if self.misshaped:
            shown = ", ".join(f"{k} (file {list(f)}, model {list(m)})" for k, f, m in self.misshaped[:5])
            parts.append(f"{len(self.misshaped)} misshaped: {shown}{' ...' if len(self.misshaped) > 5 else ''}")
        if self.tied:
            pairs = ", ".join(f"{a} and {b}" for a, b in self.tied[:5])
            parts.append(f"{len(self.tied)} tied pair(s) with different values: {pairs}")
        super().__init__("weights do not fit the model: " + "; ".join(parts) + (f". {hint}" if hint else ""))


def _first(keys, n: int = 8) -> str:
    return ", ".join(keys[:n]) + (f" ... ({len(keys) - n} more)" if len(keys) > n else "")


class HubUnavailable(ZooError, ConnectionError):
    """A Hugging Face hub file is neither in the local cache nor downloadable (offline, not found, gated).
    `kind`, where known, says why, so a bulk index knows whether to retry: "gated", "no-config" (the repo has
    none), "transient". A bulk index records a config that fails otherwise as "config" (a config.json that is
    unreadable, too large or not an object: an InvalidRecipe) or "remote-code"."""

    def __init__(self, message: str = "", kind: str | None = None):
        super().__init__(message)
        self.kind = kind


class MaterializeError(ZooError, RuntimeError):
    """The module cannot be materialized as asked (no recipe to initialize from, a value nobody knows)."""


class AnalysisError(ZooError, ValueError):
    """scan / estimate cannot run: no input spec, a module not on meta, a bad dtype or optimizer."""


class TokenizerNotCached(AnalysisError, LookupError):
    """Text was given to scan, and the model's tokenizer is not in the local Hugging Face cache."""


class AnalysisTimeout(ZooError, TimeoutError):
    """A meta forward ran past its time budget (index-time analysis records it as an error)."""


class BenchFailed(ZooError, RuntimeError):
    """`zoo bench` could not measure a model: its forward or training step raised, or it ran out of memory."""


class CatalogError(ZooError, OSError):
    """`zoo catalog` could not write its export (the folder, the file system); the previous export is kept."""


class InvalidArgument(ZooError, ValueError):
    """An argument zoo refuses before doing anything (a value out of range, options that contradict). The message
    names the Python argument; `argument` holds its name, which the CLI turns into its flag (batch -> --batch)."""

    def __init__(self, message: str, argument: str | None = None):
        super().__init__(message)
        self.argument = argument


class WorkerFailed(ZooError, RuntimeError):
    """The process that runs `zoo serve`'s scans and estimates ended during a request (killed, out of memory)."""


def reason(e: BaseException) -> str:
    """One line for a recorded failure: the exception, its message's first sentence, and the model
    code it came from (the innermost frame in site-packages outside torch and zoo)."""
    import traceback  # here: every search imports zoo.errors, and traceback brings linecache and tokenize

    message = " ".join(str(e).split())
    first = message.find(". ")  # the first sentence says what failed; the rest is advice on torch settings
    if first >= 40:
        message = message[: first + 1]
    if len(message) > 300:
        message = message[:300] + "..."
    frames = traceback.extract_tb(e.__traceback__) if e.__traceback__ else []
    model = [
        f
        for f in frames
        if "/torch/" not in f.filename and "/zoo/" not in f.filename and "/site-packages/" in f.filename
    ]
    at = f" (at {model[-1].filename.rsplit('/site-packages/', 1)[-1]}:{model[-1].lineno})" if model else ""
    return f"{type(e).__name__}: {message}{at}"
