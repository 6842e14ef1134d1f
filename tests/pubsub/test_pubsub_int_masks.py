"""The int-mask option checks and the topic-match memory of the service CPU pass
(issue 16) decide exactly as before: command validation against the enum-flag rules it
replaced, TopicIndex matches against an index that never remembers."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from gateway.pubsub import commands
from gateway.pubsub.commands import Command, CommandName, HeaderKind, _validate
from gateway.pubsub.errors import CommandError
from gateway.pubsub.options import PERSISTENCE_CHOICES, PUBLISH_PUB_ALLOWED, PubOpt, RegOpt
from gateway.pubsub.topics import Scheme, TopicIndex
from gateway.wire.reasons import Reason


def _validate_reference(cmd: Command) -> None:
    """The enum-flag rules as written before the pass (reference §5.4/§5.5)."""
    bad_reg = cmd.reg_opts & ~commands._REG_ALLOWED[cmd.name]
    if bad_reg:
        raise CommandError(
            Reason.REG_OPTIONS_ERROR,
            f"option(s) {bad_reg!r} not valid for {cmd.name}",
            parm_id="RegOpt",
        )
    if cmd.pub_opts & ~PUBLISH_PUB_ALLOWED:
        raise CommandError(Reason.PUB_OPTIONS_ERROR, "unknown publication option", parm_id="PubOpt")
    if bin(int(cmd.reg_opts & PERSISTENCE_CHOICES)).count("1") > 1:
        raise CommandError(
            Reason.REG_OPTIONS_ERROR, "more than one persistence option", parm_id="RegOpt"
        )
    if cmd.reg_opts & RegOpt.DIRECT_REQUESTS and cmd.reg_opts & RegOpt.ANONYMOUS:
        raise CommandError(
            Reason.REG_OPTIONS_ERROR, "DirectReq cannot be combined with Anon", parm_id="RegOpt"
        )
    if cmd.reg_opts & RegOpt.JOIN_SHARED and cmd.reg_opts & RegOpt.JOIN_EXCLUSIVE:
        raise CommandError(
            Reason.REG_OPTIONS_ERROR, "JoinShared and JoinExcl exclude each other",
            parm_id="RegOpt",
        )
    dereg_all = bool(cmd.reg_opts & RegOpt.DEREGISTER_ALL)
    if not cmd.topics and not dereg_all:
        raise CommandError(Reason.RFH_PARM_MISSING, f"{cmd.name} needs a topic", parm_id="Topic")
    if cmd.name is CommandName.REQ_UPDATE and len(cmd.topics) > 1:
        raise CommandError(
            Reason.RFH_DUPLICATE_PARM, "ReqUpdate takes exactly one topic", parm_id="Topic"
        )


def _outcome(check: Callable[[Command], None], cmd: Command) -> tuple[int, str, str] | None:
    try:
        check(cmd)
    except CommandError as exc:
        return exc.reason, exc.message, exc.parm_id
    return None


def test_validation_decides_as_the_enum_rules_did() -> None:
    rng = random.Random(21)
    names = list(CommandName)
    failures = 0
    for _ in range(20_000):
        reg = 0
        for _ in range(rng.randint(0, 3)):
            reg |= 1 << rng.randint(0, 23)  # bit 22/23: not an MQREGO_* option
        pub = 0
        for _ in range(rng.randint(0, 2)):
            pub |= 1 << rng.randint(0, 5)
        cmd = Command(
            rng.choice(names),
            rng.choice(list(HeaderKind)),
            topics=["a/b"] * rng.randint(0, 2),
            reg_opts=RegOpt(reg),
            pub_opts=PubOpt(pub),
        )
        want = _outcome(_validate_reference, cmd)
        got = _outcome(lambda c: _validate(c, "Topic", "RegOpt", "PubOpt"), cmd)
        assert got == want, (cmd.name, hex(reg), hex(pub))
        failures += want is not None
    assert 2_000 < failures < 19_000  # both outcomes well exercised


def _patterns(rng: random.Random) -> str:
    levels = ["a", "b", "c", "+", "#", ""]
    return "/".join(rng.choice(levels) for _ in range(rng.randint(1, 4)))


def _reference_matches(index: TopicIndex[int], topic: str) -> set[int]:
    out: set[int] = set()
    index._trie.match(topic, out)
    index._chars.match(topic, out)
    return out


def test_remembered_matches_follow_every_change() -> None:
    rng = random.Random(22)
    index: TopicIndex[int] = TopicIndex()
    topics = ["a", "a/b", "a/b/c", "b/c", "c", "a//b", "", "b/a/c/a"]
    for step in range(4_000):
        action = rng.random()
        key = rng.randint(0, 40)
        if action < 0.25:
            index.add(key, Scheme.TOPIC, _patterns(rng))
        elif action < 0.3:
            index.add(key, Scheme.CHAR, rng.choice(["a*", "a/b", "*", "b%%", "a/?"]))
        elif action < 0.4:
            index.remove(key)
        topic = rng.choice(topics)
        got = index.match(topic)
        assert got == _reference_matches(index, topic), step
        got.add(-1)  # a caller's set is its own
        assert -1 not in index.match(topic)
        many = rng.sample(topics, 3)
        want: set[int] = set()
        for t in many:
            want |= _reference_matches(index, t)
        assert index.match_many(many) == want


@pytest.mark.parametrize("n", [300])
def test_the_match_memory_is_bounded(n: int) -> None:
    index: TopicIndex[int] = TopicIndex()
    index.add(1, Scheme.TOPIC, "#")
    for i in range(n):
        assert index.match(f"t/{i}") == {1}
    assert len(index._matched) <= 256
