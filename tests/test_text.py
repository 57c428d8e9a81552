"""Quoting what users wrote: no value shows longer than QUOTE_LIMIT, escapes included."""

from __future__ import annotations

import orjson
import pytest

from gpu_placement.base.text import QUOTE_LIMIT, quoted
from webhook.review import ReviewError, parse_review


@pytest.mark.parametrize("value", ["x" * 5000, "\u202e" * 3000, "a\u200fb" * 2000, '"\\' * 500])
def test_a_long_value_shows_at_most_the_limit_escapes_included(value: str) -> None:
    shown = quoted(value)
    assert shown.endswith('..."') and len(shown) <= QUOTE_LIMIT + len('"..."'), (len(shown), shown[:80])


def test_a_short_value_is_shown_whole() -> None:
    assert quoted("nvidia.com/gpu") == '"nvidia.com/gpu"'
    assert quoted("4\u200f") == '"4\\u200f"'


def test_a_review_of_the_wrong_version_is_refused_with_a_bounded_sentence() -> None:
    """Found by benchmarks/fuzz_rss.py: apiVersion and kind of 3,000 U+202E each were quoted 120
    characters each before escaping, 720 shown each: a 1,600-character refusal."""
    body = orjson.dumps({"apiVersion": "\u202e" * 3000, "kind": "\u202e" * 3000})
    with pytest.raises(ReviewError) as caught:
        parse_review(body)
    assert len(str(caught.value)) <= 1024, len(str(caught.value))
