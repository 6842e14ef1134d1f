"""The dashboard in a real browser (issue 17 item 2): Debian's headless Chromium, driven
by Selenium through Debian's chromium-driver, loads the dashboard of a running gateway
whose MQTT plugin is connected to the real Mosquitto fixture and whose embedded queue
manager is linked by channels to a second gateway (its neighbour). The test waits for
live data and checks what is drawn: the neighbour, active; the stream with the MQTT
topics it feeds and is fed by; its inbound rate moving after MQTT traffic; a DLQ count
after a poison message; the per-stream details view. Screenshots go to
``test-artifacts/dashboard/`` (docs/dashboard.md uses one).

Fails, never skips, when chromium, chromium-driver or selenium is missing: tools/setup.sh
installs them.
"""

from __future__ import annotations

import asyncio
import base64
import shutil
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, TypeVar

import aiomqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from gateway.devstack.mosquitto import MosquittoBroker
from gateway.devstack.ports import free_port
from gateway.runtime import metrics
from gateway.runtime.app import GatewayApp
from gateway.runtime.config import parse_config
from gateway.runtime.registry import PluginRegistry
from tests.support.names import unique
from tests.support.pubsub_messages import CONTROL, rfh_message
from tests.support.service_client import put

pytestmark = [pytest.mark.browser, pytest.mark.mqtt, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "dashboard"
BULLETIN = "BULLETIN.STREAM"
GW, NB = "GWDASH", "NBDASH"
USER, PASSWORD = "viewer", "browser-test-password"
AUTHORIZATION = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
T = TypeVar("T")


def _channels(me: str, other: str) -> str:
    """``me``'s half of a channel pair with ``other`` (CONNAME by name: the address book)."""
    return (
        f"DEFINE QLOCAL({other}) USAGE(XMITQ) REPLACE\n"
        f"DEFINE CHANNEL({me}.TO.{other}) CHLTYPE(SDR) CONNAME('{other}') XMITQ({other}) "
        "REPLACE\n"
        f"DEFINE CHANNEL({other}.TO.{me}) CHLTYPE(RCVR) REPLACE\n"
    )


def _config(tmp_path: Path, me: str, other: str, ports: dict[str, int],
            extra: dict[str, Any]) -> dict[str, Any]:
    (tmp_path / f"{me}.mqsc").write_text(_channels(me, other) + "DEFINE QLOCAL(APP.SERVICE)\n")
    return {
        "id": me.lower(),
        "queue_manager": {
            "name": me, "data_dir": f"{me}/qm", "mqsc_file": f"{me}.mqsc",
            "listener_port": ports[me],
            "address_book": {other: f"127.0.0.1:{ports[other]}"},
        },
        "broker": {"store": f"{me}/pubsub.db", "streams": [{"name": BULLETIN}], "wait_ms": 50},
        "neighbours": [{"q_mgr": other, "kind": "gateway", "streams": [BULLETIN],
                        "probe_timeout": 1.5}],
        **extra,
    }


@pytest.fixture
def driver() -> Iterator[Any]:
    """Headless Chromium at 1280x800 through chromium-driver (the system's, never one
    Selenium would download)."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is not installed: run make setup (the dev extra)", pytrace=False)
    chromium = shutil.which("chromium")
    chromedriver = shutil.which("chromedriver")
    if chromium is None or chromedriver is None:
        pytest.fail("chromium and chromium-driver are not installed: run make setup "
                    "(tools/setup.sh installs Debian's chromium and chromium-driver)",
                    pytrace=False)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,800", "--force-device-scale-factor=1"):
        options.add_argument(arg)
    browser = webdriver.Chrome(options=options, service=Service(executable_path=chromedriver))
    try:
        browser.set_page_load_timeout(20)
        yield browser
    finally:
        browser.quit()


@pytest.fixture
async def network(tmp_path: Path, mqtt_broker: MosquittoBroker) -> AsyncIterator[GatewayApp]:
    """GW (dashboard, MQTT plugin on Mosquitto) and its neighbour NB, linked by channels."""
    ports = {GW: free_port(), NB: free_port()}
    registry = PluginRegistry.from_entry_points()
    mqtt = {
        "name": "mqtt", "plugin": "mqtt",
        "config": {
            "host": mqtt_broker.host, "port": mqtt_broker.port,
            "client_id": unique("dash-gw-"),
            "outbound": {"topics": [f"$SYS/STREAM/{BULLETIN}/#"], "prefix": "mq"},
            "inbound": {"filters": [{"filter": "sensors/#", "stream": BULLETIN}]},
        },
    }
    gw_extra = {
        "metrics": {"port": 0, "auth": {"username": USER, "password": PASSWORD}},
        "plugins": [mqtt],
        "request_reply": {"requests": [{"name": "ask-mq", "plugin": "mqtt",
                                        "source": "requests/#",
                                        "destination": f"APP.SERVICE@{GW}"}]},
    }
    nb_extra = {"metrics": {"enabled": False}}
    async with AsyncExitStack() as stack:
        apps = []
        for me, other, extra in ((NB, GW, nb_extra), (GW, NB, gw_extra)):
            app = GatewayApp(
                parse_config(_config(tmp_path, me, other, ports, extra), registry,
                             base_dir=tmp_path),
                registry,
            )
            await app.start()
            stack.push_async_callback(app.shutdown)
            apps.append(app)
        yield apps[1]


async def _until(check: Callable[[], T | None], what: str, timeout: float = 20.0) -> T:
    """Run a blocking browser check in a thread (the gateways keep running on this loop)
    until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = await asyncio.to_thread(check)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"the dashboard never showed {what}")
        await asyncio.sleep(0.25)


