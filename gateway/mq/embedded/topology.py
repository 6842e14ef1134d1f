"""The topology file: a network of embedded queue managers declared in YAML.

Why: tests, the demo and operators trying cluster set-ups need one place that says which
queue managers exist, where they listen and which MQSC defines them. Validated with
pydantic at load time (names, ports) and every queue manager's MQSC is run against a
scratch copy of a new queue manager's definitions (:func:`~.mqsc_run.check_script`:
syntax, keywords per object type, values, re-definitions without REPLACE), so a mistake
names its file, queue manager and line before anything starts or is created.
Format (docs/networks.md)::

    data_dir: data/network          # optional; relative to the file
    queue_managers:
      QM1:
        port: 14141                 # 0 = any free port (only for one-process networks)
        mqsc: |
          DEFINE QLOCAL(Q1)
      QM2:
        mqsc_file: qm2.mqsc         # relative to the file
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gateway.mq.embedded.mqsc import MQSCError
from gateway.mq.embedded.mqsc_run import check_script
from gateway.mq.embedded.objects import ObjectCatalogue, check_object_name, new_catalogue


class TopologyError(Exception):
    """The topology file cannot be used; ``path`` names the file."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        super().__init__(f"{path}: {message}")


class QueueManagerSpec(BaseModel):
    """One queue manager of the network."""

    model_config = ConfigDict(extra="forbid")

    port: Annotated[int, Field(ge=0, le=65535)] = 0
    mqsc: str = ""
    mqsc_file: Path | None = None
    description: str = ""

    def script(self, base: Path) -> str:
        """The MQSC to run at start: ``mqsc_file`` (relative to the topology) then ``mqsc``."""
        text = ""
        if self.mqsc_file is not None:
            path = self.mqsc_file if self.mqsc_file.is_absolute() else base / self.mqsc_file
            text = path.read_text(encoding="utf-8") + "\n"
        return text + self.mqsc

    def where(self, base: Path, topology_file: str, line: int) -> tuple[str, int]:
        """(file, line in it) of line ``line`` of :meth:`script`: the ``mqsc_file`` for
        its lines, else the topology file (the line then counts within ``mqsc``)."""
        if self.mqsc_file is None:
            return topology_file, line
        path = self.mqsc_file if self.mqsc_file.is_absolute() else base / self.mqsc_file
        try:
            in_file = len((path.read_text(encoding="utf-8") + "\n").splitlines())
        except OSError:
            return str(path), line
        return (str(path), line) if line <= in_file else (topology_file, line - in_file)


class Topology(BaseModel):
    """A network: queue managers by name."""

    model_config = ConfigDict(extra="forbid")

    data_dir: Path | None = None
    queue_managers: dict[str, QueueManagerSpec]
    base_dir: Path = Path(".")
    #: the topology file (error messages name it)
    origin: str = "<topology>"

    @field_validator("queue_managers")
    @classmethod
    def _names(cls, value: dict[str, QueueManagerSpec]) -> dict[str, QueueManagerSpec]:
        if not value:
            raise ValueError("declare at least one queue manager")
        ports: dict[int, str] = {}
        for name, spec in value.items():
            problem = check_object_name(name, "queue manager")
            if problem:
                raise ValueError(problem)
            if spec.port:
                if spec.port in ports:
                    raise ValueError(f"{name} and {ports[spec.port]} both use port {spec.port}")
                ports[spec.port] = name
        return value

    def address_book(self) -> dict[str, tuple[str, int]]:
        """Listener addresses by queue-manager name (fixed ports only)."""
        return {n: ("127.0.0.1", s.port) for n, s in self.queue_managers.items() if s.port}

    def check_mqsc(self, name: str | None = None, catalogue: ObjectCatalogue | None = None
                   ) -> None:
        """Check the MQSC of every queue manager (or of ``name``) as it would run on a new
        queue manager (or against ``catalogue``, its current definitions); raises
        TopologyError naming the file, the queue manager and the line. Changes nothing."""
        for qm_name, spec in self.queue_managers.items():
            if name is not None and qm_name != name:
                continue
            try:
                check_script(catalogue or new_catalogue(qm_name), spec.script(self.base_dir))
            except MQSCError as exc:
                raise self.mqsc_error(qm_name, exc) from None
            except OSError as exc:
                raise TopologyError(self.origin, f"queue manager {qm_name}: {exc}") from None

    def mqsc_error(self, name: str, exc: MQSCError) -> TopologyError:
        """The TopologyError for an MQSC error of queue manager ``name``."""
        path, line = self.queue_managers[name].where(self.base_dir, self.origin, exc.line)
        return TopologyError(path, f"queue manager {name}: line {line}: {exc.detail}")


def load_topology(path: Path | str) -> Topology:
    """Read and validate a topology file."""
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise TopologyError(str(p), f"cannot read the topology: {exc}") from None
    return topology_from_dict(raw, p.parent, str(p))


def topology_from_dict(raw: object, base_dir: Path, origin: str = "<topology>") -> Topology:
    if not isinstance(raw, dict):
        raise TopologyError(origin, "the topology must be a mapping with queue_managers")
    try:
        topo = Topology.model_validate({**raw, "base_dir": base_dir, "origin": origin})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise TopologyError(origin, f"{where}: {first['msg']}") from None
    topo.check_mqsc()
    return topo
