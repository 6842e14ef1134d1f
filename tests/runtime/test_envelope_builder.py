"""The envelope builder of the delivery hot path (``gateway.runtime.envelopes``) makes
exactly the object :class:`Envelope`'s own constructor makes."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.plugin_api import Envelope
from gateway.runtime.envelopes import _new_envelope, _slot_builder

_VALUES: dict[type, st.SearchStrategy[Any]] = {
    str: st.text(max_size=8),
    bytes: st.binary(max_size=8),
    int: st.integers(-5, 5),
    bool: st.booleans(),
}


def _strategy(f: dataclasses.Field[Any]) -> st.SearchStrategy[Any]:
    if f.name in ("properties", "property_types"):
        return st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2)
    if f.name in ("property_list", "name_value_pairs"):
        return st.lists(st.tuples(st.text(max_size=3), st.text(max_size=3)), max_size=2).map(
            tuple
        )
    if f.name in ("put_time_ms", "text_codec"):
        inner = st.integers(0, 10**12) if f.name == "put_time_ms" else st.sampled_from(["utf-8"])
        return st.none() | inner
    default = f.default
    if default is dataclasses.MISSING:
        default = "" if f.name in ("stream", "topic") else b""
    return _VALUES[type(default)]


_FIELDS = dataclasses.fields(Envelope)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), given_fields=st.sets(st.sampled_from([f.name for f in _FIELDS[3:]])))
def test_the_builder_makes_what_the_constructor_makes(
    data: st.DataObject, given_fields: set[str]
) -> None:
    kwargs = {f.name: data.draw(_strategy(f), label=f.name) for f in _FIELDS[:3]}
    for f in _FIELDS[3:]:
        if f.name in given_fields:
            kwargs[f.name] = data.draw(_strategy(f), label=f.name)
    built, made = _new_envelope(**kwargs), Envelope(**kwargs)
    assert type(built) is Envelope
    assert built == made
    for f in _FIELDS:
        assert getattr(built, f.name) == getattr(made, f.name), f.name


def test_a_built_envelope_is_frozen_and_its_default_mappings_are_its_own() -> None:
    first = _new_envelope(stream="S", topic="t", payload=b"x")
    second = _new_envelope(stream="S", topic="t", payload=b"x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.topic = "u"  # type: ignore[misc]
    assert first.properties == {} and first.properties is not second.properties
    assert first.property_types is not second.property_types
    with pytest.raises(TypeError):
        _new_envelope(stream="S", topic="t")  # a field without a default is required
    with pytest.raises(TypeError):
        _new_envelope(stream="S", topic="t", payload=b"", colour="red")  # no such field


def test_the_builder_refuses_classes_it_cannot_build_faithfully() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        value: int

        def __post_init__(self) -> None:  # pragma: no cover - never called
            raise AssertionError

    @dataclasses.dataclass(frozen=True, slots=True)
    class Derived:
        value: int
        twice: int = dataclasses.field(init=False, default=0)

    for cls in (Checked, Derived):
        with pytest.raises(TypeError):
            _slot_builder(cls)
