"""compose.yaml, the Dockerfiles and deploy/compose/: checked without a Docker engine.

The project's machines have no Docker engine, so nothing here builds an image or starts a
container. What is checked instead, each a real outcome that fails (never skips):

* compose.yaml, after Compose-style ``${VAR:-default}`` interpolation, validates against
  the Compose Specification's JSON schema (the copy check-jsonschema ships, a dev extra),
  and the validator rejects a broken file (so it really validates);
* every file it names exists: build contexts, Dockerfiles, bind-mounted files, env_file;
  each Dockerfile's COPY sources exist and are not excluded by .dockerignore;
* every gateway config it mounts passes ``mqgw run --config ... --check`` with the
  service's environment; the command lines parse with the real ``mqgw`` / analytics parsers;
* every published port is bound to 127.0.0.1 and is what the service listens on (the
  gateway's ``metrics.port``, Kafka's listeners, mosquitto.conf's ``listener``); the
  addresses the services give each other (bootstrap servers, MQTT host) name a service
  and a port it listens on; health checks probe those ports;
* every ``${VAR}`` has a default or is documented in docs/docker.md (the page the
  README links for Docker); no literal secrets;
* the Dockerfiles: non-root USER in every final target, HEALTHCHECK on /healthz, the data
  VOLUME the gateway config writes to, EXPOSE of the metrics port, ENTRYPOINT ``mqgw``,
  no secrets; Dockerfile.spark's pyspark equals the project's pin;
* the Spark job container runs a job module that exists.
"""

from __future__ import annotations

import argparse
import copy
import fnmatch
import json
import re
import shlex
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from analytics.jobs import JOB_NAMES
from gateway.runtime.cli import build_parser
from gateway.runtime.cli import main as mqgw_main

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "compose.yaml"
#: Where compose users read about the stack and its variables (linked from README.md).
DOCKER_DOC = ROOT / "docs" / "docker.md"

#: The gateway image's config path (Dockerfile CMD, compose mounts).
GATEWAY_CONFIG_IN_CONTAINER = "/etc/mqgw/gateway.yaml"

# ---------------------------------------------------------------------------------------
# Compose-style interpolation
# ---------------------------------------------------------------------------------------

_VAR = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])"
    r"(?P<arg>[^}]*))?\}|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))"
)


@dataclass
class VarUse:
    name: str
    default: str | None  # None: no default given
    where: str


@dataclass
class Interpolated:
    data: Any
    uses: list[VarUse] = field(default_factory=list)


def interpolate(data: Any, env: Mapping[str, str], where: str = "") -> Interpolated:
    """Substitute ``${VAR}``, ``${VAR:-x}``, ``${VAR-x}``, ``$VAR`` and ``$$`` the way
    Compose does (values only, not keys), recording every variable used."""
    out = Interpolated(None)

    def sub_str(text: str, at: str) -> str:
        def one(m: re.Match[str]) -> str:
            if m.group("escaped"):
                return "$"
            name = m.group("braced") or m.group("plain")
            op, arg = m.group("op"), m.group("arg")
            default = arg if op in (":-", "-") else None
            out.uses.append(VarUse(name, default, at))
            value = env.get(name)
            if op == ":-" and not value:
                return arg or ""
            if op == "-" and value is None:
                return arg or ""
            return value or ""

        return _VAR.sub(one, text)

    def walk(node: Any, at: str) -> Any:
        if isinstance(node, str):
            return sub_str(node, at)
        if isinstance(node, list):
            return [walk(v, f"{at}[{i}]") for i, v in enumerate(node)]
        if isinstance(node, dict):
            return {k: walk(v, f"{at}.{k}" if at else str(k)) for k, v in node.items()}
        return node

    out.data = walk(data, where)
    return out


def test_interpolation_follows_compose_rules() -> None:
    got = interpolate(
        {"a": "${X:-d}", "b": "${Y-e}", "c": "$$HOME", "d": "${Z}", "e": "$W-x"},
        {"Y": "", "Z": "z", "W": "w"},
    )
    assert got.data == {"a": "d", "b": "", "c": "$HOME", "d": "z", "e": "w-x"}
    assert [(u.name, u.default) for u in got.uses] == [
        ("X", "d"), ("Y", "e"), ("Z", None), ("W", None)
    ]


# ---------------------------------------------------------------------------------------
# The compose file
# ---------------------------------------------------------------------------------------


def raw_compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def compose() -> Interpolated:
    """compose.yaml as Compose sees it with nothing set: every default applied."""
    return interpolate(raw_compose(), {})


