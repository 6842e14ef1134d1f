"""Checks of a configuration beyond its schema: numbers that pass ``gt=0`` but break the
event loop (``.inf``, ``1e308``), routes to streams the broker does not service, and the
paths the gateway must create or read. ``mqgw run --check`` and the start both run them
(through :func:`gateway.runtime.config.load_config`), so a configuration that passes
``--check`` does not die with a traceback at start.

Why apart from ``config.py``: that module is the schema and the YAML loading; these are
rules across keys and against the machine, each returning every problem it finds.
The request/reply cross checks (routes naming plugin instances that exist, are enabled
and can exchange; queues that are not the broker's own) are here too.
"""

from __future__ import annotations

import math
import os
import tempfile
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from gateway.plugin_api import Exchanges, OwnsEveryTopic
from gateway.pubsub.streams import (
    ADMIN_STREAM,
    CONTROL_QUEUE,
    DEFAULT_STREAM,
    INTER_BROKER_QUEUE,
)
from gateway.runtime.backlog_format import BACKLOG_QUEUE_PREFIX
from gateway.runtime.errors import ConfigError, PluginLoadError

__all__ = [
    "MAX_INTEGER",
    "MAX_NUMBER",
    "check_migrated_streams",
    "check_numbers",
    "check_paths",
    "check_request_reply",
    "check_request_reply_queues",
    "check_requester_reply_topics",
    "check_streams",
]

#: Largest number a setting may hold: every float setting is a duration in seconds (or
#: a share), and a bigger one overflows the event loop's clock arithmetic at run time.
MAX_NUMBER = 1e7
#: Largest integer a setting may hold (milliseconds and byte counts stay far below).
MAX_INTEGER = 10**12


def _numbers(value: Any, key: str) -> list[tuple[str, float | int]]:
    """Every number in a validated model (or list/dict of them), with its key."""
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [(key, value)]
    if isinstance(value, BaseModel):
        out: list[tuple[str, float | int]] = []
        for name in type(value).model_fields:
            out += _numbers(getattr(value, name), f"{key}.{name}" if key else name)
        return out
    if isinstance(value, (list, tuple)):
        return [n for i, v in enumerate(value) for n in _numbers(v, f"{key}[{i}]")]
    if isinstance(value, dict):
        return [n for k, v in value.items() for n in _numbers(v, f"{key}.{k}")]
    return []


def check_numbers(model: BaseModel, prefix: str, source: str) -> list[ConfigError]:
    """``.inf``, ``.nan`` and absurdly large numbers (``1e308``) pass pydantic's ``gt=0``
    and crash the gateway later; refuse them naming the key."""
    problems: list[ConfigError] = []
    for key, n in _numbers(model, prefix):
        if isinstance(n, float) and not math.isfinite(n):
            problems.append(
                ConfigError(key, f"{n} is not a finite number", "write a number", source=source)
            )
        elif isinstance(n, float) and abs(n) > MAX_NUMBER:
            problems.append(
                ConfigError(
                    key, f"{n:g} is too large", f"use at most {MAX_NUMBER:g}", source=source
                )
            )
        elif isinstance(n, int) and abs(n) > MAX_INTEGER:
            problems.append(
                ConfigError(
                    key, f"{n:g} is too large", f"use at most {MAX_INTEGER:g}", source=source
                )
            )
    return problems


def _streams_named(value: Any, key: str) -> list[tuple[str, str]]:
    """(key, stream) of every stream a plugin section names: a ``stream`` field, or a
    topic in unified form (``$SYS/STREAM/<stream>/...``)."""
    if isinstance(value, BaseModel):
        out: list[tuple[str, str]] = []
        for name in type(value).model_fields:
            field = getattr(value, name)
            sub = f"{key}.{name}"
            if name == "stream" and isinstance(field, str):
                out.append((sub, field))
            else:
                out += _streams_named(field, sub)
        return out
    if isinstance(value, (list, tuple)):
        return [n for i, v in enumerate(value) for n in _streams_named(v, f"{key}[{i}]")]
    if isinstance(value, str) and value.startswith("$SYS/STREAM/"):
        return [(key, value[len("$SYS/STREAM/") :].split("/", 1)[0])]
    return []


