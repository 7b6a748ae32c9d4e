"""Every exception zoo raises, each subclassing the matching built-in."""


class ZooError(Exception):
    """Base of every zoo error."""


class ModelNotFound(ZooError, KeyError):
    """No registered model has this name; the message lists the closest names."""

    def __init__(self, name: str, suggestions: list[str] = ()):
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


class SearchSyntaxError(ZooError, ValueError):
    """A search expression that does not parse; `column` is 1-based."""

    def __init__(self, message: str, expression: str = "", column: int = 0):
        self.expression = expression
        self.column = column
        where = ""
        if expression:
            where = f"\n  {expression}\n  {' ' * max(column - 1, 0)}^ (column {column})"
        super().__init__(f"{message}{where}")


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


class SchemaOutdated(ZooError, RuntimeError):
    """The registry database is at an older schema revision than this zoo."""


class DownloadBlocked(ZooError, ConnectionError):
    """Something tried to download during a meta build, which never downloads."""


class CheckpointError(ZooError, ValueError):
    """A checkpoint file that cannot be read safely (corrupt, lying header, code in a pickle)."""


class RegistryDrift(ZooError, RuntimeError):
    """The installed library builds a model differently from what the registry recorded."""


class RegistryNotFound(ZooError, FileNotFoundError):
    """No registry database at the configured path."""


class WeightsMismatch(ZooError, ValueError):
    """A checkpoint's keys or shapes do not fit the module; the message names them."""

    def __init__(self, missing=(), unexpected=(), misshaped=(), hint: str = ""):
        self.missing, self.unexpected, self.misshaped = list(missing), list(unexpected), list(misshaped)
        parts = []
        for label, keys in (("missing", self.missing), ("unexpected", self.unexpected)):
            if keys:
                parts.append(f"{len(keys)} {label}: {_first(keys)}")
        if self.misshaped:
            shown = ", ".join(f"{k} (file {list(f)}, model {list(m)})" for k, f, m in self.misshaped[:5])
            parts.append(f"{len(self.misshaped)} misshaped: {shown}{' ...' if len(self.misshaped) > 5 else ''}")
        super().__init__("weights do not fit the model: " + "; ".join(parts) + (f". {hint}" if hint else ""))


def _first(keys, n: int = 8) -> str:
    return ", ".join(keys[:n]) + (f" ... ({len(keys) - n} more)" if len(keys) > n else "")


class HubUnavailable(ZooError, ConnectionError):
    """A Hugging Face hub file is neither in the local cache nor downloadable (offline, not found, gated)."""
