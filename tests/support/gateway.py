"""The one in-process gateway of the tests, built the way ``mqgw run`` builds it
(:class:`gateway.runtime.app.GatewayApp`): an embedded queue manager, a SQLite
subscription store, the publish/subscribe service and the plugin host; every plugin
instance is attached (its sink registered) *before* the service serves its first batch,
then the service starts, then the instances start.

What differs from the app, on purpose: instances are started in the foreground (a start
failure raises here instead of being retried in a background task), there is no HTTP
endpoint, and the queue manager may be given (a test that wraps or shares it) or defined
from an MQSC script.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import QueueManager
from gateway.plugin_api import PluginInstance
from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.sqlite_store import SqliteStore
from gateway.runtime.plugin_host import PluginHost
from gateway.runtime.pubsub_service import BrokerConfig, BrokerService, StreamQueueConfig
from gateway.runtime.pubsub_service.forgiven_backouts import ForgivenBackouts

STOCK = "STOCK.STREAM"
BULLETIN = "BULLETIN.STREAM"
DEFAULT = "SYSTEM.BROKER.DEFAULT.STREAM"
CONTROL = "SYSTEM.BROKER.CONTROL.QUEUE"

#: The bridge tests' topology: two named streams and the legacy applications' queues.
BRIDGE_QUEUES = f"""
DEFINE QLOCAL('{STOCK}') DEFPSIST(YES) REPLACE
DEFINE QLOCAL('{BULLETIN}') DEFPSIST(YES) REPLACE
DEFINE QLOCAL(SUB.RFH) REPLACE
DEFINE QLOCAL(SUB.RFH2) REPLACE
DEFINE QLOCAL(REPLY.Q) REPLACE
"""


def bridge_config(**overrides: object) -> BrokerConfig:
    """The service settings of the bridge tests: both streams serviced, short waits."""
    settings: dict[str, object] = {
        "streams": [StreamQueueConfig(name=STOCK), StreamQueueConfig(name=BULLETIN)],
        "wait_ms": 50,
        "retry_delay": 0.05,
    }
    settings.update(overrides)
    return BrokerConfig.model_validate(settings)


@dataclass
class InProcessGateway:
    """One gateway in the test process (see module docstring)."""

    qm: EmbeddedQueueManager
    store: SqliteStore
    service: BrokerService
    host: PluginHost
    instances: list[PluginInstance] = field(default_factory=list)

    @property
    def instance(self) -> PluginInstance:
        """The first (usually only) plugin instance."""
        return self.instances[0]

    async def start(self, *instances: PluginInstance) -> None:
        """Attach ``instances``, start the service, then start each instance (the
        ``mqgw run`` order). On failure everything is closed and the error raised."""
        try:
            for instance in instances:
                self.host.attach(instance)
                self.instances.append(instance)
            await self.service.start()
            for instance in instances:
                await self.host.start(instance)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """The SIGTERM order: the service finishes and commits its batches while the
        plugins can still acknowledge them, then the plugins stop, then MQ and the store
        close."""
        try:
            await self.service.stop()
            await self.host.stop_all()
        finally:
            await self.qm.close()
            self.store.close()
            self.service.forgiven.close()


def build_gateway(
    path: Path,
    *,
    mqsc: str = BRIDGE_QUEUES,
    config: BrokerConfig | None = None,
    gateway_id: str = "gw-test",
    qm: EmbeddedQueueManager | None = None,
    service_qm: QueueManager | None = None,
) -> InProcessGateway:
    """A gateway on ``path`` (a restart when ``path`` holds one already), not started.

    ``service_qm`` lets the service and plugin host run over a wrapper of the queue
    manager (fault injection) while setup and checks use the real one.
    """
    qmgr = qm or EmbeddedQueueManager("QM1", path / "qm")
    if mqsc:
        qmgr.run_mqsc(mqsc, stop_on_error=True)
    store = SqliteStore(path / "pubsub.db", synchronous="NORMAL")
    port = service_qm or qmgr
    config = config if config is not None else bridge_config()
    engine = PubSubEngine(
        qmgr.name,
        store,
        broker_queues=config.broker_queues,
        suspend_after=config.suspend_subscription_after,
    )
    service = BrokerService(
        port, engine, config, forgiven=ForgivenBackouts(path / "pubsub.db")
    )
    return InProcessGateway(qmgr, store, service, PluginHost(port, service, gateway_id))


async def start_gateway(
    path: Path,
    *instances: PluginInstance,
    mqsc: str = BRIDGE_QUEUES,
    config: BrokerConfig | None = None,
    gateway_id: str = "gw-test",
    qm: EmbeddedQueueManager | None = None,
) -> InProcessGateway:
    """Build and start a gateway with ``instances`` (see :class:`InProcessGateway`)."""
    gw = build_gateway(path, mqsc=mqsc, config=config, gateway_id=gateway_id, qm=qm)
    await gw.start(*instances)
    return gw