def services() -> dict[str, dict[str, Any]]:
    svc = compose().data["services"]
    assert isinstance(svc, dict)
    return svc


def compose_schema() -> dict[str, Any]:
    ref = resources.files("check_jsonschema.builtin_schemas").joinpath(
        "vendor", "compose-spec.json"
    )
    schema = json.loads(ref.read_text(encoding="utf-8"))
    assert schema.get("title") == "Compose Specification", schema.get("title")
    return schema


def schema_errors(doc: Any) -> list[str]:
    schema = compose_schema()
    validator_cls = jsonschema.validators.validator_for(schema)
    validator_cls.check_schema(schema)
    validator = validator_cls(schema)
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
        for e in validator.iter_errors(doc)
    ]


def test_compose_file_validates_against_the_compose_specification_schema() -> None:
    assert schema_errors(compose().data) == []


def test_the_schema_check_rejects_a_broken_file() -> None:
    broken = copy.deepcopy(compose().data)
    broken["services"]["gateway"]["portz"] = ["9464:9464"]  # misspelt key
    broken["services"]["spark"]["depends_on"]["kafka"]["condition"] = "service_happy"
    errors = schema_errors(broken)
    assert any("portz" in e for e in errors), errors
    assert any("service_happy" in e for e in errors), errors


def test_the_expected_services_and_profiles() -> None:
    svc = services()
    assert set(svc) == {"gateway", "kafka", "mosquitto", "spark", "ibmmq", "gateway-ibmmq"}
    default = {n for n, s in svc.items() if not s.get("profiles")}
    assert default == {"gateway", "kafka", "mosquitto", "spark"}
    assert svc["ibmmq"]["profiles"] == ["ibmmq"]
    assert svc["gateway-ibmmq"]["profiles"] == ["ibmmq"]
    assert svc["kafka"]["image"].startswith("apache/kafka:")
    assert svc["mosquitto"]["image"].startswith("eclipse-mosquitto:")
    assert svc["ibmmq"]["image"].startswith("icr.io/ibm-messaging/mq:")
    assert svc["ibmmq"]["environment"]["LICENSE"] == "accept"


def test_kafka_image_is_the_version_the_tests_run() -> None:
    """The compose Kafka is the release `make test` runs for real (tools/jvm/kafka)."""
    pom = (ROOT / "tools/jvm/kafka/pom.xml").read_text(encoding="utf-8")
    (version,) = re.findall(r"<kafka\.version>([^<]+)</kafka\.version>", pom)
    assert services()["kafka"]["image"] == f"apache/kafka:{version}"


def test_depends_on_waits_for_health_checks_that_exist() -> None:
    svc = services()
    for name, s in svc.items():
        for dep, cond in (s.get("depends_on") or {}).items():
            assert dep in svc, f"{name} depends on unknown {dep}"
            assert cond["condition"] in ("service_healthy", "service_started"), (name, dep)
            if cond["condition"] == "service_healthy":
                assert "test" in svc[dep].get("healthcheck", {}), f"{dep} has no health check"
            # a service in no profile must not wait for one only a profile starts
            if not s.get("profiles"):
                assert not svc[dep].get("profiles"), f"{name} needs profile-only {dep}"
    for name in ("gateway", "kafka", "mosquitto", "ibmmq", "gateway-ibmmq"):
        assert svc[name]["healthcheck"]["test"][0] == "CMD", name
    assert svc["gateway"]["depends_on"] == {
        "kafka": {"condition": "service_healthy"},
        "mosquitto": {"condition": "service_healthy"},
    }
    assert svc["gateway-ibmmq"]["depends_on"]["ibmmq"] == {"condition": "service_healthy"}
    assert svc["spark"]["depends_on"]["kafka"] == {"condition": "service_healthy"}


# ---------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------


@dataclass
class Mount:
    source: str
    target: str
    bind: bool


def mounts(service: Mapping[str, Any]) -> list[Mount]:
    out = []
    for v in service.get("volumes", []):
        if isinstance(v, str):
            parts = v.split(":")
            src, tgt = parts[0], parts[1]
            out.append(Mount(src, tgt, src.startswith((".", "/", "~"))))
        else:
            out.append(Mount(v["source"], v["target"], v.get("type") == "bind"))
    return out


def host_path(source: str) -> Path:
    return (COMPOSE.parent / source).resolve()


