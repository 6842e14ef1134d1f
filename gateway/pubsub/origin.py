"""The origin marker: which plugin instance a publication came in through.

The plugin host puts inbound publications on a stream queue as MQRFH2 Publish commands;
the broker service later gets them back from MQ like any other command. So the marker
has to travel inside the message, as the ``<mqgw>`` MQRFH2 folder. Writing it
(:func:`origin_folder`) and reading it back (:func:`split_origin`) live here, together, so
the two can never disagree. The engine strips the folder before fan-out: subscribers
never see it.
"""

from __future__ import annotations

from gateway.wire.errors import WireError
from gateway.wire.folder import Element, parse_folder

__all__ = ["ORIGIN_FOLDER", "origin_folder", "split_origin"]

#: MQRFH2 folder in which the gateway's plugin host marks where a publication came in
#: (``<mqgw><Origin>instance</Origin><Gateway>id</Gateway></mqgw>``).
ORIGIN_FOLDER = "mqgw"
_ORIGIN_PREFIX = "<" + ORIGIN_FOLDER


def origin_folder(origin: str, gateway_id: str = "") -> Element | None:
    """The marker folder for a publication from ``origin`` through ``gateway_id``, or
    None when there is nothing to mark."""
    if not origin and not gateway_id:
        return None
    marker = Element(ORIGIN_FOLDER)
    if origin:
        marker.add("Origin", origin)
    if gateway_id:
        marker.add("Gateway", gateway_id)
    return marker


def split_origin(folders: list[str]) -> tuple[str, list[str]]:
    """(origin instance, the other folders) of a command's extra MQRFH2 folders."""
    if not any(f.startswith(_ORIGIN_PREFIX) for f in folders):
        return "", folders
    origin = ""
    rest: list[str] = []
    for text in folders:
        if text.startswith(_ORIGIN_PREFIX):
            try:
                folder = parse_folder(text)
            except WireError:
                rest.append(text)
                continue
            if folder.name == ORIGIN_FOLDER:
                origin = folder.get("Origin") or ""
                continue
        rest.append(text)
    return origin, rest
