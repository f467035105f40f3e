"""Restricted endpoint groups: tritonserver's ``--http-restricted-api`` / ``--grpc-restricted-protocol`` format in
``ServeConfig`` and the environment, the header check, and the one group of every HTTP route and gRPC method."""

from __future__ import annotations

import hmac
from typing import Any

import pytest

from pyserve import ServeConfig
from pyserve.errors import ConfigError, PermissionDeniedError
from pyserve.frontends.grpc import METHOD_GROUPS
from pyserve.frontends.http_routes import ROUTES
from pyserve.frontends.protocol import grpc_service_pb2 as pb
from pyserve.frontends.restricted import GRPC_HEADER_PREFIX, HeaderCheck, header_checks
from pyserve.server_config import RESTRICTED_GROUPS, Restriction, env_value, parse_restrictions

SECRET = "s3cret-Value_42"


# the format ------------------------------------------------------------------------------------------------------


def test_an_entry_names_groups_a_header_and_its_value() -> None:
    restrictions = parse_restrictions(
        ["shared-memory, model-repository:Admin-Key=s3cret=x", "inference:infer-key=abc"], "http_restricted_api"
    )
    assert restrictions == {
        "shared-memory": Restriction("admin-key", "s3cret=x"),  # the key in lower case, the value after the first '='
        "model-repository": Restriction("admin-key", "s3cret=x"),
        "inference": Restriction("infer-key", "abc"),
    }


