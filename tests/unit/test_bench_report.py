"""What bench and tune write: the winner as a ModelConfig line and a config.pbtxt, tables, CSV, and SVG charts that
need nothing from the network."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree

import numpy as np
import pytest

from pyserve.bench.candidates import Candidate, config_pbtxt, model_config_line
from pyserve.bench.plot import Chart, Series, html_page, nice_ticks, svg_chart
from pyserve.bench.report import csv_text, format_report, text_table
from pyserve.bench.runner import BenchReport, StepResult
from pyserve.bench.server_stats import ServerSplit
from pyserve.bench.settings import BenchSettings, levels_of
from pyserve.bench.windows import LatencyStats, Merged
from pyserve.client.model import RemoteModelConfig
from pyserve.config import DynamicBatcher, ModelConfig, Tensor
from pyserve.repository.config_document import parse_config_text

INPUTS = (Tensor("x", np.float32, (-1,)),)
OUTPUTS = (Tensor("y", np.float32, (-1,)),)


def test_a_candidate_keeps_the_rest_of_the_models_config() -> None:
    base = ModelConfig(
        max_batch_size=64,
        batcher=DynamicBatcher(priority_levels=2, default_priority_level=2),
        parameters={"k": "v"},
    )
    config = Candidate(16, 2, "process", 500, (8, 16)).model_config(base)
    assert config.max_batch_size == 16 and config.instances == 2 and config.worker.value == "process"
    assert config.batcher == DynamicBatcher(500, (8, 16), priority_levels=2, default_priority_level=2)
    assert config.parameters == {"k": "v"}


def test_the_model_config_line_names_only_what_differs_from_the_defaults() -> None:
    assert model_config_line(Candidate(16, 2).model_config(ModelConfig(max_batch_size=64))) == (
        "ModelConfig(max_batch_size=16, instances=2)"
    )
    config = Candidate(8, 1, "process", 100, (4, 8)).model_config(ModelConfig(max_batch_size=8))
    assert model_config_line(config) == (
        "ModelConfig(max_batch_size=8, batcher=DynamicBatcher(max_queue_delay_microseconds=100, "
        "preferred_batch_size=(4, 8)), worker='process')"
    )
    policy = ModelConfig(batcher=None, devices=("cuda:0",))
    assert model_config_line(policy) == "ModelConfig(batcher=None, devices=('cuda:0',))"
    # The line is Python that rebuilds the configuration.
    assert eval(model_config_line(config), {"ModelConfig": ModelConfig, "DynamicBatcher": DynamicBatcher}) == config


def test_config_pbtxt_reads_back_as_the_winning_configuration() -> None:
    config = Candidate(16, 2, "thread", 100, (8, 16)).model_config(ModelConfig(max_batch_size=64))
    text = config_pbtxt("linear", INPUTS, OUTPUTS, config)
    parsed = parse_config_text(text, "linear")
    assert parsed.name == "linear" and parsed.max_batch_size == 16
    assert list(parsed.dynamic_batching.preferred_batch_size) == [8, 16]
    assert parsed.dynamic_batching.max_queue_delay_microseconds == 100
    assert parsed.instance_group[0].count == 2
    assert parsed.input[0].name == "x" and list(parsed.input[0].dims) == [-1]
    assert "optimization" not in text and "model_transaction_policy" not in text
    gpu = config_pbtxt(
        "linear",
        INPUTS,
        OUTPUTS,
        Candidate(8, 2, "process", devices=("cuda:0", "cuda:1")).model_config(ModelConfig(max_batch_size=8)),
    )
    group = parse_config_text(gpu, "linear").instance_group[0]
    assert list(group.gpus) == [0, 1] and group.kind == group.KIND_GPU


def step(concurrency: int, throughput: float, p99_ms: float, errors: dict[str, int] | None = None) -> StepResult:
    latencies = np.linspace(p99_ms / 4, p99_ms, 100) / 1000
    split = ServerSplit(100, 0, 100, 50, 2000.0, 300.0, 10.0, 1500.0, 20.0)
    merged = Merged(1.0, int(throughput), errors or {}, LatencyStats.of(latencies), 0.1, 0, 0, split)
    return StepResult(levels_of([concurrency])[0], 1, merged, True, 3)


def report() -> BenchReport:
    settings = BenchSettings(model="m", url="http://127.0.0.1:8000", levels=levels_of([1, 8]))
    model = RemoteModelConfig("m", None, 8, False, INPUTS, OUTPUTS, {})
    steps = (step(1, 100.0, 12.0), step(8, 700.0, 30.0, {"QueueFullError: queue full": 3}))
    return BenchReport(settings, model, {"x": ("FP32", (1, 16))}, 1, 1, steps)


def test_the_final_table_has_a_row_per_step_and_lists_errors() -> None:
    text = format_report(report())
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("concurrency"))
    assert header.split() == [
        *("concurrency", "infer/s", "p50", "ms", "p90", "ms", "p95", "ms", "p99", "ms", "avg", "ms", "errors"),
        *("queue", "ms", "compute", "ms", "batch", "stable"),
    ]
    row = next(line for line in lines if line.split()[:2] == ["8", "700.0"])
    assert row.split()[-5:] == ["3", "0.30", "1.53", "2.0", "yes"]
    assert "  concurrency 8: 3 x QueueFullError: queue full" in lines


def test_csv_has_one_row_per_step() -> None:
    rows = csv_text(report()).splitlines()
    assert rows[0].startswith("concurrency,throughput_infer_per_s,requests_per_s,successes,failures,p50_us")
    assert len(rows) == 3 and rows[2].startswith("8,700.0,700.0,700,3,")


def test_text_tables_align_columns() -> None:
    assert text_table(["a", "bb"], [["xyz", "1"], ["q", "22"]]).splitlines() == [
        "a    bb",
        "---  --",
        "xyz   1",
        "q    22",
    ]


def test_nice_ticks_cover_the_range_with_round_steps() -> None:
    assert nice_ticks(0, 15_997) == [0, 5000, 10000, 15000, 20000]
    assert nice_ticks(0, 0.033) == pytest.approx([0.0, 0.01, 0.02, 0.03, 0.04])
    assert nice_ticks(0, 0) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]


def test_charts_are_self_contained_svg() -> None:
    chart = Chart(
        "latency <vs> throughput",
        "throughput",
        "latency (ms)",
        [Series("p99", [(100.0, 5.0), (200.0, 9.0)], "#000", labels=["c=1", "c=2"])],
        hlines=[(8.0, "target 8 ms")],
    )
    svg = svg_chart(chart)
    root = ElementTree.fromstring(svg)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    texts = [element.text for element in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "latency <vs> throughput" in texts and "target 8 ms" in texts and "c=2" in texts
    page = html_page("t", [svg])
    assert page.startswith("<!DOCTYPE html>") and "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert "<script" not in page
