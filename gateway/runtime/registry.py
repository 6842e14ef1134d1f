"""Finding plugins: the ``mqgw.plugins`` entry-point group, loaded lazily.

Why entry points: a third-party plugin is a separate distribution that declares
``[project.entry-points."mqgw.plugins"] name = "module:object"``; the gateway finds it
without any change to ``gateway/``. Nothing is imported until a config names the plugin,
so a broken plugin only breaks configs that use it. Tests build a
:class:`PluginRegistry` *value* with their own plugins instead of patching globals.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib.metadata import EntryPoint, entry_points

from gateway.plugin_api import Plugin
from gateway.runtime.errors import PluginLoadError

ENTRY_POINT_GROUP = "mqgw.plugins"

#: A plugin, or something that loads one on first use.
PluginSource = Plugin | Callable[[], Plugin] | EntryPoint


class PluginRegistry:
    """Plugins by name; each loaded on first :meth:`get` and checked against the
    :class:`~gateway.plugin_api.Plugin` protocol."""

    def __init__(self, sources: Mapping[str, PluginSource] | None = None) -> None:
        self._sources: dict[str, PluginSource] = dict(sources or {})
        self._loaded: dict[str, Plugin] = {}

    @classmethod
    def from_entry_points(
        cls, group: str = ENTRY_POINT_GROUP, *, extra: Mapping[str, PluginSource] | None = None
    ) -> PluginRegistry:
        """The installed plugins (plus ``extra``, which wins on a name clash)."""
        found: dict[str, PluginSource] = {ep.name: ep for ep in entry_points(group=group)}
        found.update(extra or {})
        return cls(found)

    def names(self) -> list[str]:
        return sorted(self._sources)

    def add(self, name: str, source: PluginSource) -> None:
        self._sources[name] = source
        self._loaded.pop(name, None)

    def get(self, name: str) -> Plugin:
        """The plugin called ``name``; PluginLoadError names the installed ones."""
        plugin = self._loaded.get(name)
        if plugin is not None:
            return plugin
        source = self._sources.get(name)
        if source is None:
            known = ", ".join(self.names()) or "none"
            raise PluginLoadError(
                name,
                f"no plugin called {name!r} is installed (installed: {known}); a plugin is "
                f"registered by an entry point in the {ENTRY_POINT_GROUP!r} group",
            )
        try:
            if isinstance(source, EntryPoint):
                loaded: object = source.load()
            elif isinstance(source, Plugin):
                loaded = source
            else:
                loaded = source()
        except Exception as exc:
            raise PluginLoadError(name, f"plugin {name!r} failed to load: {exc!r}") from exc
        if not isinstance(loaded, Plugin):
            raise PluginLoadError(
                name,
                f"plugin {name!r} loaded a {type(loaded).__name__}, which lacks the Plugin "
                "protocol (name, config_model, create)",
            )
        self._loaded[name] = loaded
        return loaded

    def __contains__(self, name: object) -> bool:
        return name in self._sources
