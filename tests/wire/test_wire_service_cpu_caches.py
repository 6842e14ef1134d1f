"""The per-message caches of the service CPU pass (issue 16) give exactly what the
uncached code gave: PutDate/PutTime formatted once per second, PutDate/PutTime read
back once per second, and ``usr`` properties remembered from the folder just parsed."""

from __future__ import annotations

import random
import string
from datetime import UTC, datetime, timedelta, timezone

from gateway.wire import folder as folder_module
from gateway.wire.folder import (
    Element,
    parse_folder,
    remember_usr_properties,
    usr_properties,
    usr_properties_of,
)
from gateway.wire.put_time import put_date_time, put_time_ms


def _stamp_reference(now: float | datetime) -> tuple[str, str]:
    moment = now.astimezone(UTC) if isinstance(now, datetime) else datetime.fromtimestamp(now, UTC)
    hundredths = moment.microsecond // 10000
    return moment.strftime("%Y%m%d"), moment.strftime("%H%M%S") + f"{hundredths:02d}"


def _ms_reference(put_date: str, put_time: str) -> int | None:
    d, t = put_date.strip(), put_time.strip()
    if len(d) != 8 or len(t) not in (6, 8) or not (d + t).isascii() or not (d + t).isdigit():
        return None
    try:
        moment = datetime(
            int(d[:4]), int(d[4:6]), int(d[6:8]), int(t[:2]), int(t[2:4]), int(t[4:6]), tzinfo=UTC
        )
    except ValueError:
        return None
    return int(moment.timestamp()) * 1000 + (int(t[6:8]) if len(t) == 8 else 0) * 10


def test_put_date_time_equals_formatting_every_time() -> None:
    rng = random.Random(11)
    for _ in range(30_000):
        second = rng.randint(0, 4_000_000_000)
        now = rng.choice(
            (
                rng.uniform(0, 4e9),
                second + rng.random(),  # several in one second, in any order
                second - 1e-7,  # rounding across a second's edge
                second + 0.9999996,
                float(second),
            )
        )
        assert put_date_time(now) == _stamp_reference(now), now
    for _ in range(2_000):
        zone = timezone(timedelta(minutes=rng.randint(-720, 720)))
        moment = datetime(2001, 1, 1, tzinfo=zone) + timedelta(seconds=rng.uniform(0, 1e9))
        assert put_date_time(moment) == _stamp_reference(moment)
    date, time = put_date_time()  # now
    assert len(date) == 8 and len(time) == 8


def test_put_time_ms_equals_parsing_every_time() -> None:
    rng = random.Random(12)
    for _ in range(30_000):
        put_date, put_time = put_date_time(rng.uniform(0, 4e9))
        case = rng.random()
        if case < 0.1:
            put_time = put_time[:6]
        elif case < 0.2:
            put_date = put_date[:4] + "13" + put_date[6:]
        elif case < 0.25:
            put_time = " " + put_time
        elif case < 0.3:
            put_time = put_time[:6] + "9x"
        elif case < 0.35:
            put_date = "20240230"
        for hh in (put_time, put_time[:6] + f"{rng.randint(0, 99):02d}"):
            assert put_time_ms(put_date, hh) == _ms_reference(put_date, hh), (put_date, hh)


def test_remembered_usr_properties_are_what_parsing_gives() -> None:
    rng = random.Random(13)
    alphabet = string.ascii_letters + string.digits + " <>&'\"\t\n.-_é"
    remembered = 0
    for _ in range(20_000):
        children = []
        for _ in range(rng.randint(0, 4)):
            child = Element(
                rng.choice(("Seq", "a", "b.c", "X1", "usr")),
                {"dt": "i4"} if rng.random() < 0.1 else {},
                "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8))),
            )
            if rng.random() < 0.05:
                child.text = ""
                child.children.append(Element("n", {}, "v"))
            children.append(child)
        root = Element("usr", {}, "", children)
        text = root.to_xml()
        folder_module._USR_CACHE.clear()
        remember_usr_properties(text, root)
        if text not in folder_module._USR_CACHE:
            continue
        remembered += 1
        props, types = usr_properties_of(parse_folder(text))
        assert usr_properties([text]) == (props, types)
    assert remembered > 5_000  # the common flat case is remembered
    folder_module._USR_CACHE.clear()
    # never for another folder, nor past the size bound
    mcd = parse_folder("<mcd><Msd>jms_text</Msd></mcd>")
    remember_usr_properties(mcd.to_xml(), mcd)
    big = Element.from_pairs("usr", {f"p{i}": "v" * 20 for i in range(60)})
    remember_usr_properties(big.to_xml(), big)
    assert not folder_module._USR_CACHE
