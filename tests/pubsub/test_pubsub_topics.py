"""Topic matching for both wildcard schemes (reference §5.9) and the combined index."""

from __future__ import annotations

import random

import pytest

from gateway.pubsub.errors import CommandError
from gateway.pubsub.topics import (
    Scheme,
    TopicIndex,
    compile_char_pattern,
    decode_char_publication_topic,
    match_pattern,
    match_topic_pattern,
    uses_topic_wildcards,
)
from gateway.wire.reasons import Reason


@pytest.mark.parametrize(
    ("pattern", "topic", "expected"),
    [
        ("Sport/*", "Sport/Soccer/Results", True),  # * spans '/'
        ("Sport/*", "Sport/", True),  # zero characters
        ("Sport/*", "Sports", False),
        ("*", "anything/at/all", True),
        ("ABC?D", "ABC*D", True),
        ("ABC?D", "ABCD", False),
        ("ABC%*D", "ABC*D", True),
        ("ABC%*D", "ABCxD", False),
        ("100%%", "100%", True),
        ("a?c", "a/c", True),  # '/' is an ordinary character
        ("x/*/y", "x/1/2/y", True),
        ("Price/Fruit/Apples", "Price/Fruit/Apples", True),
        ("Price/Fruit/Apples", "Price/Fruit/apples", False),  # case-sensitive
        ("Team1 Team2", "Team1 Team2", True),  # blanks are ordinary
    ],
)
def test_character_scheme(pattern: str, topic: str, expected: bool) -> None:
    assert compile_char_pattern(pattern).matches(topic) is expected


@pytest.mark.parametrize(
    ("pattern", "topic", "expected"),
    [
        ("USA/#", "USA", True),  # '#' matches zero levels
        ("USA/#", "USA/Texas/Dallas", True),
        ("USA/+", "USA/Texas", True),
        ("USA/+", "USA/Texas/Dallas", False),
        ("USA/+", "USA", False),
        ("#", "a/b/c", True),
        ("+/+", "a/b", True),
        ("x/#/y", "x/y", True),
        ("x/#/y", "x/1/2/y", True),
        ("x/#/y", "x/1/2/z", False),
        ("Sport/Soc*", "Sport/Soccer", False),  # '*' is literal in the topic scheme
        ("Sport/Soc*", "Sport/Soc*", True),
        ("a+/b", "ab/b", False),  # '+' only as a whole level
    ],
)
def test_topic_scheme(pattern: str, topic: str, expected: bool) -> None:
    assert match_topic_pattern(pattern, topic) is expected


def test_bad_char_escapes_are_topic_errors() -> None:
    for bad in ("abc%", "a%b"):
        with pytest.raises(CommandError) as exc:
            compile_char_pattern(bad)
        assert exc.value.reason == Reason.TOPIC_ERROR


def test_publication_topic_unescapes_and_refuses_wildcards() -> None:
    assert decode_char_publication_topic("ABC%*D") == "ABC*D"
    assert decode_char_publication_topic("50%%/x%?") == "50%/x?"
    for bad in ("a/*", "a?", "", "x%y"):
        with pytest.raises(CommandError) as exc:
            decode_char_publication_topic(bad)
        assert exc.value.reason == Reason.TOPIC_ERROR


def test_whole_level_hash_and_plus_detection() -> None:
    assert uses_topic_wildcards("Sport/#")
    assert uses_topic_wildcards("+/x")
    assert not uses_topic_wildcards("C++/news")
    assert not uses_topic_wildcards("#tag/x")


def test_index_matches_both_schemes_at_once_and_removes() -> None:
    index: TopicIndex[str] = TopicIndex()
    index.add("c1", Scheme.CHAR, "Sport/*")
    index.add("c2", Scheme.CHAR, "Sport/Soccer")
    index.add("c3", Scheme.CHAR, "*cer")
    index.add("t1", Scheme.TOPIC, "Sport/+")
    index.add("t2", Scheme.TOPIC, "Sport/#")
    index.add("t3", Scheme.TOPIC, "Sport/Tennis")
    assert index.match("Sport/Soccer") == {"c1", "c2", "c3", "t1", "t2"}
    index.remove("c1")
    index.remove("t2")
    assert index.match("Sport/Soccer") == {"c2", "c3", "t1"}
    index.add("c2", Scheme.TOPIC, "Sport/Tennis")  # re-adding a key replaces its pattern
    assert index.match("Sport/Soccer") == {"c3", "t1"}
    assert index.match("Sport/Tennis") == {"c2", "t1", "t3"}
    assert len(index) == 4


def test_index_agrees_with_one_by_one_matching() -> None:
    """Random patterns of both schemes: the index returns exactly what brute force does."""
    rng = random.Random(5)
    levels = ["a", "b", "c", "ab", "*", "+", "#", "?"]
    index: TopicIndex[int] = TopicIndex()
    patterns: dict[int, tuple[Scheme, str]] = {}
    for i in range(400):
        scheme = rng.choice([Scheme.CHAR, Scheme.TOPIC])
        parts = [rng.choice(levels) for _ in range(rng.randint(1, 4))]
        if scheme is Scheme.CHAR:
            parts = [p for p in parts if p not in ("+", "#")] or ["a"]
        pattern = "/".join(parts)
        patterns[i] = (scheme, pattern)
        index.add(i, scheme, pattern)
    for _ in range(300):
        topic = "/".join(rng.choice(["a", "b", "c", "ab", ""]) for _ in range(rng.randint(1, 5)))
        expected = {k for k, (s, p) in patterns.items() if match_pattern(s, p, topic)}
        assert index.match(topic) == expected, topic
