"""The ``gateway.yaml`` file: pydantic models and loading with errors that name the key
and the fix (docs/config-reference.md describes every key).

Why all problems at once: an operator fixing a sidecar's config should not need one
restart per typo, so :func:`load_config` collects every error (the gateway's own and
each plugin instance's ``config:`` section, validated by the plugin's model) before
raising :class:`~gateway.runtime.errors.ConfigErrors`.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from gateway.mq.conname import parse_conname_list
from gateway.mq.ibmmq.config import check_conname, check_tls_keys
from gateway.pubsub.streams import DEFAULT_STREAM
from gateway.routing.routes import RequestReplyConfig
from gateway.runtime.authorisation_config import AuthorisationConfig
from gateway.runtime.config_checks import (
    check_migrated_streams,
    check_numbers,
    check_paths,
    check_request_reply,
    check_request_reply_queues,
    check_requester_reply_topics,
    check_streams,
)
from gateway.runtime.errors import ConfigError, ConfigErrors, PluginLoadError
from gateway.runtime.gc_policy import GcConfig
from gateway.runtime.neighbours.config import NeighbourConfig, unique_neighbours
from gateway.runtime.pubsub_service import BrokerConfig
from gateway.runtime.registry import PluginRegistry
from gateway.secrets import Secret

log = logging.getLogger(__name__)

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_INSTANCE_NAME = r"^[A-Za-z][A-Za-z0-9_.-]{0,47}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class EmbeddedQueueManagerConfig(_Strict):
    """The gateway's own embedded queue manager (the default)."""

    type: Literal["embedded"] = "embedded"
    """``embedded``: the gateway's own queue manager."""
    name: str = Field(default="QM1", min_length=1, max_length=48)
    """Queue manager name; must match what ``data_dir`` holds."""
    data_dir: Path = Path("data/qm")
    """Where its queues and messages are stored (relative to the config file)."""
    mqsc_file: Path | None = None
    """MQSC script run at every start (use REPLACE to make it idempotent)."""
    define_stream_queues: bool = True
    """Define missing serviced stream queues as local queues at start-up."""
    listener_port: int | None = Field(default=None, ge=0, le=65535)
    """Channel listener on 127.0.0.1 (docs/networks.md): None = no listener, 0 = any
    free port (logged). The mqsc_file's channels, transmission queues, QM aliases and
    cluster definitions take effect whether or not the gateway listens."""
    address_book: dict[str, str] = Field(default_factory=dict)
    """Queue manager name -> "host:port" for CONNAME('<QM name>') in the mqsc_file; a
    multi-instance neighbour's instances as a list "hosta:port,hostb:port" (at most 8),
    tried in order (a channel's CONNAME can list them too: 'hosta(port),hostb(port)')."""
    min_free_mb: int = Field(default=64, ge=0)
    """Free-space watermark of the data directory's disk (MB; 0: none): below it,
    persistent puts are refused with MQRC 2056 (retriable back-pressure) while gets
    and commits go on, so a backlog never fills the disk (docs/embedded-qm.md)."""
    store_reserve_mb: int = Field(default=16, ge=0)
    """A file of this size (MB) kept in the data directory and released when the disk
    is full anyway, so commits that free space still complete (0: none)."""

    @field_validator("address_book")
    @classmethod
    def _host_ports(cls, value: dict[str, str]) -> dict[str, str]:
        from gateway.runtime.network_node import parse_address_book

        for q_mgr in value:
            if not 1 <= len(q_mgr) <= 48:
                raise ValueError(f"queue manager name {q_mgr!r} must have 1 to 48 characters")
        parse_address_book(value)
        return value


