"""The page, style sheet and script of the dashboard, read once from the package data
(``static/``). Only the names listed here are served: a request path never reaches
the file system, and an unlisted name is never remembered (no cache keyed by what a
client sends)."""

from __future__ import annotations

from importlib import resources

__all__ = ["ASSETS", "PAGE", "asset"]

#: The page (``GET /dashboard`` and every client-side route under it).
PAGE = "index.html"
#: Served names under ``/dashboard/static/`` and their content types.
ASSETS: dict[str, str] = {
    PAGE: "text/html; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
}

#: (content type, bytes) of each listed name, filled on first use; it never holds more
#: entries than ``ASSETS``.
_LOADED: dict[str, tuple[str, bytes]] = {}


def asset(name: str) -> tuple[str, bytes] | None:
    """(content type, bytes) of a listed asset, None for any other name."""
    ctype = ASSETS.get(name)
    if ctype is None:
        return None
    found = _LOADED.get(name)
    if found is None:
        found = _LOADED[name] = (
            ctype, resources.files(__package__).joinpath("static", name).read_bytes()
        )
    return found
