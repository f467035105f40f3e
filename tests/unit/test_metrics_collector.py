"""Tests of pyserve.core.metrics_collector: Triton's families read from the core's counters, the text format, the
opt-in summaries and histograms, and the host readings."""

from __future__ import annotations

import math
import re
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pyserve import ModelConfig, Tensor
from pyserve.config import ModelSpec
from pyserve.core.cache import ResponseCache
from pyserve.core.host import CpuReader
from pyserve.core.inference import InferenceRequest, Instance, ModelEntry
from pyserve.core.metrics_collector import BucketHistogram, CoreMetrics, LatencyRecorder, SlidingQuantiles, render
from pyserve.core.registry import Registry
from pyserve.core.scheduler import ModelScheduler
from pyserve.core.stats import BACKEND, CANCELED, OTHER, REJECTED

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "triton-2.51"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def entry(name: str = "m", version: int = 1, **config: Any) -> ModelEntry:
    spec = ModelSpec(
        name,
        version,
        inputs=(Tensor("INPUT0", np.float32, (-1,)),),
        outputs=(Tensor("OUTPUT0", np.float32, (-1,)),),
        config=ModelConfig(**config),
    )
    return ModelEntry(spec)


def request(model: ModelEntry) -> InferenceRequest:
    return InferenceRequest(model, "r", {}, {}, [], 1, lambda request, response: None)


def collector(
    *entries: ModelEntry, cache: ResponseCache | None = None, summaries: bool = False, histograms: bool = False
) -> CoreMetrics:
    """A collector over a registry of these models (and the response cache), without NVML."""
    registry = Registry()
    for model in entries:
        registry.add(model)
    return CoreMetrics(registry, cache, summaries=summaries, histograms=histograms, gpu=False)


