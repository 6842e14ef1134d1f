"""Decoded commands and MQRFH2 folders shared between messages (docs/performance.md,
"Less work per message"): the engine reads a command's ``psc`` folder and its decoded
:class:`Command` from caches, so it must never edit them, and a cached command must be
the one a fresh decode gives."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.pubsub import inbound
from gateway.pubsub.commands import decode_psc_command
from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.errors import CommandError
from gateway.pubsub.store import MemoryStore
from gateway.wire import rfh2 as rfh2_module
from gateway.wire.constants import MsgType
from gateway.wire.folder import Element
from gateway.wire.reasons import Reason
from tests.support.pubsub_messages import CONTROL, DEFAULT, rfh2_message

REQ = MsgType.REQUEST


def _command_of(pairs: list[tuple[str, str]]) -> object:
    return inbound._psc_command(Element.from_pairs("psc", pairs))


def test_the_same_psc_pairs_give_one_cached_command_equal_to_a_fresh_decode() -> None:
    pairs = [("Command", "Publish"), ("Topic", "shared/a"), ("PubOpt", "RetainPub")]
    first = _command_of(pairs)
    assert _command_of(list(pairs)) is first
    assert first == decode_psc_command(pairs)
    other = _command_of([("Command", "Publish"), ("Topic", "shared/b")])
    assert other is not first and other == decode_psc_command(
        [("Command", "Publish"), ("Topic", "shared/b")]
    )


def test_a_refused_psc_is_refused_every_time_and_not_cached() -> None:
    pairs = [("Command", "Publish"), ("Topic", "x"), ("Bogus", "1")]
    for _ in range(2):
        with pytest.raises(CommandError) as caught:
            _command_of(pairs)
        assert caught.value.reason == Reason.RFH_PARM_ERROR
    assert tuple(pairs) not in inbound._PSC_COMMANDS


def test_the_command_cache_is_bounded() -> None:
    for n in range(inbound._PSC_COMMANDS_MAX + 40):
        _command_of([("Command", "Publish"), ("Topic", f"bound/{n}")])
    assert len(inbound._PSC_COMMANDS) <= inbound._PSC_COMMANDS_MAX
    assert (("Command", "Publish"), ("Topic", f"bound/{inbound._PSC_COMMANDS_MAX + 39}")) in (
        inbound._PSC_COMMANDS
    )


_OPTIONS = st.lists(
    st.sampled_from(
        [
            ("RegOpt", "PersAsPub"),
            ("RegOpt", "Local"),
            ("PubOpt", "RetainPub"),
            ("PubOpt", "OtherSubsOnly"),
            ("PubOpt", "NoSuchOption"),
            ("SeqNum", "7"),
            ("QName", "PUB.Q"),
        ]
    ),
    max_size=3,
)


@settings(max_examples=60, deadline=None)
@given(options=_OPTIONS, topic=st.sampled_from(["a/b", "a/+", "", "c"]))
def test_cached_commands_decide_as_fresh_ones(options: list[tuple[str, str]], topic: str) -> None:
    pairs = [("Command", "Publish"), ("Topic", topic), *options]
    try:
        fresh: object = decode_psc_command(pairs)
    except CommandError as exc:
        fresh = (exc.reason, exc.parm_id)
    for _ in range(2):
        try:
            cached: object = _command_of(pairs)
        except CommandError as exc:
            cached = (exc.reason, exc.parm_id)
        assert cached == fresh


def test_the_engine_edits_no_shared_folder_or_command() -> None:
    """Every kind of command, accepted and refused, handled twice from the same bytes:
    the cached folders and commands are as a fresh decode makes them afterwards."""
    engine = PubSubEngine("QM1", MemoryStore(), clock=lambda: 1_700_000_000.0)
    usr = Element.from_pairs("usr", {"Colour": "red"})
    md = {"reply_to_q": "REPLY.Q", "msg_type": REQ}
    messages = [
        rfh2_message(CONTROL, [("Command", "RegSub"), ("Topic", "s/#"), ("QName", "SUB.Q")], **md),
        rfh2_message(DEFAULT, [("Command", "Publish"), ("Topic", "s/1"), ("PubOpt", "RetainPub")],
                     b"data", folders=[usr], **md),
        rfh2_message(CONTROL, [("Command", "RegPub"), ("Topic", "s/1"), ("QName", "PUB.Q")], **md),
        rfh2_message(CONTROL, [("Command", "ReqUpdate"), ("Topic", "s/1"), ("QName", "SUB.Q")],
                     **md),
        rfh2_message(CONTROL, [("Command", "RegSub"), ("Topic", "s/#"), ("RegOpt", "Bogus")], **md),
        rfh2_message(CONTROL, [("Command", "DeletePub"), ("Topic", "s/1")], **md),
        rfh2_message(CONTROL, [("Command", "DeregSub"), ("Topic", "s/#"), ("QName", "SUB.Q")],
                     **md),
    ]
    outcomes = [engine.handle(message) for _ in range(2) for message in messages]
    assert any(o.reason == Reason.REG_OPTIONS_ERROR for o in outcomes)  # a refused one
    assert any(o.deliveries for o in outcomes)  # and an accepted publication
    assert rfh2_module._FOLDER_CACHE and inbound._PSC_COMMANDS
    for (data, ccsid, big_endian), folder in rfh2_module._FOLDER_CACHE.items():
        assert folder == rfh2_module._parse_name_value(data, ccsid, big_endian, 0, 0)
    for pairs, command in inbound._PSC_COMMANDS.items():
        assert command == decode_psc_command(pairs)