class IBMMQQueueManagerConfig(_Strict):
    """A real IBM MQ queue manager reached as an MQ client (needs the ``mq`` extra)."""

    type: Literal["ibmmq"]
    """``ibmmq``: a real IBM MQ queue manager (docs/ibmmq.md)."""
    name: str = Field(min_length=1, max_length=48)
    """Queue manager name."""
    host: str = "127.0.0.1"
    """Host of its listener."""
    port: int = Field(default=1414, ge=1, le=65535)
    """Port of its listener."""
    conname: str | None = None
    """A connection list instead of host/port, MQ's CONNAME form
    ``host1(1414),host2(1414)`` (at most 8 addresses, 264 characters): each is tried in
    order, so the gateway reaches whichever instance of a multi-instance or native-HA
    queue manager is active (docs/operations.md, "High availability")."""
    reconnect: Literal["default", "disabled", "yes", "qmgr"] = "default"
    """MQ client automatic reconnection (MQCNO): ``default`` leaves it to mqclient.ini
    and the channel's DEFRECON, ``yes`` = MQCNO_RECONNECT, ``qmgr`` =
    MQCNO_RECONNECT_Q_MGR, ``disabled`` = MQCNO_RECONNECT_DISABLED."""
    channel: str = Field(default="DEV.APP.SVRCONN", min_length=1, max_length=20)
    """The SVRCONN channel."""
    user: str | None = None
    """User id for connection authentication (MQCSP)."""
    password: Secret | None = None
    """The MQCSP password: ``{env: NAME}``, ``{file: PATH}`` or a literal (docs/security.md)."""
    password_env: str | None = None
    """Older form of ``password: {env: NAME}`` (kept working; not both)."""
    tls_cipher_spec: str | None = None
    """MQCD SSLCipherSpec (e.g. ANY_TLS12_OR_HIGHER): set = TLS on the channel."""
    key_repository: str | None = None
    """MQSCO KeyRepository: the key database stem, e.g. /var/mqm/ssl/key (key.kdb + key.sth)."""
    key_repository_password: Secret | None = None
    """MQSCO KeyRepoPassword (MQ 9.3+): password of a PKCS#12 key repository, a Secret."""
    cert_label: str | None = None
    """MQSCO CertificateLabel: the client certificate's label in the key repository."""

    @field_validator("conname")
    @classmethod
    def _conname_list(cls, value: str | None) -> str | None:
        if value is not None:
            parse_conname_list(value, default_port=1414)  # ValueError saying what is wrong
        return value

    @model_validator(mode="after")
    def _one_password(self) -> IBMMQQueueManagerConfig:
        if self.password is not None and self.password_env is not None:
            raise ValueError("give password ({env: NAME}) or password_env, not both")
        check_conname(self)
        check_tls_keys(self)
        return self

    def password_secret(self) -> Secret | None:
        """The password as a Secret, whichever key gave it."""
        if self.password_env is not None:
            return Secret(env=self.password_env)
        return self.password


QueueManagerSection = Annotated[
    EmbeddedQueueManagerConfig | IBMMQQueueManagerConfig, Field(discriminator="type")
]


class BrokerSection(BrokerConfig):
    """The publish/subscribe broker: serviced stream queues and batching."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    store: Path = Path("data/pubsub.db")
    """The subscription/retained-publication store (SQLite; relative to the config file)."""


class MetricsTLSConfig(_Strict):
    """HTTPS for the metrics endpoint (PEM files, relative to the config file)."""

    cert_file: Path
    """PEM certificate (chain)."""
    key_file: Path
    """PEM private key of ``cert_file``."""
    key_password: Secret | None = None
    """Passphrase of an encrypted ``key_file``."""
    client_ca_file: Path | None = None
    """Set: clients must present a certificate signed by this CA (mutual TLS)."""


class MetricsAuthConfig(_Strict):
    """Who may read the metrics endpoint: a bearer token, or a user name and password."""

    token: Secret | None = None
    """Bearer token: clients send ``Authorization: Bearer <token>``."""
    username: str | None = Field(default=None, min_length=1, pattern=r"^[^:]+$")
    """HTTP basic auth user name (no ``:``), with ``password``."""
    password: Secret | None = None
    """HTTP basic auth password, with ``username``."""
    protect_metrics: bool = True
    """Require the credentials for ``/metrics`` too (``/healthz`` stays open for probes).
    The endpoint changes no state today, so this is what ``auth`` protects."""

    @model_validator(mode="after")
    def _one_scheme(self) -> MetricsAuthConfig:
        basic = self.username is not None or self.password is not None
        if self.token is not None and basic:
            raise ValueError("give token, or username and password, not both")
        if self.token is None and not basic:
            raise ValueError("give token ({env: NAME}) or username and password")
        if basic and (self.username is None or self.password is None):
            raise ValueError("basic auth needs both username and password")
        return self


class MetricsConfig(_Strict):
    """Prometheus ``/metrics`` and ``/healthz`` over HTTP(S) (docs/security.md)."""

    enabled: bool = True
    """Serve ``/metrics`` and ``/healthz``."""
    host: str = "127.0.0.1"
    """Bind address; a non-loopback address without ``tls`` or ``auth`` is logged as a warning
    at start."""
    port: int = Field(default=9464, ge=0, le=65535)
    """Port; ``0`` picks a free one (logged at start)."""
    tls: MetricsTLSConfig | None = None
    """HTTPS (TLS 1.2+); none: plain HTTP."""
    auth: MetricsAuthConfig | None = None
    """Credentials for ``/metrics``, ``/network`` and the dashboard; ``/healthz`` stays open for
    probes."""
    dashboard: bool = True
    """The live dashboard on the same listener and credentials (docs/dashboard.md)."""


def check_metrics_files(metrics: MetricsConfig, base_dir: Path, source: str) -> list[ConfigError]:
    """The metrics endpoint's TLS files exist (so ``--check`` catches a wrong path)."""
    tls = metrics.tls
    if not metrics.enabled or tls is None:
        return []
    problems = []
    for key in ("cert_file", "key_file", "client_ca_file"):
        path: Path | None = getattr(tls, key)
        if path is None:
            continue
        full = path if path.is_absolute() else base_dir / path
        if not full.is_file():
            problems.append(ConfigError(
                f"metrics.tls.{key}", f"{full} does not exist or is not a file",
                "correct the path (relative to the config file)", source=source,
            ))
    return problems


