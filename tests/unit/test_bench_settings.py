"""pyserve.bench.settings: the command line's values, load levels and how they are shared between client
processes."""

from __future__ import annotations

import pytest

from pyserve.bench.settings import (
    BenchSettings,
    LoadLevel,
    levels_of,
    parse_counts,
    parse_duration,
    parse_rates,
    parse_shape,
)
from pyserve.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("10s", 10.0), ("500ms", 0.5), ("5m", 300.0), ("1h", 3600.0), ("2.5", 2.5), (".5s", 0.5), ("3 min", 180.0)],
)
def test_durations_read_with_or_without_a_unit(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "ten seconds", "10x", "-1s", "1s2"])
def test_a_bad_duration_says_how_to_write_one(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration: use a number with ms, s, m or h"):
        parse_duration(text)


def test_lists_of_counts_and_rates() -> None:
    assert parse_counts("1,4,16") == [1, 4, 16]
    assert parse_rates("100, 250.5") == [100.0, 250.5]
    with pytest.raises(ValueError, match="expected integers >= 1"):
        parse_counts("1,0")
    with pytest.raises(ValueError, match="comma-separated integers"):
        parse_counts("1,x")
    with pytest.raises(ValueError, match="numbers > 0"):
        parse_rates("0")


def test_shapes_are_name_and_dimensions() -> None:
    assert parse_shape("INPUT0:16") == ("INPUT0", (16,))
    assert parse_shape("image:224,224,3") == ("image", (224, 224, 3))
    for text in ("INPUT0", "INPUT0:", ":16", "x:a,b", "x:0"):
        with pytest.raises(ValueError, match=repr(text)):
            parse_shape(text)


def test_concurrency_is_shared_out_and_rates_divided() -> None:
    assert LoadLevel(concurrency=5).split(2) == [LoadLevel(concurrency=3), LoadLevel(concurrency=2)]
    assert LoadLevel(concurrency=1).split(3) == [LoadLevel(concurrency=1), None, None]
    assert LoadLevel(request_rate=300.0).split(3) == [LoadLevel(request_rate=100.0)] * 3
    assert LoadLevel(concurrency=16).label() == "concurrency 16"
    assert LoadLevel(request_rate=250.0).label() == "rate 250/s"


def test_a_level_is_one_kind_of_load() -> None:
    with pytest.raises(ConfigError, match="not both or neither"):
        LoadLevel(concurrency=1, request_rate=1.0)
    with pytest.raises(ConfigError, match="concurrency must be >= 1"):
        LoadLevel(concurrency=0)
    with pytest.raises(ConfigError, match="give --concurrency or --request-rate, not both"):
        levels_of([1], [10.0])
    assert levels_of() == (LoadLevel(concurrency=1),)


def test_settings_are_checked_where_they_are_made() -> None:
    with pytest.raises(ConfigError, match="shorter than one window"):
        BenchSettings(model="m", window_s=2.0, duration_s=1.0)
    with pytest.raises(ConfigError, match="concurrencies or request rates, not both"):
        BenchSettings(model="m", levels=(LoadLevel(concurrency=1), LoadLevel(request_rate=5.0)))
    with pytest.raises(ConfigError, match="distribution must be one of constant, poisson"):
        BenchSettings(model="m", distribution="uniform")


def test_client_processes_follow_the_heaviest_step_up_to_half_the_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert BenchSettings(model="m", levels=levels_of([1, 4])).client_processes() == 1
    assert BenchSettings(model="m", levels=levels_of([1, 256])).client_processes() == 4
    assert BenchSettings(model="m", levels=levels_of([100_000])).client_processes() == 8
    assert BenchSettings(model="m", levels=levels_of([1]), processes=3).client_processes() == 3
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    assert BenchSettings(model="m", levels=levels_of([1024])).client_processes() == 1
