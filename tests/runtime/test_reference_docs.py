"""The generated references of docs/reference/ (gateway/runtime/reference_docs.py) cannot
drift: the committed pages are what the code generates now, and they cover every
command, option and exit status, every configuration key, every metric family a gateway
serves and every command's ``--json`` output, whose fields are what the commands print.
``--help`` carries no reST markup."""

from __future__ import annotations

import argparse
import html
import json
import re
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, TypeAdapter

from gateway.runtime import reference_docs
from gateway.runtime.cli import build_parser, main
from gateway.runtime.exit_codes import exit_codes_of
from gateway.runtime.metrics import GatewayMetrics
from gateway.runtime.plugin_host import PluginHost
from gateway.runtime.pubsub_service import BrokerService

ROOT = Path(__file__).resolve().parents[2]
PAGES = ROOT / reference_docs.REFERENCE_DIR


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    return reference_docs.render_all()


def _sections(text: str) -> dict[str, str]:
    """Heading text (unescaped) -> the section's text up to the next heading of its level
    or above."""
    out: dict[str, str] = {}
    parts = re.split(r"^(#{2,3}) (.+)$", text, flags=re.M)
    for i in range(1, len(parts), 3):
        out[html.unescape(re.sub(r"\\(.)", r"\1", parts[i + 1]))] = parts[i + 2]
    return out


def test_the_committed_pages_are_what_the_code_generates(generated: dict[str, str]) -> None:
    stale = []
    for name, text in generated.items():
        path = PAGES / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            stale.append(name)
    if stale:
        diffs = "".join(reference_docs.check(PAGES))
        pytest.fail(
            f"docs/reference/{', '.join(stale)} differ from the code: run "
            f"`{reference_docs.GENERATOR}` and commit the result\n{diffs[:6000]}"
        )