class LoggingConfig(_Strict):
    format: Literal["json", "text"] = "json"
    """``json``: one object per line (``ts``, ``level``, ``logger``, ``msg``, extra fields);
    ``text``: classic lines."""
    level: Literal["debug", "info", "warning", "error"] = "info"
    """The log level; ``mqgw run -vv`` forces ``debug``, in the worker processes too."""


class PluginInstanceConfig(_Strict):
    """One plugin instance: ``plugin`` names the plugin, ``config`` is its own section."""

    name: str = Field(pattern=_INSTANCE_NAME)
    """The instance's name, unique; also its subscriber name in the broker: renaming an instance
    orphans its durable subscriptions."""
    plugin: str = Field(min_length=1)
    """Which plugin: an entry point of the ``mqgw.plugins`` group (shipped: ``kafka``, ``mqtt``,
    ``memory``)."""
    enabled: bool = True
    """``false`` keeps the entry without starting it (and without validating its ``config``)."""
    config: dict[str, Any] = Field(default_factory=dict)
    """The plugin's own section, validated by the plugin (the ``plugins[].config`` sections of
    this page)."""


class WorkerGroupConfig(_Strict):
    """One worker process (docs/config-reference.md "workers"): the forwarders and
    clients of ``plugins`` run in it, connected to the embedded queue manager over its
    local socket; the broker service and the queue manager stay in the main process."""

    name: str = Field(pattern=_INSTANCE_NAME)
    """The worker's name, unique: logs and the ``worker`` label of its metrics."""
    plugins: list[str] = Field(min_length=1)
    """Plugin instances (names under ``plugins:``) whose sinks this worker forwards."""
    restart_max_delay: float = Field(default=30.0, gt=0.0, le=3600.0)
    """Longest pause between restarts of a worker that keeps exiting (seconds)."""