def dockerfile_of(service: Mapping[str, Any]) -> Path | None:
    build = service.get("build")
    if build is None:
        return None
    if isinstance(build, str):
        return host_path(build) / "Dockerfile"
    return host_path(build.get("context", ".")) / build.get("dockerfile", "Dockerfile")


def test_every_referenced_file_exists() -> None:
    compose_data = compose().data
    checked = 0
    for name, s in compose_data["services"].items():
        build = s.get("build")
        if build is not None:
            ctx = host_path(build if isinstance(build, str) else build.get("context", "."))
            assert ctx.is_dir(), f"{name}: build context {ctx} missing"
            dockerfile = dockerfile_of(s)
            assert dockerfile is not None and dockerfile.is_file(), f"{name}: {dockerfile}"
            checked += 2
        for m in mounts(s):
            if m.bind:
                assert host_path(m.source).exists(), f"{name}: mounted {m.source} missing"
                checked += 1
            else:
                assert m.source in compose_data.get("volumes", {}), (
                    f"{name}: named volume {m.source} not declared under volumes:"
                )
        env_files = s.get("env_file", [])
        for ef in [env_files] if isinstance(env_files, str) else env_files:
            path = ef if isinstance(ef, str) else ef["path"]
            required = True if isinstance(ef, str) else ef.get("required", True)
            if required:
                assert host_path(path).is_file(), f"{name}: env_file {path} missing"
                checked += 1
    assert checked >= 8  # 3 builds x 2, 3 bind-mounted config files


# ---------------------------------------------------------------------------------------
# Dockerfiles
# ---------------------------------------------------------------------------------------


@dataclass
class Instruction:
    keyword: str
    args: str
    line: int


@dataclass
class Stage:
    name: str | None
    base: str
    instructions: list[Instruction] = field(default_factory=list)


def parse_dockerfile(path: Path) -> list[Stage]:
    """Instructions per build stage (continuation lines joined, comments dropped)."""
    stages: list[Stage] = []
    pending, start = "", 0
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text, pending = pending + line, ""
        keyword, _, args = text.partition(" ")
        ins = Instruction(keyword.upper(), args.strip(), start)
        if ins.keyword == "FROM":
            words = ins.args.split()
            words = [w for w in words if not w.startswith("--")]
            alias = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(alias, words[0]))
        elif stages:
            stages[-1].instructions.append(ins)
        else:
            assert ins.keyword == "ARG", f"{path}:{start}: {ins.keyword} before FROM"
    return stages


def stage_chain(stages: list[Stage], target: str | None) -> list[Stage]:
    """The stage built for ``target`` (default: the last) and the stages it is FROM."""
    by_name = {s.name: s for s in stages if s.name}
    stage = by_name[target] if target else stages[-1]
    chain = [stage]
    while stage.base in by_name:
        stage = by_name[stage.base]
        chain.insert(0, stage)
    return chain


def effective(chain: list[Stage], keyword: str) -> list[Instruction]:
    return [i for s in chain for i in s.instructions if i.keyword == keyword]


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


_SECRETISH = re.compile(r"(?i)(passw|secret|token|api[_-]?key|private[_-]?key)")


def dockerfile_targets() -> Iterator[tuple[str, Path, str | None]]:
    for name, s in services().items():
        dockerfile = dockerfile_of(s)
        if dockerfile is not None:
            build = s["build"]
            yield name, dockerfile, build.get("target") if isinstance(build, dict) else None


def test_dockerfiles_run_as_non_root_without_secrets() -> None:
    seen = []
    for name, dockerfile, target in dockerfile_targets():
        stages = parse_dockerfile(dockerfile)
        if target is not None:
            assert target in {s.name for s in stages}, f"{name}: no stage {target}"
        chain = stage_chain(stages, target)
        users = effective(chain, "USER")
        assert users, f"{name}: {dockerfile.name} target {target} sets no USER (runs as root)"
        final_user = users[-1].args.split(":")[0]
        assert final_user not in ("root", "0"), f"{name}: runs as {final_user}"
        for stage in stages:
            for ins in stage.instructions:
                if ins.keyword in ("ENV", "ARG", "LABEL"):
                    assert not _SECRETISH.search(ins.args), (
                        f"{dockerfile.name}:{ins.line}: looks like a secret: {ins.args}"
                    )
        seen.append(name)
    assert sorted(seen) == ["gateway", "gateway-ibmmq", "spark"]


