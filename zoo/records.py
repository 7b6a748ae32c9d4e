"""Frozen records without dataclasses, for the modules every search imports (zoo.columns, zoo.query,
zoo.throughput.roofline): importing dataclasses imports inspect, and with it ast, dis and tokenize, about 7 ms of
a `zoo search` process whose own work takes a few (bench/search_process.py)."""


class Record:
    """What a frozen dataclass gives, for a class that names its fields in __slots__ and sets them in its __init__
    (through _init, in the same order): read-only after that, equal and hashed by its type and its fields' values,
    shown as Name(field=value, ...), copied with changes by replace(), pickled by its fields.

    Examples:
        >>> class Point(Record):
        ...     __slots__ = ("x", "y")
        ...
        ...     def __init__(self, x: int, y: int = 0):
        ...         self._init(x, y)
        >>> Point(1) == Point(1, 0), Point(1), Point(1).replace(y=2)
        (True, Point(x=1, y=0), Point(x=1, y=2))
    """

    __slots__: tuple[str, ...] = ()

    def _init(self, *values) -> None:
        for name, value in zip(self.__slots__, values, strict=True):
            object.__setattr__(self, name, value)

    def _values(self) -> tuple:
        return tuple(getattr(self, name) for name in self.__slots__)

    def replace(self, **changes):
        """A copy with `changes` (field=value) made, as dataclasses.replace gives.

        Args:
            **changes: new values of some fields.

        Returns:
            The new record (this one is left as it was).
        """
        return type(self)(**{**dict(zip(self.__slots__, self._values())), **changes})

    def __eq__(self, other):
        return self._values() == other._values() if other.__class__ is self.__class__ else NotImplemented

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in zip(self.__slots__, self._values()))
        return f"{type(self).__qualname__}({fields})"

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"cannot assign to field {name!r}: {type(self).__name__} is read-only")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}: {type(self).__name__} is read-only")

    def __reduce__(self):
        return type(self), self._values()