class GatewayConfig(_Strict):
    """The whole ``gateway.yaml``."""

    id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    """Stable identity of this gateway (client ids, record origins); default
    ``mqgw-<queue manager name>``."""
    queue_manager: QueueManagerSection = Field(default_factory=EmbeddedQueueManagerConfig)
    """The queue manager the gateway works on: its own embedded one (``type: embedded``, the
    default when ``type`` is omitted) or a real IBM MQ queue manager reached as a client
    (``type: ibmmq``)."""
    broker: BrokerSection = Field(default_factory=BrokerSection)
    """The publish/subscribe broker: serviced stream queues, batching, backout and retry
    (docs/pubsub.md)."""
    plugins: list[PluginInstanceConfig] = Field(default_factory=list)
    """Plugin instances, each bridging streams to one target (Kafka, MQTT, memory)."""
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    """The ``/metrics``, ``/healthz`` and dashboard endpoint (enabled on 127.0.0.1:9464 by
    default)."""
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    """Log format and level."""
    expiry_sweep_interval: float = Field(default=5.0, gt=0.0)
    """Seconds between sweeps of expired messages on the embedded queue manager."""
    shutdown_timeout: float = Field(default=30.0, gt=0.0)
    """Seconds a SIGTERM waits for in-flight work before giving up."""
    neighbours: list[NeighbourConfig] = Field(default_factory=list)
    """Neighbour brokers (docs/neighbours.md); ``broker.neighbours`` is accepted too,
    but not both."""
    request_reply: RequestReplyConfig = Field(default_factory=RequestReplyConfig)
    """Request/reply routes between MQ and the plugins (docs/request-reply.md)."""
    authorisation: AuthorisationConfig = Field(default_factory=AuthorisationConfig)
    """Who may publish/subscribe where, which subscriber queues (docs/security.md)."""
    workers: list[WorkerGroupConfig] = Field(default_factory=list)
    """Worker processes, each forwarding a group of plugin instances' sinks (default
    none: everything in one process). Embedded queue manager only."""
    gc: GcConfig = Field(default_factory=GcConfig)
    """The process's garbage-collector policy, applied once start-up is complete
    (gateway/runtime/gc_policy.py); ``gc: {tune: false}`` keeps Python's settings."""

    @field_validator("neighbours")
    @classmethod
    def _one_neighbour_each(cls, value: list[NeighbourConfig]) -> list[NeighbourConfig]:
        return unique_neighbours(value)

    @model_validator(mode="after")
    def _neighbours_in_one_place(self) -> GatewayConfig:
        if self.neighbours and self.broker.neighbours:
            raise ValueError(
                "neighbours are listed both at the top level and under broker: keep one list"
            )
        if self.broker.neighbours:
            self.neighbours = list(self.broker.neighbours)
        for n in self.neighbours:
            if n.q_mgr == self.queue_manager.name:
                raise ValueError(
                    f"neighbour {n.q_mgr} is the gateway's own queue manager: a neighbour is "
                    "another broker"
                )
        return self

    @model_validator(mode="after")
    def _workers_fit(self) -> GatewayConfig:
        if not self.workers:
            return self
        if not isinstance(self.queue_manager, EmbeddedQueueManagerConfig):
            raise ValueError(
                "workers need the embedded queue manager (they reach it over its local "
                "socket); remove workers: or use queue_manager.type: embedded"
            )
        enabled = {p.name for p in self.plugins if p.enabled}
        rr = {r.plugin for r in self.request_reply.requests} | {
            r.plugin for r in self.request_reply.services}
        groups: set[str] = set()
        owner: dict[str, str] = {}
        for w in self.workers:
            if w.name in groups:
                raise ValueError(f"two workers are called {w.name!r}; rename one")
            groups.add(w.name)
            for p in w.plugins:
                if p not in enabled:
                    raise ValueError(
                        f"worker {w.name!r} names plugin instance {p!r}, which is not an "
                        f"enabled instance under plugins: (enabled: "
                        f"{', '.join(sorted(enabled)) or 'none'})"
                    )
                if p in owner:
                    raise ValueError(
                        f"plugin instance {p!r} is in workers {owner[p]!r} and {w.name!r}; "
                        "an instance runs in one process"
                    )
                if p in rr:
                    raise ValueError(
                        f"plugin instance {p!r} serves request/reply routes and cannot run "
                        f"in worker {w.name!r} (request/reply stays in the main process)"
                    )
                owner[p] = w.name
        return self

    @field_validator("queue_manager", mode="before")
    @classmethod
    def _embedded_by_default(cls, value: Any) -> Any:
        if isinstance(value, dict) and "type" not in value:
            return {**value, "type": "embedded"}
        return value

    @field_validator("plugins")
    @classmethod
    def _unique_names(cls, value: list[PluginInstanceConfig]) -> list[PluginInstanceConfig]:
        seen: set[str] = set()
        for p in value:
            if p.name in seen:
                raise ValueError(f"two plugin instances are called {p.name!r}; rename one")
            seen.add(p.name)
        return value

    @property
    def gateway_id(self) -> str:
        return self.id or f"mqgw-{self.queue_manager.name}"


@dataclass(slots=True)
class LoadedConfig:
    """A validated configuration: the gateway's and each enabled instance's plugin config."""

    gateway: GatewayConfig
    plugin_configs: dict[str, BaseModel]
    base_dir: Path

    def path(self, p: Path) -> Path:
        """``p`` resolved against the config file's directory."""
        return p if p.is_absolute() else self.base_dir / p


# -------------------------------------------------------------------- errors --------


def _key(loc: Sequence[int | str], prefix: str = "") -> str:
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("embedded", "ibmmq") and out.endswith("queue_manager"):
            continue  # the discriminated union's tag, not a key the user wrote
        else:
            out += f".{part}" if out else str(part)
    return out