def test_dockerfile_copy_sources_exist_and_are_not_dockerignored() -> None:
    ignored = [
        p.strip().rstrip("/")
        for p in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if p.strip() and not p.startswith("#")
    ]
    for must in (".venv", ".cache", ".git", "data"):
        assert must in ignored, f".dockerignore does not exclude {must}"
    copied = 0
    for dockerfile in (ROOT / "Dockerfile", ROOT / "Dockerfile.spark"):
        for stage in parse_dockerfile(dockerfile):
            for ins in stage.instructions:
                if ins.keyword not in ("COPY", "ADD") or "--from=" in ins.args:
                    continue
                words = [w for w in shlex.split(ins.args) if not w.startswith("--")]
                for src in words[:-1]:
                    if ins.keyword == "ADD" and _is_remote(src, dockerfile):
                        continue  # a download (the MQ client), not a file of the context
                    assert (ROOT / src).exists(), f"{dockerfile.name}:{ins.line}: no {src}"
                    hit = [p for p in ignored if fnmatch.fnmatch(src, p)]
                    assert not hit, f"{dockerfile.name}:{ins.line}: {src} is .dockerignored"
                    copied += 1
    assert copied >= 6


def dockerfile_args(path: Path) -> dict[str, str]:
    """The defaults of the ``ARG NAME=value`` lines before the first FROM."""
    out: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("FROM "):
            break
        m = re.fullmatch(r"ARG (\w+)=(\S+)", line.strip())
        if m:
            out[m[1]] = m[2]
    return out


def _is_remote(src: str, dockerfile: Path) -> bool:
    args = dockerfile_args(dockerfile)
    resolved = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m[1], m[0]), src)
    return resolved.startswith("https://")


def test_gateway_ibmmq_builds_against_the_redistributable_client() -> None:
    """IBM's MQ server image (compose's ``ibmmq`` service) ships no SDK headers
    (/opt/mqm/inc), so ``ibmmq`` cannot be compiled against it: the build stage takes IBM
    MQ's redistributable client instead, keeps its SDK with genmqpkg, and the runtime image
    gets the client libraries from that stage, with no compiler."""
    path = ROOT / "Dockerfile"
    stages = parse_dockerfile(path)
    args = dockerfile_args(path)
    assert "MQ_IMAGE" not in args  # nothing is taken from the server image
    by_name = {st.name: st for st in stages}
    bases = {st.base for st in stages}
    assert not any("ibm-messaging/mq" in b or "MQ_IMAGE" in b for b in bases), bases
    build = by_name["build-ibmmq"]
    assert build.base == "${PYTHON_IMAGE}"
    env = " ".join(i.args for i in effective([build], "ENV"))
    for setting in ("MQ_FILE_PATH=/opt/mqm", "genmqpkg_incsdk=1", "genmqpkg_inctls=1"):
        assert setting in env, setting
    (add,) = effective([build], "ADD")
    url = re.sub(r"\$\{(\w+)\}", lambda m: args[m[1]], shlex.split(add.args)[0])
    assert re.fullmatch(r"https://\S+/redist/\d+\.\d+\.\d+\.\d+-IBM-MQC-Redist-LinuxX64\.tar\.gz",
                        url), url
    runs = " ".join(i.args for i in effective([build], "RUN"))
    assert "genmqpkg.sh -b /opt/mqm" in runs
    assert "test -f /opt/mqm/inc/cmqc.h" in runs  # fails the build, not the pip step
    assert runs.index("genmqpkg.sh") < runs.index('/wheels "ibmmq')
    # the runtime target: client libraries and the wheel from that stage only, no compiler
    chain = stage_chain(stages, "gateway-ibmmq")
    copies = [i.args for i in effective(chain, "COPY") if "--from=" in i.args]
    froms = {re.search(r"--from=(\S+)", c)[1] for c in copies}  # type: ignore[index]
    assert froms == {"build", "build-ibmmq"}, froms
    assert any(c.endswith("/mqm-runtime /opt/mqm") for c in copies), copies
    final_runs = " ".join(i.args for i in effective(chain, "RUN"))
    assert "gcc" not in final_runs and "apt-get install" not in final_runs
    env = " ".join(i.args for i in effective(chain, "ENV"))
    assert "LD_LIBRARY_PATH=/opt/mqm/lib64" in env


