"""The Prometheus alerting rules (deploy/prometheus/mqgw-alerts.yml) and the Grafana
dashboard (deploy/grafana/mqgw-dashboard.json) name only metrics a running gateway
exports: a real GatewayApp (memory plugin, a request/reply route, the embedded queue
manager) is started, its ``/metrics`` is scraped over HTTP, and every metric name in
every PromQL expression of both files must be one of the exported series (a family's
name plus the suffixes Prometheus gives its type: ``_total``, ``_bucket``, ``_sum``,
``_count``, ``_created``). A negative self-test shows that a made-up name is caught."""

from __future__ import annotations

import asyncio
import copy
import http.client
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gateway.runtime.app import GatewayApp
from gateway.runtime.config import parse_config
from gateway.runtime.registry import PluginRegistry
from plugins.memory import reset_buses

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "mqgw-alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "mqgw-dashboard.json"

#: Series Prometheus itself adds to every scraped target (not the gateway's).
PROMETHEUS_SYNTHESISED = frozenset({"up"})

SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "info": ("_info",),
}

PROMQL_FUNCTIONS = frozenset({
    "abs", "absent", "absent_over_time", "avg_over_time", "ceil", "changes", "clamp",
    "clamp_max", "clamp_min", "count_over_time", "delta", "deriv", "exp", "floor",
    "histogram_quantile", "holt_winters", "idelta", "increase", "irate", "label_join",
    "label_replace", "last_over_time", "ln", "log2", "log10", "max_over_time",
    "min_over_time", "predict_linear", "present_over_time", "quantile_over_time", "rate",
    "resets", "round", "scalar", "sgn", "sort", "sort_desc", "sqrt", "stddev_over_time",
    "stdvar_over_time", "sum_over_time", "time", "timestamp", "vector",
})
PROMQL_AGGREGATIONS = frozenset({
    "sum", "avg", "min", "max", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group",
})
PROMQL_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "by", "without", "on",
                             "ignoring", "group_left", "group_right", "inf", "nan"})
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_LABEL_VALUES = re.compile(r"\blabel_values\(\s*([^,()]+?)\s*,\s*[A-Za-z_]\w*\s*\)")
_IDENT = re.compile(r"(?<![\w:.])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression (or a Grafana label_values query) selects.

    Strings, label matchers, ranges, Grafana variables and the label lists of
    by/without/on/ignoring/group_* are removed first; what remains is functions,
    aggregations, keywords, numbers and metric names. An unknown function is an error."""
    text = _LABEL_VALUES.sub(r"\1", expr)
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', text)
    text = re.sub(r"\$\{[^}]*\}|\$\w+", "", text)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = _LABEL_LIST.sub("", text)
    names: set[str] = set()
    for m in _IDENT.finditer(text):
        word, call = m.group(1), m.group(2)
        if word.lower() in PROMQL_KEYWORDS or word in PROMQL_AGGREGATIONS:
            continue
        if call:
            if word not in PROMQL_FUNCTIONS:
                raise ValueError(f"unknown PromQL function {word!r} in {expr!r}")
            continue
        names.add(word)
    return names


def exported_series(exposition: str) -> set[str]:
    """Every series name a Prometheus server stores from this exposition."""
    names: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        for suffix in SUFFIXES.get(family.type, ("",)):
            names.add(family.name + suffix)
        names.update(s.name for s in family.samples)
    return names


def unknown_metrics(exprs: Iterable[str], exported: set[str]) -> dict[str, set[str]]:
    """Per expression, the metric names it uses that nothing exports."""
    out: dict[str, set[str]] = {}
    for expr in exprs:
        missing = metric_names(expr) - exported - PROMETHEUS_SYNTHESISED
        if missing:
            out[expr] = missing
    return out


def load_rules() -> dict[str, Any]:
    data = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def load_dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def rules_of(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [rule for group in data["groups"] for rule in group["rules"]]


def rule_exprs(data: dict[str, Any]) -> list[str]:
    return [str(rule["expr"]) for rule in rules_of(data)]


def _walk(node: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield k, v
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def dashboard_exprs(data: dict[str, Any]) -> list[str]:
    """Panel targets' ``expr`` and the query variables' ``label_values(...)`` queries."""
    exprs = [v for k, v in _walk(data.get("panels", [])) if k == "expr" and isinstance(v, str)]
    for var in data["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]
            exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


def _gateway_config(tmp_path: Path) -> dict[str, Any]:
    return {
        "queue_manager": {"name": "GWOBS", "data_dir": str(tmp_path / "qm")},
        "broker": {"wait_ms": 50},
        "metrics": {"host": "127.0.0.1", "port": 0},
        "plugins": [{"name": "mem", "plugin": "memory", "config": {"bus": "obs"}}],
        "request_reply": {
            "requests": [{"name": "local", "plugin": "mem", "source": "ask",
                          "destination": "OBS.SERVICE@GWOBS"}],
        },
    }


async def _scrape(tmp_path: Path) -> str:
    reset_buses()
    registry = PluginRegistry.from_entry_points()
    app = GatewayApp(parse_config(_gateway_config(tmp_path), registry, base_dir=tmp_path),
                     registry)
    await app.start()
    try:
        async with asyncio.timeout(10):
            while not app.health()[0]:
                await asyncio.sleep(0.02)
        assert app.http is not None
        port = app.http.port

        def get() -> tuple[int, bytes]:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            try:
                conn.request("GET", "/metrics")
                resp = conn.getresponse()
                return resp.status, resp.read()
            finally:
                conn.close()

        status, body = await asyncio.to_thread(get)
    finally:
        await app.shutdown()
    assert status == 200
    return body.decode()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """The series a Prometheus server gets from a running gateway's /metrics."""
    text = asyncio.run(_scrape(tmp_path_factory.mktemp("obs")))
    names = exported_series(text)
    # the scrape is of the whole gateway: the request/reply and authorisation
    # collectors, the stream gauges and the latency histogram are all there
    for name in ("mqgw_request_reply_total", "mqgw_request_reply_open",
                 "mqgw_authorisation_refused_total", "mqgw_mq_connect_failures_total",
                 "mqgw_stream_queue_missing", "mqgw_end_to_end_latency_seconds_bucket",
                 "mqgw_plugin_up", "mqgw_queue_depth"):
        assert name in names, name
    return names


def test_alert_rules_are_well_formed() -> None:
    data = load_rules()
    assert set(data) == {"groups"}
    group_names = [g["name"] for g in data["groups"]]
    assert len(group_names) == len(set(group_names))
    rules = rules_of(data)
    assert len(rules) >= 10
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names)), "alert names must be unique"
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert re.fullmatch(r"Mqgw[A-Z]\w+", rule["alert"]), rule["alert"]
        assert str(rule["expr"]).strip(), rule["alert"]
        assert "for" in rule and re.fullmatch(r"\d+[smhd]", str(rule["for"])), rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        annotations = rule["annotations"]
        assert str(annotations["summary"]).strip(), rule["alert"]
        assert "docs/" in annotations["description"], rule["alert"]
        for doc in re.findall(r"docs/[\w.-]+\.md", annotations["description"]):
            assert (ROOT / doc).is_file(), doc