def samples(page: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) -> value, as the page names them (the parser reports counters as <name>_total)."""
    out = {}
    for family in text_string_to_metric_families(page.decode()):
        for sample in family.samples:
            bare = family.type == "counter" and sample.name == family.name + "_total"
            out[(family.name if bare else sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def labels(model: str = "m", version: str = "1", **extra: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"model": model, "version": version, **extra}.items()))


# families --------------------------------------------------------------------------------------------------------


def test_every_model_has_every_series_from_the_start_at_zero() -> None:
    page = collector(entry("a"), entry("b", 2)).render()
    values = samples(page)
    for model, version in (("a", "1"), ("b", "2")):
        for name in (
            "nv_inference_request_success",
            "nv_inference_count",
            "nv_inference_exec_count",
            "nv_inference_request_duration_us",
            "nv_inference_queue_duration_us",
            "nv_inference_compute_input_duration_us",
            "nv_inference_compute_infer_duration_us",
            "nv_inference_compute_output_duration_us",
            "nv_inference_pending_request_count",
            "nv_model_load_duration_secs",
        ):
            assert values[(name, labels(model, version))] == 0, name
        for reason in (REJECTED, CANCELED, BACKEND, OTHER):
            assert values[("nv_inference_request_failure", labels(model, version, reason=reason))] == 0


def test_help_and_type_lines_are_tritons() -> None:
    reference = (REFERENCE / "metrics_full.txt").read_text().splitlines()
    page = collector(entry()).render().decode().splitlines()
    wanted = [line for line in reference if line.startswith("#") and ("nv_inference" in line or "nv_cpu" in line)]
    assert wanted, "the reference page has no inference families"
    for line in wanted:
        assert line in page, line


def test_counters_keep_tritons_names_without_a_total_suffix() -> None:
    page = collector(entry()).render().decode()
    assert "# TYPE nv_inference_request_success counter\n" in page
    assert 'nv_inference_request_success{model="m",version="1"} 0\n' in page
    assert not re.search(r"^nv_inference\w*_total", page, re.M)


def test_counters_are_read_from_the_model_statistics() -> None:
    model = entry(max_batch_size=8)
    stats = model.stats
    stats.record_execution(batch_size=5, requests=2, input_ns=1_000, infer_ns=20_000, output_ns=3_000)
    stats.queue.add(7_000, count=2)
    stats.success.add(90_000, count=2)
    stats.record_failed_execution()
    stats.record_failure(BACKEND, 4_000)
    stats.record_failure(REJECTED, 0)
    stats.record_failure(REJECTED, 0)
    values = samples(collector(model).render())
    assert values[("nv_inference_request_success", labels())] == 2
    assert values[("nv_inference_request_failure", labels(reason=BACKEND))] == 1
    assert values[("nv_inference_request_failure", labels(reason=REJECTED))] == 2
    assert values[("nv_inference_count", labels())] == 5
    assert values[("nv_inference_exec_count", labels())] == 2
    assert values[("nv_inference_request_duration_us", labels())] == 90
    assert values[("nv_inference_queue_duration_us", labels())] == 7
    # every request of the batch is charged the batch's compute time
    assert values[("nv_inference_compute_input_duration_us", labels())] == 2
    assert values[("nv_inference_compute_infer_duration_us", labels())] == 40
    assert values[("nv_inference_compute_output_duration_us", labels())] == 6


def test_pending_count_is_the_scheduler_queue_depth() -> None:
    model = entry(max_batch_size=8)
    model.scheduler = ModelScheduler(model, lambda batch, instance: None, lambda delay, callback: _Timer())
    for _ in range(3):
        model.scheduler.submit(request(model))  # no instance: they stay queued
    values = samples(collector(model).render())
    assert values[("nv_inference_pending_request_count", labels())] == 3


class _Timer:
    def cancel(self) -> None:
        pass


def test_model_load_duration_is_set_once_every_instance_is_connected() -> None:
    model = entry(instances=2)
    metrics = collector(model)
    model.instances.append(Instance(b"a", 0, "thread", 1))
    metrics.model_ready(model)
    assert model.stats.load_duration_ns == 0
    model.instances.append(Instance(b"b", 1, "thread", 1))
    metrics.model_ready(model)
    loaded = model.stats.load_duration_ns
    assert loaded > 0
    metrics.model_ready(model)  # a restarted instance does not change the load time
    assert model.stats.load_duration_ns == loaded
    assert samples(metrics.render())[("nv_model_load_duration_secs", labels())] == loaded / 1e9


def test_cache_families_appear_for_cached_models_only() -> None:
    cached, plain = entry("cached", response_cache=True), entry("plain")
    cached.stats.record_cache_hit(lookup_ns=3_000, request_ns=5_000)
    cached.stats.record_cache_miss(miss_ns=8_000)
    cache = ResponseCache(1 << 20)
    values = samples(collector(cached, plain, cache=cache).render())
    assert values[("nv_cache_num_hits_per_model", labels("cached"))] == 1
    assert values[("nv_cache_num_misses_per_model", labels("cached"))] == 1
    assert values[("nv_cache_hit_duration_per_model", labels("cached"))] == 3
    assert values[("nv_cache_miss_duration_per_model", labels("cached"))] == 8
    assert ("nv_cache_num_hits_per_model", labels("plain")) not in values
    assert values[("pyserve_response_cache_limit_bytes", ())] == 1 << 20
    # a hit is a success; a miss's lookup and insertion add to the request duration, as in Triton
    assert values[("nv_inference_request_success", labels("cached"))] == 1
    assert values[("nv_inference_request_duration_us", labels("cached"))] == 13
    assert values[("nv_inference_count", labels("cached"))] == 0


def test_summaries_and_histograms_are_opt_in() -> None:
    plain = entry()
    metrics = collector(plain)
    plain.instances.append(Instance(b"a", 0, "thread", 1))
    metrics.model_ready(plain)
    assert plain.stats.latency is None
    page = metrics.render().decode()
    assert "_summary_us" not in page and "histogram" not in page


def test_summaries_report_quantiles_count_and_sum() -> None:
    model = entry(max_batch_size=8)
    metrics = collector(model, summaries=True)
    model.instances.append(Instance(b"a", 0, "thread", 1))
    metrics.model_ready(model)
    requests = [request(model) for _ in range(4)]
    for index, item in enumerate(requests):
        item.arrival_ns = 1_000_000 - index * 100_000  # waited 0, 100, 200, 300 µs in the queue
    model.stats.record_successes(requests, dispatched_ns=1_000_000, now_ns=2_000_000, timings=[1_000, 50_000, 2_000])
    values = samples(metrics.render())
    assert values[("nv_inference_queue_summary_us_count", labels())] == 4
    assert values[("nv_inference_queue_summary_us_sum", labels())] == 600
    assert values[("nv_inference_queue_summary_us", labels(quantile="0.5"))] == 100
    assert values[("nv_inference_queue_summary_us", labels(quantile="0.99"))] == 300
    assert values[("nv_inference_compute_infer_summary_us", labels(quantile="0.5"))] == 50
    # _count and _sum match the counters, as Triton documents
    assert (
        values[("nv_inference_request_summary_us_count", labels())]
        == values[("nv_inference_request_success", labels())]
    )


def test_first_response_histogram_is_for_decoupled_models() -> None:
    streaming, plain = entry("streaming", decoupled=True), entry("plain")
    metrics = collector(streaming, plain, histograms=True)
    for model in (streaming, plain):
        model.instances.append(Instance(b"x", 0, "thread", 1))
        metrics.model_ready(model)
    first = request(streaming)
    first.arrival_ns = 0
    streaming.stats.record_response(first, "success", [1_000, 1_000], now_ns=250_000_000)  # 250 ms
    streaming.stats.record_response(first, "success", [1_000, 1_000], now_ns=900_000_000)  # not the first
    values = samples(metrics.render())
    name = "nv_inference_first_response_histogram_ms"
    assert values[(name + "_bucket", labels("streaming", le="100"))] == 0
    assert values[(name + "_bucket", labels("streaming", le="500"))] == 1
    assert values[(name + "_bucket", labels("streaming", le="+Inf"))] == 1
    assert values[(name + "_count", labels("streaming"))] == 1
    assert values[(name + "_sum", labels("streaming"))] == 250
    assert (name + "_count", labels("plain")) not in values


# building blocks ------------------------------------------------------------------------------------------------


def test_sliding_quantiles_forget_observations_older_than_the_window() -> None:
    clock = FakeClock()
    summary = SlidingQuantiles(max_age_s=60, age_buckets=5, clock=clock)
    assert all(math.isnan(value) for _, value in summary.quantiles())
    for value in range(1, 101):
        summary.observe(value)
    assert dict(summary.quantiles((0.5, 0.9, 0.99))) == {0.5: 50, 0.9: 90, 0.99: 99}
    clock.now += 30
    summary.observe(1000)
    assert dict(summary.quantiles((0.99,))) == {0.99: 100}  # the old ones still count
    clock.now += 45  # the first hundred are now 75 s old
    assert dict(summary.quantiles((0.5,))) == {0.5: 1000}
    assert summary.count == 101 and summary.total == 5050 + 1000  # count and sum never forget
    clock.now += 600
    assert math.isnan(dict(summary.quantiles((0.5,)))[0.5])


def test_sliding_quantiles_keep_a_bounded_sample() -> None:
    summary = SlidingQuantiles(cap=100, clock=FakeClock())
    for value in range(10_000):
        summary.observe(value)
    assert summary.count == 10_000
    median = dict(summary.quantiles((0.5,)))[0.5]
    assert 2_000 < median < 8_000  # a uniform sample of 0..9999


def test_bucket_histogram_counts_cumulatively() -> None:
    histogram = BucketHistogram([1, 5, 10])
    for value in (0.5, 1, 3, 7, 50):
        histogram.observe(value)
    assert histogram.cumulative() == [("1", 2), ("5", 3), ("10", 4), ("+Inf", 5)]
    assert histogram.count == 5 and histogram.total == 61.5


def test_latency_recorder_without_summaries_observes_nothing() -> None:
    recorder = LatencyRecorder(summaries=False, histograms=True, decoupled=False)
    recorder.request(1, 2, 3, 4, 5)
    recorder.first_response(10)
    assert recorder.summaries == {} and recorder.first_response_ms is None


def test_render_escapes_labels_and_formats_numbers() -> None:
    from prometheus_client.metrics_core import Metric

    family = Metric("x", "help with \\ and\nnewline", "gauge")
    family.add_sample("x", {"model": 'a"b\\c'}, 1.5)
    family.add_sample("x", {"model": "n"}, float("nan"))
    family.add_sample("x", {"model": "i"}, 3.0)
    text = render([family]).decode()
    assert text.startswith("# HELP x help with \\\\ and\\nnewline\n# TYPE x gauge\n")
    assert 'x{model="a\\"b\\\\c"} 1.5\n' in text
    assert 'x{model="n"} NaN\n' in text
    assert 'x{model="i"} 3\n' in text
    parsed = samples(text.encode())
    assert parsed[("x", (("model", 'a"b\\c'),))] == 1.5


def test_cpu_reader_reads_proc(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text("cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 1 2 3 4\n")
    (tmp_path / "meminfo").write_text("MemTotal:  1000 kB\nMemFree:  100 kB\nMemAvailable:  400 kB\n")
    reader = CpuReader(str(tmp_path))
    (tmp_path / "stat").write_text("cpu  250 0 150 900 0 0 0 0 0 0\n")  # 200 busy of 300 since
    assert reader.utilization() == pytest.approx(2 / 3)
    assert reader.memory() == (1000 * 1024, 600 * 1024)


def test_cpu_reader_without_proc_reports_nothing(tmp_path: Path) -> None:
    reader = CpuReader(str(tmp_path / "missing"))
    assert reader.utilization() is None
    assert reader.memory() is None


def test_host_families_are_tritons_when_proc_exists() -> None:
    page = collector().render().decode()
    if not Path("/proc/stat").exists():
        pytest.skip("no /proc here")
    assert re.search(r"^nv_cpu_utilization [0-9.e-]+$", page, re.M)
    assert re.search(r"^nv_cpu_memory_total_bytes \d+$", page, re.M)
    assert re.search(r"^nv_cpu_memory_used_bytes \d+$", page, re.M)


# statistics the metrics are read from ----------------------------------------------------------------------------


def test_cancelled_requests_of_a_finished_batch_fail_as_canceled() -> None:
    model = entry(max_batch_size=8)
    done, gone = request(model), request(model)
    gone.cancelled = True
    model.stats.record_successes([done, gone], dispatched_ns=10, now_ns=50, timings=[1, 2, 3])
    doc = model.stats.to_json("m", 1)["inference_stats"]
    assert doc["success"] == {"count": 1, "ns": 50}
    assert doc["queue"] == {"count": 1, "ns": 10}
    assert doc["fail"] == {"count": 1, "ns": 50}
    assert model.stats.failures == {REJECTED: 0, CANCELED: 1, BACKEND: 0, OTHER: 0}


def test_response_stats_follow_tritons_shape_per_response_index() -> None:
    model = entry(decoupled=True)
    stream = request(model)
    model.stats.record_response(stream, "success", [100, 10], now_ns=0)
    model.stats.record_response(stream, "success", [200, 20], now_ns=0)
    model.stats.record_response(stream, "empty", [5], now_ns=0)
    failing = request(model)
    model.stats.record_response(failing, "fail", [70], now_ns=0)
    doc = model.stats.to_json("m", 1)["response_stats"]
    assert list(doc) == ["0", "1", "2"]
    assert doc["0"]["compute_infer"] == {"count": 2, "ns": 170}
    assert doc["0"]["compute_output"] == {"count": 1, "ns": 10}
    assert doc["0"]["success"] == {"count": 1, "ns": 110}
    assert doc["0"]["fail"] == {"count": 1, "ns": 70}
    assert doc["1"]["success"] == {"count": 1, "ns": 220}
    assert doc["2"]["empty_response"] == {"count": 1, "ns": 5}
    assert set(doc["2"]) == {"compute_infer", "compute_output", "success", "fail", "empty_response", "cancel"}
    from pyserve.frontends.protocol import grpc_service_pb2 as pb

    fields = {field.name for field in pb.InferResponseStatistics.DESCRIPTOR.fields}
    assert set(doc["0"]) == fields


class FakeNvml:
    """Stands in for the NVML library (pynvml's functions), which needs a GPU and its driver."""

    def __init__(self, power_limit: bool = True) -> None:
        self.energy_mj = 5_000_000
        self.power_limit = power_limit

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        return types.SimpleNamespace(gpu=37, memory=5)

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        return types.SimpleNamespace(total=80 << 30, used=3 << 30, free=77 << 30)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return 123_456  # mW

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        if not self.power_limit:
            raise RuntimeError("not supported on this board")
        return 700_000  # mW

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return self.energy_mj


def test_gpu_readings_use_tritons_names_and_the_gpu_uuid_label() -> None:
    from pyserve.core.host import GpuReader

    nvml = FakeNvml(power_limit=False)
    metrics = collector()
    metrics._gpu = GpuReader(nvml, [("GPU-1234", object())])
    nvml.energy_mj += 2_500  # 2.5 J since the server started
    values = samples(metrics.render())
    gpu = (("gpu_uuid", "GPU-1234"),)
    assert values[("nv_gpu_utilization", gpu)] == 0.37
    assert values[("nv_gpu_memory_total_bytes", gpu)] == 80 << 30
    assert values[("nv_gpu_memory_used_bytes", gpu)] == 3 << 30
    assert values[("nv_gpu_power_usage", gpu)] == 123.456
    assert values[("nv_energy_consumption", gpu)] == 2.5
    assert ("nv_gpu_power_limit", gpu) not in values  # a reading the board does not support is left out


def test_the_grafana_dashboard_queries_only_metrics_the_server_exposes() -> None:
    import json

    from pyserve.core.host import GpuReader

    dashboard = json.loads((Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json").read_text())
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        for name in re.findall(r"\b(?:nv|pyserve)_\w+", target["expr"])
    }
    assert queried
    streaming, cached = entry("streaming", decoupled=True), entry("cached", response_cache=True)
    metrics = collector(streaming, cached, cache=ResponseCache(1024), summaries=True, histograms=True)
    metrics._gpu = GpuReader(FakeNvml(), [("GPU-0", object())])
    for model in (streaming, cached):
        model.instances.append(Instance(b"x", 0, "thread", 1))
        metrics.model_ready(model)
    exposed = {name for name, _ in samples(metrics.render())}
    assert queried <= exposed, queried - exposed