def check_streams(
    serviced: set[str], sections: Iterable[tuple[str, BaseModel]], source: str
) -> list[ConfigError]:
    """A route to or from a stream the broker does not service would never carry
    anything (outbound) or fail at every put (inbound): refuse it naming the key.
    ``sections`` are (key prefix, validated plugin config)."""
    problems: list[ConfigError] = []
    for prefix, cfg in sections:
        for key, stream in _streams_named(cfg, prefix):
            if stream not in serviced:
                problems.append(
                    ConfigError(
                        key,
                        f"stream {stream!r} is not serviced by the broker",
                        f"add it to broker.streams or use one of {sorted(serviced)}",
                        source=source,
                    )
                )
    return problems


def check_migrated_streams(store: Path, serviced: set[str], source: str) -> list[ConfigError]:
    """After ``mqgw migrate`` the stream set is fixed (the seed's migration paragraph):
    refuse a serviced stream the migrated broker did not have, and, once the migration
    is complete, a migrated stream no longer serviced (``store``: the pub/sub store)."""
    from gateway.runtime.streams.migration import (
        migration_path,
        read_migration,
        stream_set_changes,
    )

    path = migration_path(store)
    try:
        record = read_migration(path)
    except ValueError as exc:
        return [ConfigError("broker.streams", str(exc), "repair or remove it", source=source)]
    if record is None:
        return []
    added, removed = stream_set_changes(record, serviced)
    origin = record.from_q_mgr or "the migrated stream set"
    fix = (
        "the stream set is fixed after a migration: start a new migration with "
        "`mqgw migrate --restart --from-broker QM` (or --from-streams S1,S2)"
    )
    problems = [
        ConfigError(
            "broker.streams",
            f"stream {s!r} was added after the migration from {origin}",
            fix,
            source=source,
        )
        for s in added
    ]
    problems += [
        ConfigError(
            "broker.streams",
            f"stream {s!r} of the migration from {origin} was removed",
            fix,
            source=source,
        )
        for s in removed
    ]
    return problems


def _creatable(path: Path) -> str:
    """Why the directory ``path`` cannot be created, or written when it exists ("" when
    it can). Asked of the file system, not of the mode bits: a directory under
    ``/proc``, on a read-only mount or marked immutable refuses root too. The probe is
    a temporary directory made and removed again in the nearest existing directory."""
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            return f"no existing parent of {path}"
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is a file, not a directory"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".mqgw-check-", dir=probe))
    except OSError as exc:
        return f"{probe} is not writable ({exc.strerror})"
    return ""


def _store_problems(key: str, store: Path, source: str) -> list[ConfigError]:
    """An SQLite file the gateway opens read-write: a file (or nothing yet) in a
    directory it can create and write (for the file and its journal)."""
    fix_dir = "choose a directory the gateway may create and write"
    if store.is_dir():
        return [ConfigError(key, f"{store} is a directory", "name a file", source=source)]
    why = _creatable(store.parent)
    if why:
        return [ConfigError(key, f"cannot be created: {why}", fix_dir, source=source)]
    if store.exists():
        try:
            with store.open("r+b"):
                pass
        except OSError as exc:
            return [ConfigError(key, f"{store} is not writable ({exc.strerror})", fix_dir,
                                source=source)]
    return []


def check_paths(
    *,
    data_dir: Path | None,
    mqsc_file: Path | None,
    store: Path,
    request_reply_store: Path | None = None,
    source: str = "",
) -> list[ConfigError]:
    """What the gateway must create or read at start, checked without leaving anything
    behind: the embedded ``data_dir``, the broker ``store`` and (with request/reply
    routes) ``request_reply_store`` creatable and writable, ``mqsc_file`` readable
    (paths already resolved against the config file)."""
    problems: list[ConfigError] = []
    fix_dir = "choose a directory the gateway may create and write"
    if data_dir is not None:
        why = _creatable(data_dir)
        if why:
            problems.append(
                ConfigError(
                    "queue_manager.data_dir", f"cannot be created: {why}", fix_dir, source=source
                )
            )
    if mqsc_file is not None:
        if not mqsc_file.is_file():
            problems.append(
                ConfigError(
                    "queue_manager.mqsc_file",
                    f"{mqsc_file} does not exist or is not a file",
                    "correct the path (relative to the config file) or remove the key",
                    source=source,
                )
            )
        elif not os.access(mqsc_file, os.R_OK):
            problems.append(
                ConfigError(
                    "queue_manager.mqsc_file",
                    f"{mqsc_file} is not readable",
                    "make it readable for the gateway's user",
                    source=source,
                )
            )
    problems += _store_problems("broker.store", store, source)
    if request_reply_store is not None:
        problems += _store_problems("request_reply.store", request_reply_store, source)
    return problems