async def _new_snapshots(browser: Any, count: int) -> None:
    """Until the page has drawn ``count`` more snapshots (each sets the body's
    ``data-generated-at``): the redraws themselves, not the seconds they usually take."""
    def newer_than(last: str) -> Callable[[], str | None]:
        def check() -> str | None:
            value = _attr(browser, "body", "data-generated-at")
            return value if value != last else None
        return check

    seen = await _until(lambda: _attr(browser, "body", "data-generated-at"), "a snapshot")
    for n in range(count):
        seen = await _until(newer_than(seen), f"snapshot {n + 1} of {count} more")


def _text(browser: Any, css: str) -> str | None:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        return str(browser.find_element(By.CSS_SELECTOR, css).text)
    except (NoSuchElementException, StaleElementReferenceException):
        return None


def _attr(browser: Any, css: str, name: str) -> str | None:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        value = browser.find_element(By.CSS_SELECTOR, css).get_attribute(name)
    except (NoSuchElementException, StaleElementReferenceException):
        return None
    return None if value is None else str(value)


def _visible(browser: Any, css: str) -> bool:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        return bool(browser.find_element(By.CSS_SELECTOR, css).is_displayed())
    except (NoSuchElementException, StaleElementReferenceException):
        return False


async def test_dashboard_in_headless_chromium(network: GatewayApp, driver: Any,
                                              mqtt_broker: MosquittoBroker,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    app = network
    assert app.http is not None
    url = f"http://127.0.0.1:{app.http.port}/dashboard"

    # Without credentials the page is refused, as /metrics is.
    await asyncio.to_thread(driver.get, url)
    assert await asyncio.to_thread(_text, driver, "#conn") is None
    assert "Neighbours" not in await asyncio.to_thread(lambda: driver.page_source)
    # With them (sent on every request, the event stream too) it loads.
    await asyncio.to_thread(driver.execute_cdp_cmd, "Network.enable", {})
    await asyncio.to_thread(driver.execute_cdp_cmd, "Network.setExtraHTTPHeaders",
                            {"headers": {"Authorization": AUTHORIZATION}})
    await asyncio.to_thread(driver.get, url)

    # live data over server-sent events
    await _until(lambda: _text(driver, "#conn") == "live", "the live connection")
    assert await _until(lambda: _text(driver, "#gw-title"), "the title") == "gwdash on GWDASH"
    # the neighbour, active (the status is a word, not only a colour)
    nb_row = f'#neighbours tr[data-neighbour="{NB}"]'
    await _until(lambda: _text(driver, nb_row + " td[data-status]") == "active",
                 "the neighbour active", timeout=30)
    assert BULLETIN in await _until(lambda: _text(driver, nb_row), "the neighbour's row")
    # the network picture names the neighbour and the MQTT topics
    picture = await _until(lambda: _text(driver, "#network svg"), "the network picture")
    assert NB in picture and GW in picture and "active" in picture
    assert "mqtt mq/BULLETIN.STREAM/#" in picture and "mqtt sensors/#" in picture
    # the stream, with what it feeds and is fed by
    row = f'#streams tr[data-stream="{BULLETIN}"]'
    stream_text = await _until(lambda: _text(driver, row), "the stream")
    assert "→ mqtt mq/BULLETIN.STREAM/# (mqtt)" in stream_text
    assert "← mqtt sensors/# (mqtt)" in stream_text
    assert await _until(lambda: _attr(driver, row + " td[data-rate-in]", "data-rate-in"),
                        "the stream's rate in") == "0"

    # MQTT traffic into the stream: the rate moves; an MQTT 5 request nobody answers
    # yet is in flight on its route
    async with aiomqtt.Client(mqtt_broker.host, mqtt_broker.port, identifier=unique("dash-pub-"),
                              protocol=aiomqtt.ProtocolVersion.V5) as client:
        for i in range(40):
            await client.publish(f"sensors/room{i % 4}", f"{i}".encode(), qos=1)
        request = Properties(PacketTypes.PUBLISH)
        request.ResponseTopic = "replies/dash"
        request.CorrelationData = b"c-1"
        await client.publish("requests/price", b"how much?", qos=1, properties=request)
    route = '#routes tr[data-route="ask-mq"]'
    route_text = await _until(lambda: (t := _text(driver, route)) and t.endswith(" 1") and t,
                              "one request in flight")
    assert "requester (mqtt) requests/# → APP.SERVICE@GWDASH" in route_text
    rate = await _until(
        lambda: float(_attr(driver, row + " td[data-rate-in]", "data-rate-in") or 0) or None,
        "a moving inbound rate",
    )
    assert rate > 0
    # publications from MQ to the stream go out to MQTT: the outbound rate moves too
    assert app.node is not None
    for i in range(20):
        await put(app.node.qm, rfh_message(
            BULLETIN,
            [("MQPSCommand", "Publish"), ("MQPSStreamName", BULLETIN), ("MQPSTopic", "news")],
            f"news {i}".encode(),
        ))
    await _until(
        lambda: float(_attr(driver, row + " td[data-rate-out]", "data-rate-out") or 0) or None,
        "a moving outbound rate",
    )
    # readable at 1280x800: nothing scrolls sideways
    assert await asyncio.to_thread(
        driver.execute_script,
        "return document.documentElement.scrollWidth <= document.documentElement.clientWidth",
    )
    await asyncio.to_thread(driver.save_screenshot, str(ARTIFACTS / "overview-traffic.png"))

    # a poison message: the broker dead-letters it and the count shows by reason
    assert app.node is not None
    await put(app.node.qm, rfh_message(CONTROL, [("MQPSCommand", "Bogus")]))
    dead = '#dead-letters tr[data-dead-letter="broker|undeliverable"] td[data-count]'
    await _until(lambda: _text(driver, dead) == "1", "the dead-letter count")
    assert (await _until(lambda: _text(driver, "#dlq-summary"), "the dead-letter summary")
            == "SYSTEM.DEAD.LETTER.QUEUE holds 1 message(s).")
    assert (await _until(lambda: _text(driver, '#plugins tr[data-plugin="mqtt"]'),
                         "the plugin's row") == "mqtt mqtt healthy")
    await asyncio.to_thread(driver.save_screenshot, str(ARTIFACTS / "overview.png"))
    # the whole page in one picture (docs/dashboard.md), then back to 1280x800
    await asyncio.to_thread(driver.set_window_size, 1280, 1000)
    await _new_snapshots(driver, 1)  # the next snapshot redraws at the new size
    await asyncio.to_thread(driver.save_screenshot, str(ARTIFACTS / "overview-full.png"))
    await asyncio.to_thread(driver.set_window_size, 1280, 800)

    # the details view, reached with the keyboard: the focused link keeps the focus
    # across the redraws of the live updates
    await asyncio.to_thread(
        driver.execute_script,
        f"document.querySelector('a[data-stream-link=\"{BULLETIN}\"]').focus();")
    await _new_snapshots(driver, 2)  # two snapshots redraw the table
    assert await asyncio.to_thread(
        driver.execute_script,
        "return document.activeElement.getAttribute('data-stream-link')") == BULLETIN
    # ENTER goes to whatever has the focus when it is pressed (no element reference to
    # go stale across a redraw)
    await asyncio.to_thread(ActionChains(driver).send_keys(Keys.ENTER).perform)
    await _until(lambda: _text(driver, "#h-stream") == f"Stream {BULLETIN}", "the stream view")
    assert (await asyncio.to_thread(lambda: driver.current_url)).endswith(f"#/stream/{BULLETIN}")
    flows = await _until(lambda: _text(driver, "#stream-flows"), "the stream's flows")
    assert "feeds (out) mqtt mqtt mq/BULLETIN.STREAM/#" in flows
    assert "fed by (in) mqtt mqtt sensors/#" in flows
    assert NB in await _until(lambda: _text(driver, "#stream-facts"), "the stream's facts")
    await asyncio.to_thread(driver.save_screenshot, str(ARTIFACTS / "stream.png"))
    # every link and the skip link are reachable by keyboard and show a visible focus
    outline = await asyncio.to_thread(
        driver.execute_script,
        "const a = document.getElementById('back'); a.focus();"
        "return getComputedStyle(a).outlineStyle;",
    )
    assert outline == "solid"

    # the details route by path: its links lead back to the overview
    await asyncio.to_thread(driver.get, f"{url}/stream/{BULLETIN}")
    await _until(lambda: _visible(driver, "#stream-view") and
                 _text(driver, "#h-stream") == f"Stream {BULLETIN}", "the stream view by path")
    await asyncio.to_thread(lambda: driver.find_element("id", "back").click())
    await _until(lambda: _visible(driver, "#overview") and not _visible(driver, "#stream-view"),
                 "the overview after ← All streams")
    # a malformed hash names no known stream and the page keeps updating
    await asyncio.to_thread(driver.get, url + "#/stream/%E0")
    first = await _until(lambda: _attr(driver, "body", "data-generated-at"), "a first snapshot")
    await _until(lambda: (_attr(driver, "body", "data-generated-at") or first) != first,
                 "a second snapshot after a malformed hash")
    assert await _until(lambda: _text(driver, "#h-stream"), "the heading") == "Stream %E0"

    # the event stream refused (here: no stream allowed; in use, the 17th viewer's 503):
    # the page falls back to polling the snapshot
    monkeypatch.setattr(metrics, "MAX_EVENT_STREAMS", 0)
    await asyncio.to_thread(driver.get, url)
    await _until(lambda: _text(driver, "#conn") == "live (polling)", "the polling fallback")
    assert BULLETIN in (await _until(lambda: _text(driver, row), "the stream, polled"))
