"""Tests of pyserve.pytriton's configuration: Tensor and ModelConfig in PyTriton's argument order and defaults, and
TritonConfig's fields mapped onto ServeConfig (or ignored with one warning)."""

from __future__ import annotations

import logging
import os
import pathlib
import re

import numpy as np
import pytest

from pyserve import DynamicBatcher, ServeConfig
from pyserve import ModelConfig as PyServeModelConfig
from pyserve import Tensor as PyServeTensor
from pyserve.errors import ConfigError
from pyserve.pytriton.model_config import DeviceKind, ModelConfig, QueuePolicy, Tensor, TimeoutAction
from pyserve.pytriton.triton_config import TritonConfig, to_serve_config


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No PYSERVE_ or PYTRITON_TRITON_CONFIG_ variables."""
    for key in list(os.environ):
        if key.startswith(("PYSERVE_", "PYTRITON_TRITON_CONFIG_")):
            monkeypatch.delenv(key)
    return monkeypatch


# Tensor and ModelConfig -----------------------------------------------------------------------------------------


def test_tensor_takes_pytritons_argument_order_and_is_a_pyserve_tensor() -> None:
    tensor = Tensor((-1, 3), np.float32, "x", True)
    assert isinstance(tensor, PyServeTensor)
    assert (tensor.name, tensor.shape, tensor.datatype, tensor.optional) == ("x", (-1, 3), "FP32", True)
    unnamed = Tensor(dtype=np.bytes_, shape=(1,))
    assert (unnamed.name, unnamed.datatype, unnamed.optional) == ("", "BYTES", False)


def test_model_config_defaults_to_batching_four_rows() -> None:
    served = ModelConfig().to_pyserve()
    assert (served.max_batch_size, served.batcher, served.dynamic_batching) == (4, DynamicBatcher(), True)


def test_batching_false_ignores_max_batch_size_as_pytriton_does() -> None:
    served = ModelConfig(batching=False, max_batch_size=16, decoupled=True).to_pyserve()
    assert served == PyServeModelConfig(batching=False, decoupled=True)


def test_model_config_carries_batcher_cache_and_decoupled() -> None:
    batcher = DynamicBatcher(
        max_queue_delay_microseconds=100,
        preferred_batch_size=[4, 8],  # type: ignore[arg-type]
        default_queue_policy=QueuePolicy(timeout_action=TimeoutAction.DELAY, max_queue_size=10),
    )
    served = ModelConfig(max_batch_size=8, batcher=batcher, response_cache=True, decoupled=True).to_pyserve()
    assert served.batcher == batcher
    assert served.batcher is not None and served.batcher.preferred_batch_size == (4, 8)
    assert (served.max_batch_size, served.response_cache, served.decoupled) == (8, True, True)


def test_model_warmup_is_accepted_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="pyserve.pytriton"):
        ModelConfig(model_warmup=[object()]).to_pyserve()
    assert "model_warmup is not run by pyserve" in caplog.text


def test_device_kind_has_pytritons_members() -> None:
    assert [kind.value for kind in DeviceKind] == ["KIND_AUTO", "KIND_CPU", "KIND_GPU"]


# TritonConfig -> ServeConfig -------------------------------------------------------------------------------------


def test_an_empty_triton_config_is_pyserves_defaults() -> None:
    assert to_serve_config(TritonConfig()) == ServeConfig()


def test_addresses_ports_and_header_patterns_are_mapped() -> None:
    config = TritonConfig(
        http_address="0.0.0.0",
        grpc_address="0.0.0.0",
        http_port=9000,
        grpc_port=9001,
        metrics_port=9002,
        http_header_forward_pattern="header.*",
        grpc_header_forward_pattern="(?-i)x-.*",
    )
    served = to_serve_config(config)
    assert (served.host, served.http_port, served.grpc_port, served.metrics_port) == ("0.0.0.0", 9000, 9001, 9002)
    assert (served.http_header_forward_pattern, served.grpc_header_forward_pattern) == ("header.*", "(?-i)x-.*")


def test_different_addresses_are_refused() -> None:
    with pytest.raises(ConfigError, match=re.escape("one address, got ['0.0.0.0', '127.0.0.1']")):
        to_serve_config(TritonConfig(http_address="127.0.0.1", grpc_address="0.0.0.0"))


def test_a_front_end_turned_off_is_turned_off() -> None:
    served = to_serve_config(TritonConfig(allow_grpc=False, allow_metrics=False, grpc_port=9001))
    assert (served.allow_http, served.allow_grpc, served.allow_metrics) == (True, False, False)
    assert served.http_port == 8000
    with pytest.raises(ConfigError, match="HTTP or the gRPC endpoint has to be allowed"):
        TritonConfig(allow_http=False, allow_grpc=False)


def test_logging_repository_cache_metrics_and_tracing_are_mapped(tmp_path: pathlib.Path) -> None:
    served = to_serve_config(
        TritonConfig(
            log_verbose=1,
            log_format="ISO8601",
            model_repository=tmp_path,
            model_control_mode="explicit",
            load_model=["a", "b"],
            disable_auto_complete_config=True,
            cache_config=["local,size=1048576"],
            metrics_config=["summary_latencies=true", "histogram_latencies=false"],
            trace_config=["level=TIMESTAMPS", "rate=10", "triton,file=/tmp/trace.json"],
        )
    )
    assert (served.log_level, served.log_format) == ("DEBUG", "ISO8601")
    assert (served.model_repository, served.model_control_mode, served.load_model) == (
        str(tmp_path),
        "explicit",
        ("a", "b"),
    )
    assert served.strict_model_config is True
    assert served.response_cache_bytes == 1048576
    assert (served.metrics_summaries, served.metrics_histograms) == (True, False)
    assert (served.trace_level, served.trace_rate, served.trace_file) == ("TIMESTAMPS", 10, "/tmp/trace.json")
    assert to_serve_config(TritonConfig(log_info=True)).log_level == "INFO"


def test_restricted_apis_map_onto_each_protocol() -> None:
    served = to_serve_config(
        TritonConfig(
            http_restricted_api="shared-memory,statistics:admin-key=secret", grpc_restricted_protocol="inference:k=v"
        )
    )
    assert served.http_restricted_api == ("shared-memory,statistics:admin-key=secret",)
    assert served.grpc_restricted_protocol == ("inference:k=v",)
    assert sorted(served.http_restrictions()) == ["shared-memory", "statistics"]


def test_fields_only_tritonserver_uses_are_ignored_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    config = TritonConfig(
        backend_directory=pathlib.Path("/opt/tritonserver/backends"),
        cuda_memory_pool_byte_size=["0:1024"],
        http_thread_count=8,
        cache_config=["redis,host=localhost"],
        trace_config=["mode=opentelemetry"],
    )
    with caplog.at_level(logging.WARNING, logger="pyserve.pytriton"):
        assert to_serve_config(config) == ServeConfig()
    warnings = [record.getMessage() for record in caplog.records]
    assert warnings == [
        "TritonConfig fields that only tritonserver uses are ignored by pyserve: backend_directory, "
        "cuda_memory_pool_byte_size, http_thread_count",
        "TritonConfig settings pyserve has no use for are ignored: trace_config 'mode=opentelemetry', "
        "cache_config 'redis,host=localhost'",
    ]


def test_exit_and_readiness_flags_map_onto_their_fields() -> None:
    served = to_serve_config(TritonConfig(exit_on_error=False, strict_readiness=False, exit_timeout_secs=5))
    assert (served.exit_on_error, served.strict_readiness, served.exit_timeout_s) == (False, False, 5.0)
    assert (ServeConfig().exit_on_error, ServeConfig().strict_readiness) == (True, True)  # tritonserver's defaults


def test_grpc_tls_serves_the_grpc_port_only() -> None:
    cert, key, ca = pathlib.Path("/certs/server.pem"), pathlib.Path("/certs/server.key"), pathlib.Path("/certs/ca.pem")
    served = to_serve_config(TritonConfig(grpc_use_ssl=True, grpc_server_cert=cert, grpc_server_key=key))
    assert (served.tls_certfile, served.tls_keyfile, served.tls_client_ca) == (str(cert), str(key), "")
    assert served.uses_tls("grpc") and not served.uses_tls("http")
    mutual = TritonConfig(grpc_use_ssl_mutual=True, grpc_server_cert=cert, grpc_server_key=key, grpc_root_cert=ca)
    assert to_serve_config(mutual).tls_client_ca == str(ca)
    with pytest.raises(ConfigError, match="grpc_use_ssl needs grpc_server_cert and grpc_server_key"):
        to_serve_config(TritonConfig(grpc_use_ssl=True))
    with pytest.raises(ConfigError, match="grpc_use_ssl_mutual needs grpc_root_cert"):
        to_serve_config(TritonConfig(grpc_use_ssl_mutual=True, grpc_server_cert=cert, grpc_server_key=key))


def test_from_env_reads_pytritons_variables(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("PYTRITON_TRITON_CONFIG_GRPC_PORT", "45436")
    clean_env.setenv("PYTRITON_TRITON_CONFIG_ALLOW_METRICS", "false")
    clean_env.setenv("PYTRITON_TRITON_CONFIG_HTTP_HEADER_FORWARD_PATTERN", "x-.*")
    clean_env.setenv("PYTRITON_TRITON_CONFIG_CACHE_CONFIG_1", "local,size=10")
    clean_env.setenv("PYTRITON_TRITON_CONFIG_CACHE_CONFIG_0", "local,size=20")
    config = TritonConfig.from_env()
    assert (config.grpc_port, config.allow_metrics, config.http_header_forward_pattern) == (45436, False, "x-.*")
    assert config.cache_config == ["local,size=20", "local,size=10"]
    assert TritonConfig(http_port=1).merged_over(config).grpc_port == 45436
    assert TritonConfig(grpc_port=1).merged_over(config).grpc_port == 1


def test_from_dict_converts_strings_and_warns_of_unknown_fields(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="pyserve.pytriton"):
        config = TritonConfig.from_dict({"http_port": "9000", "trace_config": "level=OFF,rate=1", "bogus": 1})
    assert (config.http_port, config.trace_config) == (9000, ["level=OFF", "rate=1"])
    assert "ignoring unknown fields bogus" in caplog.text
    with pytest.raises(ConfigError, match=re.escape("TritonConfig.http_port: cannot read 'eighty' as int")):
        TritonConfig.from_dict({"http_port": "eighty"})