def _broker_queue(name: str, local: bool, streams: set[str], dead_letter_queue: str) -> str:
    """What ``name`` is among the queues the broker and the queue manager keep for
    themselves ("" when none). ``local``: the name is on the gateway's queue manager
    (stream queues and the dead-letter queue are named per queue manager; ``SYSTEM.*``
    names are the queue manager's own everywhere)."""
    if local and name in streams:
        return ("a stream queue the broker services (broker.streams, a neighbour's streams "
                "or the default stream)")
    if name == ADMIN_STREAM:
        return "the broker's admin stream"
    if name == CONTROL_QUEUE:
        return "the broker's control queue"
    if name == INTER_BROKER_QUEUE:
        return "the inter-broker queue (neighbour brokers' answers)"
    if local and name == dead_letter_queue:
        return "the dead-letter queue (broker.dead_letter_queue)"
    if name.startswith(BACKLOG_QUEUE_PREFIX):
        return "a sink backlog queue (SYSTEM.MQGW.SINK.<instance>)"
    if name.startswith("SYSTEM."):
        return "a system queue (SYSTEM.*: the queue manager's and the broker's own)"
    return ""


def check_request_reply_queues(gateway: Any, source: str = "") -> list[ConfigError]:
    """Request/reply must not read or fill the broker's queues (issue 29): a
    ``reply_queue`` or service ``queue`` on a stream queue takes that stream's
    publications (they are dead-lettered as replies no request waits for); a request
    ``destination`` or ``reply_to_q`` there hands an outsider's payload to the broker or
    the queue manager as a command. Refused naming the key: stream queues, the admin
    stream, the control and inter-broker queues, the dead-letter queue, sink backlogs
    and every other ``SYSTEM.*`` queue; two request/reply readers on one queue; and a
    ``destination`` on a queue request/reply reads (``reply_queue``, a service
    ``queue``), which the runtime keeps for itself as it does the broker's."""
    rr = gateway.request_reply
    if not rr.requests and not rr.services:
        return []
    own = gateway.queue_manager.name
    # the serviced streams and the neighbours' (the broker services their queues too)
    streams = {DEFAULT_STREAM} | {s.name for s in gateway.broker.streams}
    streams |= {s for n in gateway.neighbours for s in (n.streams or ())}
    dlq = gateway.broker.dead_letter_queue
    fix_read = "give request/reply a queue of its own (reply_queue default: MQGW.REPLY)"
    fix_reply_to = "name reply_queue or a reply-to queue alias that resolves to it"
    fix_put = "name the service's own queue (or an alias of it), not one the broker keeps"
    # (key, queue name, on the gateway's queue manager, read by request/reply, as
    # written, fix)
    named: list[tuple[str, str, bool, bool, str, str]] = [
        ("request_reply.reply_queue", rr.reply_queue, True, True, rr.reply_queue, fix_read)
    ]
    if rr.reply_to_q:
        where = f"{rr.reply_to_q}@{rr.reply_to_q_mgr}" if rr.reply_to_q_mgr else rr.reply_to_q
        named.append(("request_reply.reply_to_q", rr.reply_to_q,
                      rr.reply_to_q_mgr in ("", own), False, where, fix_reply_to))
    named += [(f"request_reply.services[{i}].queue", r.queue, True, True, r.queue, fix_read)
              for i, r in enumerate(rr.services)]
    for i, r in enumerate(rr.requests):
        queue, _, q_mgr = r.destination.partition("@")
        named.append((f"request_reply.requests[{i}].destination", queue, q_mgr in ("", own),
                      False, r.destination, fix_put))
    problems: list[ConfigError] = []
    readers: dict[str, str] = {}
    for key, name, local, read, written, fix in named:
        why = _broker_queue(name, local, streams, dlq)
        if why:
            problems.append(ConfigError(key, f"{written} is {why}", fix, source=source))
            continue
        if read:
            if name in readers:
                problems.append(ConfigError(
                    key, f"{name} is also {readers[name]}: two request/reply readers would "
                    "take each other's messages", "give each its own queue", source=source))
            readers.setdefault(name, key)
    # A request put where request/reply reads would come back as a reply or a service
    # request: the runtime keeps those queues (authorisation.request_reply_queues) and
    # refuses every such put with 2035, so the route could never carry a request.
    for i, r in enumerate(rr.requests):
        queue, _, q_mgr = r.destination.partition("@")
        reader = readers.get(queue) if q_mgr in ("", own) else None
        if reader is not None:
            problems.append(ConfigError(
                f"request_reply.requests[{i}].destination",
                f"{r.destination} is {reader}, a queue request/reply reads: the gateway "
                "keeps it and refuses every request put there (MQRC 2035)",
                fix_put, source=source))
    return problems