def test_alert_rules_cover_the_operational_failures() -> None:
    used = {n for e in rule_exprs(load_rules()) for n in metric_names(e)}
    for name in ("up", "mqgw_plugin_up", "mqgw_sink_down", "mqgw_plugin_stat",
                 "mqgw_dead_lettered_total", "mqgw_sink_dead_lettered_total",
                 "mqgw_queue_depth", "mqgw_stream_unserviced_depth",
                 "mqgw_end_to_end_latency_seconds_bucket", "mqgw_request_reply_total",
                 "mqgw_authorisation_refused_total", "mqgw_mq_connect_failures_total"):
        assert name in used, name


def test_dashboard_is_well_formed() -> None:
    data = load_dashboard()
    variables = {v["name"]: v for v in data["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    panels = [p for _, v in _walk(data["panels"]) if isinstance(v, list)
              for p in v if isinstance(p, dict) and "gridPos" in p] + data["panels"]
    ids = [p["id"] for p in data["panels"]]
    assert len(ids) == len(set(ids))
    graphs = [p for p in panels if p["type"] != "row"]
    assert len(graphs) >= 15
    for panel in graphs:
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
            assert target["expr"].strip(), panel["title"]
    for var in variables.values():
        if var["type"] == "query":
            assert var["datasource"]["uid"] == "${DS_PROMETHEUS}"


def test_every_metric_in_the_alert_rules_is_exported(exported: set[str]) -> None:
    exprs = rule_exprs(load_rules())
    for expr in exprs:
        assert metric_names(expr), f"no metric found in {expr!r}"
    assert unknown_metrics(exprs, exported) == {}


def test_every_metric_in_the_dashboard_is_exported(exported: set[str]) -> None:
    exprs = dashboard_exprs(load_dashboard())
    for expr in exprs:
        assert metric_names(expr), f"no metric found in {expr!r}"
    assert unknown_metrics(exprs, exported) == {}


def test_the_dashboard_shows_every_family_the_gateway_exports(exported: set[str]) -> None:
    used = {n for e in dashboard_exprs(load_dashboard()) for n in metric_names(e)}
    families = {n for n in exported if n.startswith("mqgw_") and not n.endswith("_created")}
    shown = {f for f in families
             if f in used or any(f.removesuffix(s) + t in used
                                 for s in ("_bucket", "_sum", "_count")
                                 for t in ("_bucket", "_sum", "_count"))}
    assert families - shown == set()


def test_a_made_up_metric_name_is_caught(exported: set[str]) -> None:
    """Negative self-test: the check fails for a name the gateway does not export, for a
    suffix its type does not have, and for a misspelt function."""
    rules = copy.deepcopy(load_rules())
    rules["groups"][0]["rules"].append({
        "alert": "MqgwFake", "expr": 'rate(mqgw_no_such_metric_total{plugin="x"}[5m]) > 0',
        "for": "1m", "annotations": {"summary": "fake"},
    })
    assert unknown_metrics(rule_exprs(rules), exported) == {
        'rate(mqgw_no_such_metric_total{plugin="x"}[5m]) > 0': {"mqgw_no_such_metric_total"}
    }
    dashboard = copy.deepcopy(load_dashboard())
    dashboard["panels"][1]["targets"][0]["expr"] = (
        'sum by (plugin) (rate(mqgw_messages_out{instance=~"$instance"}[$__rate_interval]))'
    )
    assert set().union(*unknown_metrics(dashboard_exprs(dashboard), exported).values()) == {
        "mqgw_messages_out"  # a counter is stored as mqgw_messages_out_total
    }
    assert unknown_metrics(["mqgw_queue_depth_total > 0"], exported) == {
        "mqgw_queue_depth_total > 0": {"mqgw_queue_depth_total"}  # a gauge has no _total
    }
    with pytest.raises(ValueError, match="rat"):
        metric_names("rat(mqgw_messages_out_total[5m])")


def test_metric_names_are_extracted_from_promql() -> None:
    assert metric_names(
        'histogram_quantile(0.99, sum by (instance, plugin, le) '
        '(rate(mqgw_end_to_end_latency_seconds_bucket{plugin=~"a|b"}[10m]))) > 30'
    ) == {"mqgw_end_to_end_latency_seconds_bucket"}
    assert metric_names(
        'sum by (route) (rate(a_total{event="x"}[5m])) > 0 unless on (route) '
        'sum without (event) (b_total offset 1h) > bool 1e3'
    ) == {"a_total", "b_total"}
    assert metric_names('label_values(mqgw_plugin_up{instance=~"$instance"}, plugin)') == {
        "mqgw_plugin_up"
    }
    assert metric_names("up{job=\"mqgw\"} == 0 or absent(x:recorded:rate5m)") == {
        "up", "x:recorded:rate5m"
    }
    assert metric_names("rate(m_total[$__rate_interval]) * ${factor}") == {"m_total"}