def test_every_group_of_tritonserver_is_known() -> None:
    entry = ",".join(RESTRICTED_GROUPS) + ":k=v"
    assert sorted(parse_restrictions([entry], "f")) == sorted(RESTRICTED_GROUPS)
    assert set(RESTRICTED_GROUPS) == {
        "health",
        "metadata",
        "inference",
        "shared-memory",
        "model-config",
        "model-repository",
        "statistics",
        "trace",
        "logging",
    }


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (f"shared-memory:{SECRET}", "each entry must be '<apis>:<key>=<value>'.*got 'shared-memory:...'"),
        (f"shared-memory:key={''}", "each entry must be '<apis>:<key>=<value>'.*got 'shared-memory:key=...'"),
        (SECRET, "each entry must be '<apis>:<key>=<value>'.*got no ':'"),
        (f":key={SECRET}", "each entry must be"),
        (f"inference,:key={SECRET}", "each entry must be"),
        (f"inference:={SECRET}", "each entry must be"),
        (f"infer:key={SECRET}", "unknown restricted API group 'infer'; the groups are health, metadata"),
        (f"metrics:key={SECRET}", "unknown restricted API group 'metrics'"),
        (f"inference:bad key={SECRET}", "'bad key' is not a header name"),
        ("inference:key=two words ", "the value for 'key' must be printable ASCII"),
        ("inference:key=semi;colon", "no ';'"),
        ("inference:key=caf\u00e9", "printable ASCII"),
    ],
)
def test_a_malformed_entry_is_a_config_error_that_never_shows_the_value(entry: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        ServeConfig(http_restricted_api=(entry,))
    assert SECRET not in str(info.value)
    assert str(info.value).startswith("http_restricted_api: ")


def test_a_group_takes_one_header() -> None:
    with pytest.raises(ConfigError, match="group 'health' is in more than one entry"):
        ServeConfig(grpc_restricted_protocol=("health,metadata:a=1", "health:b=2"))
    with pytest.raises(ConfigError, match="shared-memory is restricted by both restricted_api and http_restricted_api"):
        ServeConfig(restricted_api="shared-memory:a=1", http_restricted_api=("shared-memory:b=2",))


def test_restricted_api_still_restricts_shared_memory_on_both_protocols() -> None:
    config = ServeConfig(restricted_api="shared-memory:admin-key=a1", grpc_restricted_protocol=("inference:k=v",))
    assert config.http_restrictions() == {"shared-memory": Restriction("admin-key", "a1")}
    assert config.grpc_restrictions() == {
        "inference": Restriction("k", "v"),
        "shared-memory": Restriction("admin-key", "a1"),
    }
    assert config.shared_memory_restriction() == ("admin-key", "a1")


def test_one_entry_may_be_given_as_a_string_and_lists_become_tuples() -> None:
    # As the core process rebuilds its config from JSON, where tuples are lists.
    config = ServeConfig(http_restricted_api="inference:k=v", grpc_restricted_protocol=["health:k=v"])  # type: ignore[arg-type]
    assert config.http_restricted_api == ("inference:k=v",)
    assert config.grpc_restricted_protocol == ("health:k=v",)


def test_the_value_is_in_no_repr() -> None:
    config = ServeConfig(
        restricted_api=f"shared-memory:a={SECRET}",
        http_restricted_api=(f"inference:b={SECRET}",),
        grpc_restricted_protocol=(f"health:c={SECRET}",),
    )
    shown = [repr(config), repr(config.http_restrictions()), repr(config.grpc_restrictions())]
    shown.append(repr(header_checks(config.http_restrictions())))
    assert not any(SECRET in text for text in shown), shown


# the environment and the command line -------------------------------------------------------------------------


def test_the_environment_separates_entries_with_semicolons(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYSERVE_HTTP_RESTRICTED_API", "shared-memory,statistics:admin-key=a1; inference:infer-key=i1")
    monkeypatch.setenv("PYSERVE_GRPC_RESTRICTED_PROTOCOL", "health:k=v")
    config = ServeConfig.from_env()
    assert config.http_restricted_api == ("shared-memory,statistics:admin-key=a1", "inference:infer-key=i1")
    assert config.grpc_restricted_protocol == ("health:k=v",)


def test_env_value_writes_what_from_env_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    entries = ("shared-memory,statistics:admin-key=a1", "inference:infer-key=i=1")
    assert env_value("http_restricted_api", entries) == "shared-memory,statistics:admin-key=a1;inference:infer-key=i=1"
    assert env_value("tls_endpoints", ("http", "grpc")) == "http,grpc"
    assert env_value("http_port", 9000) == "9000"
    monkeypatch.setenv("PYSERVE_HTTP_RESTRICTED_API", env_value("http_restricted_api", entries))
    assert ServeConfig.from_env().http_restricted_api == entries


def test_the_cli_flags_are_repeatable(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyserve import cli

    for name in ("PYSERVE_HTTP_RESTRICTED_API", "PYSERVE_GRPC_RESTRICTED_PROTOCOL", "PYSERVE_TLS_ENDPOINTS"):
        monkeypatch.delenv(name, raising=False)
    args = cli._parser().parse_args(
        [
            "serve",
            "app:server",
            "--http-restricted-api",
            "shared-memory,model-repository:admin-key=a1",
            "--http-restricted-api",
            "inference:infer-key=i1",
            "--grpc-restricted-protocol",
            "health:k=v",
            "--tls-certfile",
            "cert.pem",
            "--tls-keyfile",
            "key.pem",
            "--tls-endpoints",
            "http, metrics",
        ]
    )
    options: dict[str, Any] = cli._server_options(args)
    assert options["http_restricted_api"] == ("shared-memory,model-repository:admin-key=a1", "inference:infer-key=i1")
    assert options["grpc_restricted_protocol"] == ("health:k=v",)
    assert options["tls_endpoints"] == ("http", "metrics")
    config = ServeConfig(**options)
    assert sorted(config.http_restrictions()) == ["inference", "model-repository", "shared-memory"]
    assert config.uses_tls("metrics") and not config.uses_tls("grpc")


# TLS settings ----------------------------------------------------------------------------------------------------


def test_tls_settings_are_checked() -> None:
    assert not ServeConfig().uses_tls("http")
    config = ServeConfig(tls_certfile="c.pem", tls_keyfile="k.pem")
    assert [config.uses_tls(e) for e in ("http", "grpc", "routes", "metrics")] == [True, True, True, False]
    with pytest.raises(ConfigError, match="tls_certfile and tls_keyfile go together"):
        ServeConfig(tls_certfile="c.pem")
    with pytest.raises(ConfigError, match=r"tls_client_ca .* needs the server's own tls_certfile"):
        ServeConfig(tls_client_ca="ca.pem")
    with pytest.raises(ConfigError, match="tls_endpoints: unknown 'https'"):
        ServeConfig(tls_certfile="c.pem", tls_keyfile="k.pem", tls_endpoints=("https",))
    with pytest.raises(ConfigError, match="tls_endpoints is empty"):
        ServeConfig(tls_certfile="c.pem", tls_keyfile="k.pem", tls_endpoints=())


# the check -------------------------------------------------------------------------------------------------------


def test_the_check_takes_the_value_alone_and_names_only_the_header(monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[bytes, bytes]] = []
    compare = hmac.compare_digest

    def recording(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return compare(a, b)

    monkeypatch.setattr(hmac, "compare_digest", recording)
    check = HeaderCheck(GRPC_HEADER_PREFIX + "admin-key", SECRET)
    check.check(SECRET)
    check.check(SECRET.encode())
    for wrong in (None, "", SECRET[:-1], SECRET + "x", SECRET.upper(), b"\xff"):
        with pytest.raises(PermissionDeniedError) as info:
            check.check(wrong)
        assert str(info.value) == "This API is restricted, expecting header 'triton-grpc-protocol-admin-key'"
    assert len(compared) == 7  # every value given was compared in constant time (None is refused before)
    assert SECRET not in repr(check)


# the one group of every endpoint --------------------------------------------------------------------------------

HTTP_GROUPS = {
    "/": "statistics",
    "/dashboard": "statistics",
    "/dashboard/data": "statistics",
    "/v2": "metadata",
    "/v2/health/live": "health",
    "/v2/health/ready": "health",
    "/v2/models/stats": "statistics",
    "/v2/models/{model}": "metadata",
    "/v2/models/{model}/config": "model-config",
    "/v2/models/{model}/ready": "health",
    "/v2/models/{model}/stats": "statistics",
    "/v2/models/{model}/infer": "inference",
    "/v2/models/{model}/generate": "inference",
    "/v2/models/{model}/generate_stream": "inference",
    "/v2/models/{model}/trace/setting": "trace",
    "/v2/trace/setting": "trace",
    "/v2/logging": "logging",
    "/v2/repository/index": "model-repository",
    "/v2/repository/models/{model}/load": "model-repository",
    "/v2/repository/models/{model}/unload": "model-repository",
    "/v2/pyserve/remote": "metadata",
}


def test_every_http_route_is_in_its_group() -> None:
    for route in ROUTES:
        template = route.template.replace("/versions/{version}", "")
        expected = "shared-memory" if "sharedmemory" in template else HTTP_GROUPS[template]
        assert route.group == expected, route.template


def test_every_grpc_method_is_in_its_group() -> None:
    methods = {method.name for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods}
    assert set(METHOD_GROUPS) == methods
    assert {name: group for name, group in METHOD_GROUPS.items() if "SharedMemory" not in name} == {
        "ServerLive": "health",
        "ServerReady": "health",
        "ModelReady": "health",
        "ServerMetadata": "metadata",
        "ModelMetadata": "metadata",
        "ModelConfig": "model-config",
        "ModelStatistics": "statistics",
        "RepositoryIndex": "model-repository",
        "RepositoryModelLoad": "model-repository",
        "RepositoryModelUnload": "model-repository",
        "TraceSetting": "trace",
        "LogSettings": "logging",
        "ModelInfer": "inference",
        "ModelStreamInfer": "inference",
    }
    assert {group for name, group in METHOD_GROUPS.items() if "SharedMemory" in name} == {"shared-memory"}


def test_model_load_thread_count_flag_and_bounds() -> None:
    from pyserve import cli

    args = cli._parser().parse_args(["serve", "app:server", "--model-load-thread-count", "2"])
    assert ServeConfig(**cli._server_options(args)).model_load_thread_count == 2
    assert ServeConfig().model_load_thread_count == 4  # tritonserver's default
    with pytest.raises(ConfigError, match="model_load_thread_count must be >= 1"):
        ServeConfig(model_load_thread_count=0)