def _fix(err: Mapping[str, Any], model: type[BaseModel] | None) -> str:
    kind = err.get("type", "")
    ctx = err.get("ctx") or {}
    if kind == "extra_forbidden":
        return "remove it or check its spelling" + _known_keys(err, model)
    if kind == "missing":
        return "add it"
    if kind in ("literal_error", "enum"):
        return f"use one of {ctx.get('expected', '')}"
    if kind == "union_tag_invalid":
        return f"set type to one of {ctx.get('expected_tags', '')}"
    if kind == "union_tag_not_found":
        return "add 'type: embedded' or 'type: ibmmq'"
    if kind.startswith("int_") or kind.startswith("float_"):
        return "write a number"
    if kind.startswith("bool"):
        return "write true or false"
    if kind == "string_pattern_mismatch":
        return f"it must match {ctx.get('pattern', '')}"
    return ""


def _known_keys(err: Mapping[str, Any], model: type[BaseModel] | None) -> str:
    target: Any = model
    for part in list(err.get("loc", ()))[:-1]:
        if target is None:
            return ""
        if isinstance(part, int) or part in ("embedded", "ibmmq"):
            if part == "ibmmq":
                target = IBMMQQueueManagerConfig
            elif part == "embedded":
                target = EmbeddedQueueManagerConfig
            continue
        field = getattr(target, "model_fields", {}).get(part)
        if field is None:
            return ""
        target = _model_in(field.annotation)
    if target is None or not hasattr(target, "model_fields"):
        return ""
    return f" (known keys: {', '.join(target.model_fields)})"


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _errors(
    exc: ValidationError, source: str, prefix: str = "", model: type[BaseModel] | None = None
) -> list[ConfigError]:
    return [
        ConfigError(_key(e["loc"], prefix), e["msg"], _fix(e, model), source=source)
        for e in exc.errors()
    ]


# -------------------------------------------------------------------- loading -------


def expand_env(value: Any, key: str = "") -> Any:
    """Replace ``${NAME}`` / ``${NAME:-default}`` in strings by environment variables."""
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            name, default = m.group(1), m.group(2)
            got = os.environ.get(name, default)
            if got is None:
                raise ConfigError(
                    key or "(value)",
                    f"environment variable {name} is not set",
                    f"export {name}=... or write ${{{name}:-default}}",
                )
            return got

        return _ENV_REF.sub(sub, value)
    if isinstance(value, dict):
        return {k: expand_env(v, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_env(v, f"{key}[{i}]") for i, v in enumerate(value)]
    return value


def parse_config(
    data: Any, registry: PluginRegistry, *, source: str = "", base_dir: Path | None = None
) -> LoadedConfig:
    """Validate already-parsed YAML data; raises ConfigErrors listing every problem."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigErrors([ConfigError("", "the file must hold a mapping of keys", source=source)])
    try:
        data = expand_env(data)
    except ConfigError as exc:
        exc.source = source
        raise ConfigErrors([exc]) from None
    problems: list[ConfigError] = []
    gateway: GatewayConfig | None = None
    try:
        gateway = GatewayConfig.model_validate(data)
    except ValidationError as exc:
        problems.extend(_errors(exc, source, model=GatewayConfig))
    plugin_configs: dict[str, BaseModel] = {}
    raw_plugins = data.get("plugins")
    for i, inst in enumerate(raw_plugins if isinstance(raw_plugins, list) else []):
        # From the raw data, so plugin sections are checked even when other keys are wrong.
        if not isinstance(inst, dict) or inst.get("enabled", True) is False:
            continue
        name, kind = inst.get("name"), inst.get("plugin")
        if not isinstance(kind, str) or not isinstance(name, str):
            continue  # reported by the gateway model
        try:
            plugin = registry.get(kind)
        except PluginLoadError as exc:
            problems.append(ConfigError(f"plugins[{i}].plugin", str(exc), "", source=source))
            continue
        model = plugin.config_model
        try:
            plugin_configs[name] = model.model_validate(inst.get("config") or {})
        except ValidationError as exc:
            problems.extend(_errors(exc, source, f"plugins[{i}].config", model))
    if gateway is not None:
        problems.extend(check_numbers(gateway, "", source))
        index = {p.name: i for i, p in enumerate(gateway.plugins)}
        for name, cfg in plugin_configs.items():
            problems.extend(check_numbers(cfg, f"plugins[{index.get(name, '?')}].config", source))
        serviced = {DEFAULT_STREAM} | {s.name for s in gateway.broker.streams}
        sections = [(f"plugins[{index.get(n, '?')}].config", c) for n, c in plugin_configs.items()]
        problems.extend(check_streams(serviced, sections, source))
        problems.extend(check_request_reply(gateway, registry, source))
        problems.extend(check_request_reply_queues(gateway, source))
        problems.extend(check_requester_reply_topics(gateway, registry, plugin_configs, source))
        problems.extend(check_metrics_files(gateway.metrics, base_dir or Path.cwd(), source))
    if problems or gateway is None:
        raise ConfigErrors(problems)
    for name, cfg in plugin_configs.items():
        plugin_configs[name] = _fit_send_timeout(name, cfg, gateway.shutdown_timeout)
    return LoadedConfig(gateway, plugin_configs, base_dir or Path.cwd())


#: Share of ``shutdown_timeout`` a plugin send may take: the broker drain at shutdown
#: waits for the send in progress and must leave time to stop the plugins.
SEND_SHARE_OF_SHUTDOWN = 0.5


def _fit_send_timeout(name: str, cfg: BaseModel, shutdown_timeout: float) -> BaseModel:
    """Clamp a plugin's ``send_timeout_s`` below the shutdown budget (warning when it
    was set explicitly), so a SIGTERM during a stuck send still stops cleanly."""
    send = getattr(cfg, "send_timeout_s", None)
    limit = shutdown_timeout * SEND_SHARE_OF_SHUTDOWN
    if not isinstance(send, (int, float)) or send <= limit:
        return cfg
    if "send_timeout_s" in cfg.model_fields_set:
        log.warning(
            "plugin instance %s: send_timeout_s %.1f s clamped to %.1f s (half of "
            "shutdown_timeout %.1f s)",
            name,
            send,
            limit,
            shutdown_timeout,
        )
    return cfg.model_copy(update={"send_timeout_s": limit})


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML loader that refuses a key written twice in one mapping (PyYAML keeps the
    last one silently: a second ``metrics:`` section would quietly replace the first)."""