def test_gateway_dockerfile_basics() -> None:
    stages = parse_dockerfile(ROOT / "Dockerfile")
    for target in ("gateway", "gateway-ibmmq"):
        chain = stage_chain(stages, target)
        assert chain[0].base.startswith("${PYTHON_IMAGE}"), chain[0].base
        health = effective(chain, "HEALTHCHECK")
        assert len(health) == 1 and "/healthz" in health[0].args, target
        assert "curl" not in health[0].args and "wget" not in health[0].args
        probe = health[0].args[health[0].args.index("CMD") + 3:].strip()
        assert exec_form(probe)[0] == "python"
        assert re.search(r"127\.0\.0\.1:9464/healthz", health[0].args)
        assert exec_form(effective(chain, "ENTRYPOINT")[-1].args) == ["mqgw"]
        cmd = exec_form(effective(chain, "CMD")[-1].args)
        assert cmd == ["run", "--config", GATEWAY_CONFIG_IN_CONTAINER]
        parsed = build_parser().parse_args(cmd)  # real options, not invented ones
        assert parsed.command == "run" and str(parsed.config) == GATEWAY_CONFIG_IN_CONTAINER
        volumes = [v for i in effective(chain, "VOLUME") for v in exec_form(i.args)]
        assert volumes == ["/var/lib/mqgw"]
        env = " ".join(i.args for i in effective(chain, "ENV"))
        assert "MQGW_DATA_DIR=/var/lib/mqgw" in env
        assert [i.args for i in effective(chain, "EXPOSE")] == ["9464"]
    build = stage_chain(stages, "build")
    runs = " ".join(i.args for i in effective(build, "RUN"))
    assert "pip wheel" in runs and "[dev" not in runs  # the project, no dev extras


def test_spark_dockerfile_matches_the_project_pins() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (pin,) = pyproject["project"]["optional-dependencies"]["spark"]
    version = pin.removeprefix("pyspark==")
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), pin
    (stage,) = parse_dockerfile(ROOT / "Dockerfile.spark")
    assert stage.base == "${PYTHON_IMAGE}"
    text = (ROOT / "Dockerfile.spark").read_text(encoding="utf-8")
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in text
    assert f"ARG PYSPARK_VERSION={version}" in text
    entry = exec_form(effective([stage], "ENTRYPOINT")[-1].args)
    assert "spark-sql-kafka-0-10_2.13:${PYSPARK_VERSION}" in entry[2]
    assert "/opt/mqgw/analytics/__main__.py" in entry[2]
    assert any(i.args == "analytics /opt/mqgw/analytics" for i in effective([stage], "COPY"))
    env = " ".join(i.args for i in effective([stage], "ENV"))
    assert "PYTHONPATH=/opt/mqgw" in env


# ---------------------------------------------------------------------------------------
# Gateway configs and command lines
# ---------------------------------------------------------------------------------------

GATEWAY_SERVICES = ("gateway", "gateway-ibmmq")


def mounted_config(service: Mapping[str, Any]) -> Path:
    cmd = service["command"]
    args = build_parser().parse_args(cmd)
    assert args.command == "run" and not args.check
    target = str(args.config)
    (source,) = [m.source for m in mounts(service) if m.target == target]
    return host_path(source)