def test_the_pages_do_not_depend_on_the_machine(
    generated: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Environment defaults (the analytics' bootstrap, the devstack's and the embedded
    queue managers' directories), the terminal's width and the directory it runs in
    change nothing."""
    for name, value in {
        "MQGW_KAFKA_BOOTSTRAP": "broker.example:9999",
        "MQGW_DEVSTACK_DIR": str(tmp_path / "stack"),
        "MQGW_DATA_DIR": str(tmp_path / "qmgrs"),
        "MQGW_SPARK_MASTER": "spark://elsewhere:7077",
        "COLUMNS": "43",
        "HOME": str(tmp_path),
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    again = reference_docs.render_all()
    for name, text in generated.items():
        assert again[name] == text, f"{name} changes with the machine's environment"
        assert str(tmp_path) not in text and str(ROOT) not in text


def test_every_command_option_and_exit_status_is_in_the_cli_reference(
    generated: dict[str, str],
) -> None:
    sections = _sections(generated["cli.md"])
    commands = reference_docs.walk_commands()
    names = {c.name for c in commands}
    assert {"mqgw run", "mqgw network check", "mqgw qm dlq", "mqgw devstack status"} <= names
    for c in commands:
        assert c.name in sections, f"{c.name} has no section in cli.md"
        text = sections[c.name]
        for action in c.parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            if action.help == argparse.SUPPRESS:
                continue  # not shown by --help either
            if action.dest == "verbose" and action.default is argparse.SUPPRESS:
                continue  # the -v of every command: the page's introduction says so
            for word in action.option_strings or [reference_docs._invocation(action)]:
                assert f"`{word}" in text or f", {word}" in text, (
                    f"{c.name}: {word} is not in its section of cli.md")
        is_leaf = not any(True for _ in reference_docs._children(c.parser))
        codes = exit_codes_of(c.parser)
        if is_leaf:
            assert codes, f"{c.name} states no exit status (set_defaults(exit_codes=...))"
            assert 0 in dict(codes), f"{c.name}: no exit status 0"
        for code, _ in codes:
            assert f"\n| {code} | " in text, f"{c.name}: exit status {code} not in cli.md"


def test_help_texts_carry_no_markup() -> None:
    """``--help`` is read in a terminal: no reST double backticks, roles or literal-block
    markers (docstrings stay for developers, descriptions are plain)."""
    markup = re.compile(r"``|:[a-z]+:`|::\n")
    for c in reference_docs.walk_commands(build_parser()):
        text = c.parser.format_help()
        found = markup.search(text)
        assert found is None, f"{c.name} --help shows {found.group()!r}:\n{text}"


def test_help_shows_the_exit_statuses(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["subscriptions", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "Exit status: 0 listed (with --suspended: none is suspended); 1 with --suspended" in out
    with pytest.raises(SystemExit):
        main(["network", "check", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "Exit status: 0 all well; 1 a problem" in out


# ---------------------------------------------------------------- configuration -----


def _models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _reachable(root: type[BaseModel]) -> set[type[BaseModel]]:
    seen: set[type[BaseModel]] = set()
    todo = [root]
    while todo:
        model = todo.pop()
        if model not in seen:
            seen.add(model)
            for field in model.model_fields.values():
                todo += _models(field.annotation)
    return seen


def test_every_configuration_key_is_in_the_reference(generated: dict[str, str]) -> None:
    """Walked here on its own: every model reachable from gateway.yaml and from each
    shipped plugin's config model has a section listing each of its keys, with a
    description."""
    from gateway.runtime.config import GatewayConfig
    from gateway.runtime.registry import PluginRegistry

    registry = PluginRegistry.from_entry_points()
    wanted = _reachable(GatewayConfig)
    for name in ("kafka", "mqtt", "memory"):
        wanted |= _reachable(registry.get(name).config_model)
    by_model = {s.model: s.heading for s in reference_docs.config_sections()}
    assert set(by_model) == wanted
    sections = _sections(generated["configuration.md"])
    assert len(wanted) > 30
    for model in wanted:
        text = sections[by_model[model]]
        for key, field in model.model_fields.items():
            assert f"\n| `{key}` | " in text, f"{by_model[model]}: {key} not in the reference"
            assert field.description, f"{by_model[model]}: {key} has no description"


def test_the_configuration_reference_renders_types_defaults_and_descriptions(
    generated: dict[str, str],
) -> None:
    sections = _sections(generated["configuration.md"])
    broker = sections["broker"]
    assert "| `batch_size` | integer (≥ 1, ≤ 5000) | `256` |" in broker
    assert "| `store` | path | `data/pubsub.db` | The subscription/retained-publication" in broker
    embedded = sections["queue_manager, type: embedded"]
    assert "| `listener_port` | integer (≥ 0, ≤ 65535) | none | Channel listener" in embedded
    assert "| `name` | string (length 1 to 48) | **required** |" in (
        sections["queue_manager, type: ibmmq"])
    assert "[secret](#secret)" in sections["metrics.auth"]


# ---------------------------------------------------------------- metrics -----------


def test_every_metric_family_of_a_gateway_is_in_the_reference(
    service: BrokerService, host: PluginHost, generated: dict[str, str]
) -> None:
    """A gateway's registry built over a real broker service and plugin host (the shared
    in-process gateway): every family it serves is in metrics.md, with its type."""
    text = GatewayMetrics(service, host, dict).exposition().decode()
    served = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.M))
    assert "mqgw_dead_lettered_total" in served
    assert "mqgw_end_to_end_latency_seconds" in served
    page = generated["metrics.md"]
    for name, kind in served.items():
        series = name if kind != "counter" or name.endswith("_total") else f"{name}_total"
        assert f"| `{series}` | {kind} |" in page, f"{series} ({kind}) not in metrics.md"
    documented = re.findall(r"^\| `(mqgw_\w+)` \| (\w+) \|", page, flags=re.M)
    assert len(documented) == len(reference_docs.metric_families()) >= len(served)
    for family in ("mqgw_neighbour_commands_total", "mqgw_request_reply_total",
                   "mqgw_worker_up", "mqgw_authorisation_refused_total"):
        assert f"| `{family}` |" in page


# ---------------------------------------------------------------- JSON output -------


def test_every_command_with_json_output_is_in_the_reference(generated: dict[str, str]) -> None:
    with_json = {
        c.name for c in reference_docs.walk_commands()
        if any("--json" in a.option_strings for a in c.parser._actions)
    }
    assert with_json == {o.command for o in reference_docs.JSON_OUTPUTS}
    sections = _sections(generated["json-output.md"])
    for o in reference_docs.JSON_OUTPUTS:
        text = sections[f"{o.command} --json"]
        schema = reference_docs.json_schema(o)
        for key in schema["properties"]:
            assert f"\n| `{key}` | " in text, f"{o.command} --json: {key} not documented"
            assert schema["properties"][key].get("description"), f"{o.command}: {key}"


def _fields_of(typed: Any, value: dict[str, Any]) -> None:
    """``value`` has exactly the documented fields and validates against them."""
    TypeAdapter(typed).validate_python(value, strict=False)
    documented = set(TypeAdapter(typed).json_schema()["properties"])
    assert set(value) <= documented, f"undocumented fields {set(value) - documented}"
    required = set(TypeAdapter(typed).json_schema().get("required", ()))
    assert required <= set(value)


def test_neighbours_list_json_prints_the_documented_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gateway.runtime.neighbours.config import NeighbourConfig
    from gateway.runtime.neighbours.state import NeighbourState
    from gateway.runtime.neighbours.status import NeighbourStatus, RefusedProxy

    state = NeighbourState(tmp_path / "neighbours.db")
    try:
        state.request_join(NeighbourConfig(q_mgr="QM2", streams=["S1"]), 1.0)
    finally:
        state.close()
    assert main(["neighbours", "list", "--json", "--data-dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    item = json.loads(lines[0])
    _fields_of(NeighbourStatus, item)
    assert item["q_mgr"] == "QM2" and item["kind"] == "mqpubsub" and item["role"] == "child"
    assert set(TypeAdapter(RefusedProxy).json_schema()["properties"]) == {
        "stream", "topic", "reason", "retry_in"}


def test_subscriptions_json_prints_the_documented_fields_and_destinations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both destination forms the reference describes: QUEUE@QMGR and sink:<instance>."""
    from gateway.pubsub.records import Destination, SubFormat, Subscription
    from gateway.pubsub.sqlite_store import SqliteStore
    from gateway.pubsub.store import UpsertSubscription
    from gateway.pubsub.topics import Scheme
    from gateway.runtime.subscriptions_cli import SubscriptionJson

    store = SqliteStore(tmp_path / "pubsub.db")
    try:
        store.apply([
            UpsertSubscription(Subscription(
                stream="S1", scheme=Scheme.TOPIC, topic="a/#", fmt=SubFormat.RFH2,
                destination=Destination(q_mgr="QM1", queue="SUB.Q"))),
            UpsertSubscription(Subscription(
                stream="S1", scheme=Scheme.CHAR, topic="b*", fmt=SubFormat.SINK,
                destination=Destination(sink="k1"))),
        ])
    finally:
        store.close()
    assert main(["subscriptions", "--json", "--store", str(tmp_path / "pubsub.db")]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    for row in rows:
        _fields_of(SubscriptionJson, row)
    assert {(r["destination"], r["scheme"]) for r in rows} == {
        ("SUB.Q@QM1", "TOPIC"), ("sink:k1", "CHAR")}


def test_streams_and_network_check_json_have_the_documented_fields() -> None:
    from gateway.runtime.network_check.check import NetworkReportJson, check_network
    from gateway.runtime.streams.check import QueueState, StreamCheckJson, build_report

    report = build_report(
        {"S1": ("gateway",), "S2": ("migration QM9",)}, {"S1"},
        {"S1": QueueState(exists=True, depth=2, oldest_put=1.0), "S2": QueueState(False)},
        {"S1": 1}, now=5.0, dead_letter_queue="SYSTEM.DEAD.LETTER.QUEUE",
        migrated_from="QM9", migrated=frozenset({"S2"}),
    )
    assert report.to_json()["migration"] is not None
    _fields_of(StreamCheckJson, {**report.to_json(), "actions": []})
    network = check_network([], [])
    _fields_of(NetworkReportJson, json.loads(json.dumps(network.to_json())))


def test_every_link_of_the_pages_reaches_a_heading(generated: dict[str, str]) -> None:
    """In-page anchors are the slugs MkDocs gives the page's headings (``mkdocs build
    --strict`` with anchor validation fails on the others)."""
    for name, text in generated.items():
        headings = {reference_docs.slug(html.unescape(re.sub(r"\\(.)", r"\1", h)))
                    for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}
        for anchor in re.findall(r"\]\(#([^)]+)\)", text):
            assert anchor in headings, f"{name}: link to #{anchor}, which no heading has"
        for target in re.findall(r"\]\(([^#)][^)]*)\)", text):
            path = (PAGES / target.split("#")[0]).resolve()
            assert path.is_file(), f"{name}: link to {target}, which does not exist"