class _DuplicateKeyError(yaml.constructor.ConstructorError):
    def __init__(self, key: object, first: int, second: int) -> None:
        super().__init__(None, None, f"written twice (lines {first} and {second})")
        self.key, self.first, self.second = key, first, second


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise _DuplicateKeyError(key, seen[key], line)
        seen[key] = line
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _unique_mapping,
)


def load_config(path: Path | str, registry: PluginRegistry) -> LoadedConfig:
    """Read and validate ``path`` (YAML), then check what it names on this machine
    (paths that must exist or be creatable): what ``--check`` and the start both run."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigErrors(
            [ConfigError("", f"cannot read {p}: {exc.strerror}", "check the --config path")]
        ) from None
    except UnicodeDecodeError:
        raise ConfigErrors(
            [ConfigError("", "the file is not UTF-8 text", "save it as UTF-8", source=str(p))]
        ) from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except _DuplicateKeyError as exc:
        raise ConfigErrors(
            [
                ConfigError(
                    str(exc.key),
                    f"written twice in one section (lines {exc.first} and {exc.second}); "
                    "YAML would silently keep only the second",
                    "keep one (merge the two)",
                    source=str(p),
                )
            ]
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise ConfigErrors(
            [
                ConfigError(
                    "",
                    f"{where}not valid YAML ({getattr(exc, 'problem', exc)})",
                    "fix the YAML syntax",
                    source=str(p),
                )
            ]
        ) from None
    if data is None:
        raise ConfigErrors(
            [
                ConfigError(
                    "",
                    "the file is empty (or only comments)",
                    "write the gateway's settings; examples/gateway.yaml is a starting point",
                    source=str(p),
                )
            ]
        )
    loaded = parse_config(data, registry, source=str(p), base_dir=p.resolve().parent)
    cfg = loaded.gateway
    qmc = cfg.queue_manager
    data_dir = mqsc_file = None
    if isinstance(qmc, EmbeddedQueueManagerConfig):
        data_dir = loaded.path(qmc.data_dir)
        mqsc_file = loaded.path(qmc.mqsc_file) if qmc.mqsc_file is not None else None
    rr = cfg.request_reply
    problems = check_paths(
        data_dir=data_dir,
        mqsc_file=mqsc_file,
        store=loaded.path(cfg.broker.store),
        request_reply_store=loaded.path(rr.store) if rr.requests or rr.services else None,
        source=str(p),
    )
    if problems:
        raise ConfigErrors(problems)
    serviced = {s.name for s in cfg.broker.streams}
    problems = check_migrated_streams(loaded.path(cfg.broker.store), serviced, str(p))
    if problems:
        raise ConfigErrors(problems)
    return loaded
