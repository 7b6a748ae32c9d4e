"""A name glob's literal prefix as index ranges (zoo.registry.where.first_ids): the ways of writing the prefix that
start some value are found by seeking a sorted column, and must be exactly those a scan of every value finds. The
rows a search with such a glob returns are checked against the whole search in tests/test_search.py."""

import bisect
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from zoo.registry.where import literal_prefix, spellings_present

ALPHABET = "aAbB/_%[\\.-0z"


def _present(values: list[str], prefix: str) -> list[str]:
    """By brute force: every value's first len(prefix) characters that equal the prefix, ASCII case folded."""
    heads = {v[: len(prefix)] for v in values if len(v) >= len(prefix) and v[: len(prefix)].lower() == prefix.lower()}
    return sorted(heads)


def _seeker(values: list[str]):
    ordered = sorted(values)

    def seek(at: str) -> str | None:
        i = bisect.bisect_left(ordered, at)
        return ordered[i] if i < len(ordered) else None

    return seek


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.text(ALPHABET, max_size=6), max_size=40),
    st.text(ALPHABET, min_size=1, max_size=3),
)
def test_the_spellings_found_by_seeking_are_those_present(values, prefix):
    found = spellings_present(prefix, _seeker(values))
    want = _present(values, prefix)
    assert found == want or (found is None and len(want) > 8)


def test_many_spellings_give_up_and_one_seek_per_spelling_suffices():
    rng = random.Random(0)
    prefix = "abcd"
    values = ["".join(rng.choice((c.lower(), c.upper())) for c in prefix) + str(i) for i in range(200)]
    assert spellings_present(prefix, _seeker(values)) is None  # 16 spellings present: past the bound
    seeks = []
    seek = _seeker(["hf/a", "timm/x", "timm/y", "torchvision/z"])
    assert spellings_present("timm/", lambda at: seeks.append(at) or seek(at)) == ["timm/"]
    assert len(seeks) <= 3


def test_literal_prefix():
    assert literal_prefix("timm/*") == "timm/"
    assert literal_prefix("timm/vit?x*") == "timm/vit"
    assert literal_prefix("*vit") == ""
    assert literal_prefix("50%off_[ab]") == "50%off_[ab]"  # LIKE's and other globs' special characters are literal