def check_config(
    service_name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> tuple[Path, str]:
    """``mqgw run --config <mounted file> --check`` with the service's environment."""
    service = services()[service_name]
    config = mounted_config(service)
    env = dict(service.get("environment", {}))
    assert env.get("MQGW_DATA_DIR") == "/var/lib/mqgw"
    env["MQGW_DATA_DIR"] = str(tmp_path / "data")  # the volume; writable here
    for name in ("MQGW_KAFKA_BOOTSTRAP", "MQGW_MQTT_HOST", "MQGW_MQTT_PORT",
                 "MQ_HOST", "MQ_PORT", "MQ_CHANNEL", "MQ_QMGR", "MQ_USER", "MQ_APP_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))
    rc = mqgw_main(["run", "--config", str(config), "--check"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "configuration OK" in out
    assert not (tmp_path / "data").exists()  # --check writes nothing
    # everything the gateway writes is on the data volume (the config's directory is the
    # read-only /etc/mqgw in the container), including stores no route opens yet
    data = str(tmp_path / "data")
    writes = [line for line in out.splitlines() if line.strip().startswith("writes:")]
    assert writes, out
    for line in writes:
        for path in line.split(":", 1)[1].replace(",", " ").split():
            assert path.startswith(data), (service_name, line)
    stores = re.findall(r"^\s*store: (\S+)$", out, flags=re.M)
    assert len(stores) >= 2, out  # the broker's and request/reply's
    for store in stores:
        assert store.startswith(data), (service_name, store)
    return config, out


def test_gateway_config_passes_check(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, out = check_config("gateway", monkeypatch, tmp_path, capsys)
    assert config == ROOT / "deploy/compose/gateway.yaml"
    assert "queue manager: embedded QM1" in out
    assert "plugin instance kafka: kafka -> kafka:19092" in out
    assert "plugin instance mqtt: mqtt -> mosquitto:1883" in out
    assert f"writes: {tmp_path / 'data'}" in out


def test_gateway_ibmmq_config_passes_check(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, out = check_config("gateway-ibmmq", monkeypatch, tmp_path, capsys)
    assert config == ROOT / "deploy/compose/gateway-ibmmq.yaml"
    assert "queue manager: ibmmq QM1" in out
    assert "plugin instance kafka: kafka -> kafka:19092" in out
    assert "change-me" not in out  # the password is shown by its source only


def test_the_two_gateways_write_distinct_topics() -> None:
    """With the ``ibmmq`` profile both gateways run against the same Kafka and Mosquitto:
    their Kafka topics (and the compacted retained topics) and MQTT prefixes differ, so two
    queue managers' publications and retained states never mix."""
    from plugins.kafka import KafkaPluginConfig
    from plugins.mqtt.config import MqttConfig

    kafka_topics, retained_topics, prefixes = [], [], []
    for config in ("gateway.yaml", "gateway-ibmmq.yaml"):
        data = yaml.safe_load((ROOT / "deploy/compose" / config).read_text(encoding="utf-8"))
        plugins = {p["plugin"]: p["config"] for p in data["plugins"]}
        kafka = KafkaPluginConfig.model_validate(
            {k: v for k, v in plugins["kafka"].items() if k != "bootstrap_servers"})
        names = [kafka.outbound.topic_template.replace("{stream}", s["name"])
                 for s in data["broker"]["streams"]]
        kafka_topics.append(set(names))
        retained = kafka.outbound.retained_topic_template
        retained_topics.append({retained.replace("{stream}", s["name"])
                                for s in data["broker"]["streams"]})
        prefixes.append(MqttConfig.model_validate(
            {k: v for k, v in plugins["mqtt"].items() if k not in ("host", "port")}
        ).outbound.prefix)
    assert kafka_topics[0] == {"mqgw.STOCK.STREAM", "mqgw.BULLETIN.STREAM"}  # what spark reads
    assert not kafka_topics[0] & kafka_topics[1], kafka_topics
    assert not retained_topics[0] & retained_topics[1], retained_topics
    assert prefixes[0] != prefixes[1] and not prefixes[1].startswith(prefixes[0] + "/")


def test_the_same_configs_with_their_own_defaults(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without compose's environment the files' own ${VAR:-default}s give the same
    endpoints, so `mqgw run --check` on them outside compose says what compose runs."""
    for name in ("MQGW_KAFKA_BOOTSTRAP", "MQGW_MQTT_HOST", "MQGW_MQTT_PORT",
                 "MQ_HOST", "MQ_PORT", "MQ_CHANNEL", "MQ_QMGR", "MQ_USER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MQGW_DATA_DIR", str(tmp_path))
    for service_name in GATEWAY_SERVICES:
        service = services()[service_name]
        rc = mqgw_main(["run", "--config", str(mounted_config(service)), "--check"])
        out, err = capsys.readouterr()
        assert rc == 0, err
        for key, value in service["environment"].items():
            if key in ("MQGW_KAFKA_BOOTSTRAP", "MQ_HOST"):
                assert value in out, (service_name, key, value)
    text = (ROOT / "deploy/compose/gateway.yaml").read_text(encoding="utf-8")
    assert "${MQGW_DATA_DIR:-/var/lib/mqgw}/qm" in text  # the Dockerfile's VOLUME


def test_spark_job_command_parses_and_its_module_exists() -> None:
    from analytics.cli import register

    svc = services()["spark"]
    command = svc["command"]
    job = command[0]
    assert job in JOB_NAMES
    assert (ROOT / "analytics" / "jobs" / f"{job}.py").is_file()
    assert (ROOT / "analytics" / "__main__.py").is_file()
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["analytics", *command])  # real options only
    assert args.job == job and args.bootstrap == "kafka:19092"
    assert args.out.startswith("/var/lib/mqgw-analytics/")
    (out_mount,) = [m for m in mounts(svc) if m.target == "/var/lib/mqgw-analytics"]
    assert not out_mount.bind
    # every job the variable may name exists as a module
    raw = raw_compose()["services"]["spark"]["command"][0]
    assert raw == "${MQGW_SPARK_JOB:-traffic}"
    for name in JOB_NAMES:
        assert (ROOT / "analytics" / "jobs" / f"{name}.py").is_file()


# ---------------------------------------------------------------------------------------
# Ports and addresses
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Published:
    host_ip: str
    host_port: int
    container_port: int


def published(service: Mapping[str, Any]) -> list[Published]:
    out = []
    for p in service.get("ports", []):
        if isinstance(p, dict):
            out.append(Published(p.get("host_ip", ""), int(p["published"]), int(p["target"])))
            continue
        spec = str(p).split("/")[0]
        parts = spec.split(":")
        assert len(parts) == 3, f"{p}: give host_ip:host_port:container_port"
        out.append(Published(parts[0], int(parts[1]), int(parts[2])))
    return out


def kafka_listeners(service: Mapping[str, Any]) -> tuple[dict[str, int], dict[str, str]]:
    env = service["environment"]
    listen = {}
    for item in env["KAFKA_LISTENERS"].split(","):
        name, _, addr = item.partition("://")
        listen[name] = int(addr.rsplit(":", 1)[1])
    advertised = {}
    for item in env["KAFKA_ADVERTISED_LISTENERS"].split(","):
        name, _, addr = item.partition("://")
        advertised[name] = addr
    return listen, advertised


def mosquitto_listeners() -> list[int]:
    (mount,) = [m for m in mounts(services()["mosquitto"]) if m.target.endswith(".conf")]
    assert mount.target == "/mosquitto/config/mosquitto.conf"
    ports = []
    for line in host_path(mount.source).read_text(encoding="utf-8").splitlines():
        words = line.split()
        if words and words[0] == "listener":
            ports.append(int(words[1]))
            assert len(words) == 2 or words[2] == "0.0.0.0", line  # the compose network
    return ports


def gateway_metrics_port(service_name: str, tmp: Path) -> int:
    """``metrics.port`` as the project's loader reads the mounted config."""
    from gateway.runtime.config import load_config
    from gateway.runtime.registry import PluginRegistry

    service = services()[service_name]
    with pytest.MonkeyPatch.context() as mp:
        for key, value in service.get("environment", {}).items():
            mp.setenv(key, str(value))
        mp.setenv("MQGW_DATA_DIR", str(tmp))
        loaded = load_config(mounted_config(service), PluginRegistry.from_entry_points())
    metrics = loaded.gateway.metrics
    assert metrics.enabled and metrics.host == "0.0.0.0"  # reachable via the published port
    return int(metrics.port)


def test_published_ports_are_loopback_and_match_what_services_listen_on(tmp_path: Path) -> None:
    svc = services()
    seen_host_ports: dict[int, str] = {}
    for name, s in svc.items():
        for p in published(s):
            assert p.host_ip == "127.0.0.1", f"{name}: {p} is not bound to 127.0.0.1"
            assert p.host_port not in seen_host_ports, (name, seen_host_ports[p.host_port])
            seen_host_ports[p.host_port] = name
    for name in GATEWAY_SERVICES:
        port = gateway_metrics_port(name, tmp_path / name)
        assert [p.container_port for p in published(svc[name])] == [port]
        assert f"127.0.0.1:{port}/healthz" in " ".join(svc[name]["healthcheck"]["test"])
    # Kafka: the published port is the HOST listener, advertised as the host's address
    listen, advertised = kafka_listeners(svc["kafka"])
    (kp,) = published(svc["kafka"])
    host_listeners = [n for n, a in advertised.items() if a == f"127.0.0.1:{kp.host_port}"]
    assert len(host_listeners) == 1
    assert listen[host_listeners[0]] == kp.container_port
    assert svc["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    controller = svc["kafka"]["environment"]["KAFKA_CONTROLLER_LISTENER_NAMES"]
    assert controller in listen and controller not in advertised
    assert svc["kafka"]["environment"]["KAFKA_CONTROLLER_QUORUM_VOTERS"] == (
        f"1@kafka:{listen[controller]}"
    )
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", svc["kafka"]["environment"]["CLUSTER_ID"])
    # Mosquitto
    listeners = mosquitto_listeners()
    assert [p.container_port for p in published(svc["mosquitto"])] == listeners
    health = svc["mosquitto"]["healthcheck"]["test"]
    assert health[health.index("-p") + 1] == str(listeners[0])
    # IBM MQ: the gateway-ibmmq's port is the one published
    (mq_listener, _console) = published(svc["ibmmq"])
    assert svc["gateway-ibmmq"]["environment"]["MQ_PORT"] == str(mq_listener.container_port)
    assert svc["gateway-ibmmq"]["environment"]["MQ_HOST"] == "ibmmq"


def test_addresses_between_services_name_a_listener() -> None:
    svc = services()
    listen, advertised = kafka_listeners(svc["kafka"])
    internal = [n for n, a in advertised.items() if a.startswith("kafka:")]
    assert len(internal) == 1
    internal_addr = advertised[internal[0]]
    assert int(internal_addr.rsplit(":", 1)[1]) == listen[internal[0]]
    assert svc["kafka"]["environment"]["KAFKA_INTER_BROKER_LISTENER_NAME"] == internal[0]
    health = svc["kafka"]["healthcheck"]["test"]
    assert health[health.index("--bootstrap-server") + 1] == internal_addr
    mqtt_port = mosquitto_listeners()[0]
    for name in GATEWAY_SERVICES:
        env = svc[name]["environment"]
        assert env["MQGW_KAFKA_BOOTSTRAP"] == internal_addr
        assert env["MQGW_MQTT_HOST"] == "mosquitto" and env["MQGW_MQTT_PORT"] == str(mqtt_port)
    command = svc["spark"]["command"]
    assert command[command.index("--bootstrap") + 1] == internal_addr


# ---------------------------------------------------------------------------------------
# Variables and secrets
# ---------------------------------------------------------------------------------------


def test_every_variable_has_a_default_or_is_documented() -> None:
    uses = compose().uses
    assert uses, "compose.yaml uses no variables?"
    readme = DOCKER_DOC.read_text(encoding="utf-8")
    header = COMPOSE.read_text(encoding="utf-8").split("services:", 1)[0]
    for use in uses:
        if use.default is None:
            assert f"`{use.name}`" in readme, f"{use.where}: ${{{use.name}}} has no default"
        # documented where a user looks first either way: the file's header
        assert use.name in header, f"{use.name} is not listed in compose.yaml's header"
    for name in {u.name for u in uses}:
        assert f"`{name}`" in readme, f"docs/docker.md does not document {name}"


def test_no_literal_secrets_in_compose() -> None:
    raw = raw_compose()
    for name, s in raw["services"].items():
        env = s.get("environment", {})
        items = env.items() if isinstance(env, dict) else (e.split("=", 1) for e in env)
        for key, value in items:
            if _SECRETISH.search(key):
                assert re.fullmatch(r"\$\{[A-Z_]+:-change-me[a-z-]*\}", str(value)), (
                    f"{name}.{key}: a secret must come from the environment, with a "
                    f"change-me placeholder default, not {value!r}"
                )
    for config in ("gateway.yaml", "gateway-ibmmq.yaml"):
        data = yaml.safe_load((ROOT / "deploy/compose" / config).read_text(encoding="utf-8"))
        qm = data["queue_manager"]
        if "password" in qm:
            assert qm["password"] == {"env": "MQ_APP_PASSWORD"}, config


def test_the_image_gets_every_file_of_the_packages() -> None:
    """The Dockerfile builds a wheel from a context without .git, so setuptools packs
    only ``.py`` files and ``[tool.setuptools.package-data]``: a template, page or data
    file under the packages must be declared there, or the image (and any wheel) lacks it."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    setuptools_cfg = pyproject.get("tool", {}).get("setuptools", {})
    assert setuptools_cfg["packages"]["find"]["include"] == ["gateway*", "plugins*", "analytics*"]
    package_data: dict[str, list[str]] = setuptools_cfg.get("package-data", {})
    missing = []
    for top in ("gateway", "plugins", "analytics"):
        for path in (ROOT / top).rglob("*"):
            if not path.is_file() or "__pycache__" in path.parts or path.suffix in (".py", ".pyc"):
                continue
            rel = path.relative_to(ROOT)
            package = ".".join(rel.parent.parts)
            covered = any(
                (pkg == "*" or package == pkg or package.startswith(pkg + "."))
                and any(
                    fnmatch.fnmatch(str(rel.relative_to(Path(*pkg.split(".")))), pattern)
                    if pkg != "*" else fnmatch.fnmatch(path.name, pattern)
                    for pattern in patterns
                )
                for pkg, patterns in package_data.items()
            )
            if not covered:
                missing.append(str(rel))
    assert missing == [], "declare these in [tool.setuptools.package-data]: " + ", ".join(missing)
