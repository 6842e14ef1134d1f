"""Pure parts of analytics: the contract's topic escape, buckets, options, CLI wiring."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from analytics import contract as c
from analytics.jobs.latency import bucket_upper_bound_py
from analytics.runner import offsets_lag
from analytics.source import KafkaInput, SourceConfigError

ROOT = str(Path(__file__).resolve().parents[2])


@pytest.mark.parametrize(
    ("name", "escaped"),
    [
        ("STOCK.STREAM", "STOCK.STREAM"),
        ("A/B_C", "A_2FB_5FC"),
        ("50%", "50_25"),
        ("é", "_C3_A9"),
        ("SYSTEM.BROKER.DEFAULT.STREAM", "SYSTEM.BROKER.DEFAULT.STREAM"),
    ],
)
def test_escape_matches_the_contract_examples(name: str, escaped: str) -> None:
    assert c.escape_name(name) == escaped
    assert c.unescape_name(escaped) == name


def test_escape_round_trips_any_text() -> None:
    text = "IBM/Latest price_é €#+ 1"
    escaped = c.escape_name(text)
    assert set(escaped) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
    assert c.unescape_name(escaped) == text


@pytest.mark.parametrize(("bad", "offset"), [("A_2", 1), ("A_zz", 1), ("A B", 1), ("_C3", 0)])
def test_unescape_rejects_malformed_names(bad: str, offset: int) -> None:
    with pytest.raises(c.TopicNameError) as info:
        c.unescape_name(bad)
    assert info.value.offset == offset
    assert info.value.name == bad


def test_default_topics() -> None:
    assert c.publication_topic("STOCK.STREAM") == "mqgw.STOCK.STREAM"
    assert c.retained_topic("A/B") == "mqgw-retained.A_2FB"


@pytest.mark.parametrize(
    ("latency", "bound"),
    [(-5, 0), (0, 0), (1, 1), (99, 99), (100, 100), (101, 110), (999, 1000), (1000, 1000),
     (1001, 1100), (12345, 13000)],
)
def test_latency_buckets_keep_two_significant_digits(latency: int, bound: int) -> None:
    assert bucket_upper_bound_py(latency) == bound


def test_bucket_width_is_at_most_ten_percent() -> None:
    for v in range(100, 200_000, 7):
        ub = bucket_upper_bound_py(v)
        assert v <= ub <= v * 1.1


def test_lag_from_progress_offsets() -> None:
    src = {"endOffset": '{"t":{"0":5,"1":7}}', "latestOffset": '{"t":{"0":9,"1":7}}'}
    assert offsets_lag(src) == 4
    assert offsets_lag({"endOffset": None, "latestOffset": "{}"}) is None


def test_kafka_input_validates() -> None:
    with pytest.raises(SourceConfigError):
        KafkaInput(bootstrap="")
    with pytest.raises(SourceConfigError):
        KafkaInput(bootstrap="h:1", topics=("a",), pattern="b")
    with pytest.raises(SourceConfigError):
        KafkaInput(bootstrap="h:1", topics=("bad topic",)).source_options()
    opts = KafkaInput(bootstrap="h:1", topics=("mqgw.A", "mqgw-deadletter")).source_options()
    assert opts["subscribePattern"] == r"mqgw\.A|mqgw-deadletter"
    assert opts["includeHeaders"] == "true"
    assert opts["startingOffsets"] == "earliest"


def test_cli_registration_does_not_import_pyspark() -> None:
    code = (
        "import sys, argparse\n"
        "from analytics.cli import register\n"
        "p = argparse.ArgumentParser(); s = p.add_subparsers()\n"
        "register(s)\n"
        "a = p.parse_args(['analytics', 'ohlc', '--out', '/x', '--once'])\n"
        "assert a.once and a.bars_topic == 'mqgw-analytics.ohlc', a\n"
        "print('pyspark' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


def test_cli_defaults_per_job() -> None:
    from analytics.cli import job_options, register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["analytics", "lastvalue", "--out", "/tmp/x"])
    options, checkpoint = job_options(args)
    assert options.source.pattern == r"mqgw-retained\..*"
    assert options.source.fail_on_data_loss is False
    assert checkpoint == "/tmp/x/_checkpoints/lastvalue"
    args = parser.parse_args(["analytics", "ohlc", "--out", "/o", "--topics", "a,b"])
    options, _ = job_options(args)
    assert options.source.topics == ("a", "b")
    assert options.extra["stream"] == "STOCK.STREAM"