def plugin_exchanges(plugin: object) -> bool | None:
    """Whether instances of ``plugin`` implement ``Exchanges`` (None: cannot tell), read
    from the return annotation of its ``create``, so nothing is instantiated."""
    create = getattr(plugin, "create", None)
    if create is None:
        return None
    try:
        cls = typing.get_type_hints(create).get("return")
    except Exception:  # an annotation that does not resolve: cannot tell
        return None
    if not isinstance(cls, type):
        return None
    return all(callable(getattr(cls, name, None)) for name in ("consume", "produce")) and (
        issubclass(cls, Exchanges)
    )


def check_request_reply(gateway: Any, registry: Any, source: str = "") -> list[ConfigError]:
    """Every request/reply route names an enabled plugin instance whose plugin
    implements ``Exchanges`` (``gateway`` is a validated GatewayConfig)."""
    problems: list[ConfigError] = []
    rr = gateway.request_reply
    instances = {p.name: p for p in gateway.plugins}
    routes = [("requests", i, r) for i, r in enumerate(rr.requests)]
    routes += [("services", i, r) for i, r in enumerate(rr.services)]
    for section, i, route in routes:
        key = f"request_reply.{section}[{i}].plugin"
        inst = instances.get(route.plugin)
        if inst is None:
            known = ", ".join(sorted(instances)) or "none"
            problems.append(
                ConfigError(
                    key,
                    f"route {route.name} names plugin instance {route.plugin!r}, which is not "
                    f"configured (instances: {known})",
                    "name one of plugins[].name",
                    source=source,
                )
            )
            continue
        if not inst.enabled:
            problems.append(
                ConfigError(
                    key,
                    f"route {route.name} names plugin instance {route.plugin!r}, which is "
                    "disabled",
                    "enable the instance or remove the route",
                    source=source,
                )
            )
            continue
        try:
            plugin = registry.get(inst.plugin)
        except PluginLoadError:
            continue  # reported with the plugin section
        if plugin_exchanges(plugin) is False:
            problems.append(
                ConfigError(
                    key,
                    f"route {route.name}: plugin {inst.plugin!r} (instance {route.plugin!r}) "
                    "does not implement request/reply (Exchanges)",
                    "use a plugin instance of kafka, mqtt or memory",
                    source=source,
                )
            )
    return problems


def check_requester_reply_topics(
    gateway: Any, registry: Any, plugin_configs: dict[str, BaseModel], source: str = ""
) -> list[ConfigError]:
    """A requester route whose reply could never be written: an instance of its plugin
    keeps every topic name for itself (``OwnsEveryTopic``; e.g. a Kafka template that
    is ``{topic}`` alone). The runtime asks every instance of the route's plugin
    (another instance may write the same cluster: ``app._own_topics``), so would refuse
    every request; refuse the route naming the key instead. ``plugin_configs``: the
    validated configs of the enabled instances."""
    problems: list[ConfigError] = []
    kinds = {p.name: p.plugin for p in gateway.plugins}
    for i, route in enumerate(gateway.request_reply.requests):
        kind = kinds.get(route.plugin)
        if kind is None or route.plugin not in plugin_configs:
            continue  # reported by check_request_reply
        try:
            plugin = registry.get(kind)
        except PluginLoadError:
            continue  # reported with the plugin section
        if not isinstance(plugin, OwnsEveryTopic):
            continue
        for name, cfg in plugin_configs.items():
            why = plugin.every_topic_own(name, cfg) if kinds.get(name) == kind else ""
            if why:
                problems.append(ConfigError(
                    f"request_reply.requests[{i}].plugin",
                    f"route {route.name}: no reply topic can ever be accepted: {why}, "
                    "and the gateway writes no reply into a topic its instances keep",
                    "give that template literal text of its own (e.g. 'mqgw.{topic}') "
                    "or use a plugin instance on another cluster",
                    source=source,
                ))
                break
    return problems
