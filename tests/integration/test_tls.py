"""TLS on the front ends with a test CA made at test time (trustme): tritonclient over HTTPS and gRPC with TLS, mutual
TLS (a client without a certificate is refused), plain HTTP or gRPC to a TLS port failing cleanly, the metrics page
and the custom routes, and files that cannot serve failing the start. docs/security.md describes what is tested."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gevent.ssl
import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from pyserve import ModelConfig, RemoteServe, Request, Serve, ServeConfig, Tensor
from pyserve.bench.progress import Progress
from pyserve.bench.runner import run_bench
from pyserve.bench.settings import BenchSettings, levels_of
from pyserve.bench.tune import ModelUnderTune, TuneSettings, run_tune
from pyserve.client import (
    AsyncioModelClient,
    ClientTimeoutError,
    ClientTls,
    FuturesModelClient,
    ModelClient,
    ServerUnreachableError,
)
from pyserve.errors import ConfigError, ServerError

from .cli_process import clean_environment, pyserve_command

trustme = pytest.importorskip("trustme")

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Certificates:
    """PEM files of a test CA, a server certificate it signed for 127.0.0.1 and localhost, and a client's."""

    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_ca: str  # a CA that signed nothing here


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    folder = tmp_path_factory.mktemp("tls")
    ca, other = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("client@pyserve.test")
    paths = {name: str(folder / f"{name}.pem") for name in Certificates.__dataclass_fields__}
    ca.cert_pem.write_to_path(paths["ca"])
    other.cert_pem.write_to_path(paths["other_ca"])
    for issued, cert, key in ((server, "server_cert", "server_key"), (client, "client_cert", "client_key")):
        issued.private_key_pem.write_to_path(paths[key])
        for i, blob in enumerate(issued.cert_chain_pems):
            blob.write_to_path(paths[cert], append=i > 0)
    return Certificates(**paths)


def identity(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    return [{"OUTPUT0": request["INPUT0"]} for request in requests]


def tls_server(certs: Certificates, **settings: Any) -> Serve:
    config = ServeConfig(
        http_port=0,
        grpc_port=0,
        metrics_port=0,
        routes_port=0,
        tls_certfile=certs.server_cert,
        tls_keyfile=certs.server_key,
        **settings,
    )
    serve = Serve(config)
    tensors = [Tensor("INPUT0", np.float32, (-1,))], [Tensor("OUTPUT0", np.float32, (-1,))]
    serve.bind("identity", identity, *tensors, ModelConfig(max_batch_size=8))
    return serve


@pytest.fixture(scope="module")
def server(certs: Certificates) -> Iterator[Serve]:
    serve = tls_server(certs)

    @serve.route("/hello")
    def hello(request: Any) -> dict[str, str]:
        return {"hello": "tls"}

    with serve:
        yield serve


def http_client(port: int, ca: str | None, cert: str | None = None, key: str | None = None) -> Any:
    """tritonclient over HTTPS, trusting ``ca`` (None: the system's CAs), with a client certificate if given."""

    def context() -> ssl.SSLContext:
        made = gevent.ssl.create_default_context(cafile=ca)
        if cert is not None:
            made.load_cert_chain(cert, key)
        return made

    # The context checks the certificate and its host name (server_hostname); insecure=True only skips
    # geventhttpclient's second check, which calls the deprecated ssl.match_hostname.
    return triton_http.InferenceServerClient(
        f"127.0.0.1:{port}",
        ssl=True,
        ssl_context_factory=context,
        ssl_options={"server_hostname": "127.0.0.1"},
        insecure=True,
    )


def infer_input(module: Any) -> Any:
    tensor = module.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
    return tensor


def answered(result: Any) -> list[list[float]]:
    values: list[list[float]] = result.as_numpy("OUTPUT0").tolist()
    return values


def test_tritonclient_over_https_and_grpc_with_tls(server: Serve, certs: Certificates) -> None:
    with http_client(server.http_port, certs.ca) as client:
        assert client.is_server_live()
        assert answered(client.infer("identity", [infer_input(triton_http)])) == [[0.0, 1.0, 2.0, 3.0]]
    grpc_address = f"127.0.0.1:{server.grpc_port}"
    with triton_grpc.InferenceServerClient(grpc_address, ssl=True, root_certificates=certs.ca) as grpc_client:
        assert grpc_client.is_server_live()
        assert answered(grpc_client.infer("identity", [infer_input(triton_grpc)])) == [[0.0, 1.0, 2.0, 3.0]]


def test_a_client_that_does_not_trust_the_certificate_is_refused(server: Serve, certs: Certificates) -> None:
    with http_client(server.http_port, certs.other_ca) as client, pytest.raises(ssl.SSLError, match="CERTIFICATE"):
        client.is_server_live()
    with (
        triton_grpc.InferenceServerClient(
            f"127.0.0.1:{server.grpc_port}", ssl=True, root_certificates=certs.other_ca
        ) as grpc_client,
        pytest.raises(InferenceServerException, match="UNAVAILABLE"),
    ):
        grpc_client.is_server_live(client_timeout=10)


def test_plain_text_to_a_tls_port_fails_cleanly(certs: Certificates, capfd: pytest.CaptureFixture[str]) -> None:
    with tls_server(certs, log_level="INFO") as serve:
        with (
            triton_http.InferenceServerClient(f"127.0.0.1:{serve.http_port}") as plain,
            pytest.raises(Exception),  # noqa: B017 - geventhttpclient's own kind of "connection closed"
        ):
            plain.is_server_live()
        # Bytes that are not a TLS handshake: the connection closes without an HTTP answer.
        with socket.create_connection(("127.0.0.1", serve.http_port), timeout=10) as sock:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nhost: test\r\n\r\n")
            assert not sock.recv(1024).startswith(b"HTTP/")
        with (
            triton_grpc.InferenceServerClient(f"127.0.0.1:{serve.grpc_port}") as plain_grpc,
            pytest.raises(InferenceServerException, match="UNAVAILABLE"),
        ):
            plain_grpc.is_server_live(client_timeout=10)
        # The server goes on serving TLS.
        with http_client(serve.http_port, certs.ca) as client:
            assert client.is_server_live()
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err


def test_mutual_tls_wants_a_client_certificate(certs: Certificates) -> None:
    with tls_server(certs, tls_client_ca=certs.ca) as serve:
        with http_client(serve.http_port, certs.ca) as anonymous, pytest.raises(Exception):  # noqa: B017
            anonymous.is_server_live()  # the handshake or the first read fails: the server wants a certificate
        with http_client(serve.http_port, certs.ca, certs.client_cert, certs.client_key) as client:
            assert client.is_server_live()
            assert answered(client.infer("identity", [infer_input(triton_http)])) == [[0.0, 1.0, 2.0, 3.0]]
        address = f"127.0.0.1:{serve.grpc_port}"
        with (
            triton_grpc.InferenceServerClient(address, ssl=True, root_certificates=certs.ca) as anonymous_grpc,
            pytest.raises(InferenceServerException, match="UNAVAILABLE"),
        ):
            anonymous_grpc.is_server_live(client_timeout=10)
        with triton_grpc.InferenceServerClient(
            address,
            ssl=True,
            root_certificates=certs.ca,
            private_key=certs.client_key,
            certificate_chain=certs.client_cert,
        ) as grpc_client:
            assert answered(grpc_client.infer("identity", [infer_input(triton_grpc)])) == [[0.0, 1.0, 2.0, 3.0]]


def test_the_metrics_page_is_plain_unless_listed(server: Serve, certs: Certificates) -> None:
    assert server.metrics_url.startswith("http://")
    with urllib.request.urlopen(server.metrics_url, timeout=10) as page:
        assert page.status == 200
    with tls_server(certs, tls_endpoints=("http", "metrics")) as serve:
        trusting = ssl.create_default_context(cafile=certs.ca)
        assert serve.metrics_url.startswith("https://")
        with urllib.request.urlopen(serve.metrics_url, context=trusting, timeout=10) as page:
            assert b"nv_inference_request_success" in page.read()
        # gRPC left out: plain text there.
        with triton_grpc.InferenceServerClient(f"127.0.0.1:{serve.grpc_port}") as plain_grpc:
            assert plain_grpc.is_server_live()


def test_the_custom_routes_serve_tls_too(server: Serve, certs: Certificates) -> None:
    trusting = ssl.create_default_context(cafile=certs.ca)
    assert server.routes_url.startswith("https://") and server.url.startswith("https://")
    with urllib.request.urlopen(f"{server.routes_url}/hello", context=trusting, timeout=10) as page:
        assert page.read() == b'{"hello":"tls"}'
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"http://127.0.0.1:{server.routes_port}/hello", timeout=10)


def test_files_that_cannot_serve_fail_the_start(certs: Certificates, tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    missing = str(tmp_path / "missing.pem")
    with pytest.raises(ServerError, match=r"TLS: cannot load tls_certfile .*missing\.pem.*: No such file"):
        tls_server(Certificates(**{**vars(certs), "server_cert": missing})).run()
    with pytest.raises(ServerError, match=r"TLS: cannot load tls_certfile .* with tls_keyfile .*KEY_VALUES_MISMATCH"):
        tls_server(Certificates(**{**vars(certs), "server_key": certs.client_key})).run()
    key = serialization.load_pem_private_key(Path(certs.server_key).read_bytes(), None)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(
        key.private_bytes(  # type: ignore[union-attr]
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"passphrase"),
        )
    )
    with pytest.raises(ServerError, match="is encrypted; pyserve takes no passphrase"):
        tls_server(Certificates(**{**vars(certs), "server_key": str(encrypted)})).run()
    with pytest.raises(ServerError, match=r"TLS: cannot load tls_client_ca .*missing\.pem"):
        tls_server(certs, tls_client_ca=missing).run()


def test_grpc_without_a_certificate_is_refused_by_a_plain_channel(server: Serve) -> None:
    # A plain-text gRPC channel to the TLS port never reaches a method.
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        live = channel.unary_unary("/inference.GRPCInferenceService/ServerLive")
        with pytest.raises(grpc.RpcError) as info:
            live(b"", timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_the_asgi_apps_relay_reaches_a_tls_and_restricted_http_port(certs: Certificates) -> None:
    pytest.importorskip("starlette")

    async def get(app: Any, path: str) -> int:
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "GET", "path": path, "headers": [], "query_string": b"", "root_path": ""}
        await app(scope, receive, send)
        return int(sent[0]["status"])

    with tls_server(certs, http_restricted_api=("health,metadata:admin-key=a1",)) as serve:
        app = serve.asgi_app()
        # The relay goes over TLS and carries the header: the mounting application decides who may call it.
        assert asyncio.run(get(app, "/v2/health/ready")) == 200
        assert asyncio.run(get(app, "/v2/models/identity")) == 200


# pyserve's own clients ---------------------------------------------------------------------------------------------


def tls_urls(serve: Serve) -> list[str]:
    return [serve.url, f"grpcs://127.0.0.1:{serve.grpc_port}"]


def test_pyserve_clients_over_https_and_grpcs(server: Serve, certs: Certificates) -> None:
    assert server.url.startswith("https://")
    x = np.arange(4, dtype=np.float32)
    for url in tls_urls(server):
        with ModelClient(url, "identity", tls=ClientTls(ca_file=certs.ca), lazy_init=False) as client:
            assert client.url == url
            for step in range(3):
                assert client.infer_sample(INPUT0=x + step)["OUTPUT0"].tolist() == (x + step).tolist()
            assert client.infer_batch(INPUT0=np.stack([x, x]))["OUTPUT0"].shape == (2, 4)
        with FuturesModelClient(url, "identity", tls=ClientTls(ca_file=certs.ca)) as futures:
            assert futures.infer_sample(INPUT0=x).result(30)["OUTPUT0"].tolist() == x.tolist()

    async def asyncio_calls(url: str) -> list[float]:
        async with AsyncioModelClient(url, "identity", tls=ClientTls(ca_file=certs.ca)) as client:
            answers = await asyncio.gather(*(client.infer_sample(INPUT0=x + step) for step in range(4)))
        return [float(answer["OUTPUT0"][0]) for answer in answers]

    for url in tls_urls(server):
        assert asyncio.run(asyncio_calls(url)) == [0.0, 1.0, 2.0, 3.0]


def test_pyserve_http_client_keeps_its_tls_connection(server: Serve, certs: Certificates) -> None:
    # A TLS 1.3 server sends session tickets after the handshake: an idle connection whose socket reads as ready
    # with only those must still count as open, not be replaced before every call.
    with ModelClient(server.url, "identity", tls=ClientTls(ca_file=certs.ca), lazy_init=False) as client:
        client.infer_sample(INPUT0=np.zeros(2, np.float32))
        pool = client._transport._idle  # type: ignore[attr-defined]
        assert len(pool) == 1
        first = pool[0]
        assert first.sock.version() in ("TLSv1.2", "TLSv1.3")
        for _ in range(5):
            client.infer_sample(INPUT0=np.zeros(2, np.float32))
            assert list(pool) == [first]


def refusal(url: str, tls: ClientTls | None) -> str:
    """What a pyserve client that cannot get through to ``url`` says (within a second)."""
    with (
        ModelClient(url, "identity", tls=tls, init_timeout_s=1) as client,
        pytest.raises((ServerUnreachableError, ClientTimeoutError)) as refused,
    ):
        client.wait_for_server(1)
    return str(refused.value)


def test_pyserve_clients_refuse_an_untrusted_certificate(server: Serve, certs: Certificates) -> None:
    untrusted = ClientTls(ca_file=certs.other_ca)
    assert "CERTIFICATE_VERIFY_FAILED" in refusal(server.url, untrusted)
    refusal(f"grpcs://127.0.0.1:{server.grpc_port}", untrusted)
    refusal(server.url.replace("https", "http"), None)  # plain text to a TLS port


def test_pyserve_clients_with_a_client_certificate(certs: Certificates) -> None:
    with tls_server(certs, tls_client_ca=certs.ca) as serve:
        mutual = ClientTls(ca_file=certs.ca, cert_file=certs.client_cert, key_file=certs.client_key)
        for url in tls_urls(serve):
            with ModelClient(url, "identity", tls=mutual) as client:
                assert client.infer_sample(INPUT0=np.ones(3, np.float32))["OUTPUT0"].tolist() == [1.0, 1.0, 1.0]
            refusal(url, ClientTls(ca_file=certs.ca))  # no certificate of its own


def test_client_tls_settings_are_checked(certs: Certificates) -> None:
    with pytest.raises(ConfigError, match="https:// or grpcs://"):
        ModelClient("http://127.0.0.1:1", "m", tls=ClientTls(ca_file=certs.ca))
    with pytest.raises(ConfigError, match="both cert_file and key_file"):
        ClientTls(cert_file=certs.client_cert)
    with pytest.raises(ConfigError, match="not a readable file"):
        ClientTls(ca_file=certs.ca + ".missing")
    with pytest.raises(ConfigError, match="scheme must be"):
        ModelClient("ftp://127.0.0.1:1", "m")


def test_pyserve_bench_over_https_and_grpcs_with_a_client_certificate(certs: Certificates, tmp_path: Path) -> None:
    with tls_server(certs, tls_client_ca=certs.ca) as serve:
        for url in tls_urls(serve):
            run = subprocess.run(
                pyserve_command(
                    "bench", "identity", "--url", url, "--shape", "INPUT0:4", "--concurrency", "2",
                    "--warmup", "0.2s", "--window", "0.3s", "--duration", "1s", "--output", "out.json",
                    "--tls-ca-file", certs.ca, "--tls-client-cert", certs.client_cert,
                    "--tls-client-key", certs.client_key,
                ),
                cwd=tmp_path, env=clean_environment(), capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert run.returncode == 0, run.stderr
            (step,) = json.loads((tmp_path / "out.json").read_text())["steps"]
            assert step["failures"] == 0 and step["throughput_infer_per_s"] > 10
            assert step["server"]["compute_infer_us"] > 0  # the statistics were read over TLS too
        # Without the client certificate: every request fails, and the run says so.
        settings = BenchSettings(
            model="identity", url=serve.url, levels=levels_of([1]), shapes={"INPUT0": (4,)},
            warmup_s=0.1, window_s=0.2, duration_s=0.5, tls=ClientTls(ca_file=certs.ca),
        )  # fmt: skip
        with pytest.raises(ServerUnreachableError):
            run_bench(settings, Progress(None))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_pyserve_tune_drives_a_tls_server(certs: Certificates, protocol: str) -> None:
    # tune starts the Serve with its own ServeConfig (TLS and mutual TLS included) and reaches it over TLS.
    settings = TuneSettings(
        slo_p99_ms=500.0,
        bench=BenchSettings(
            model="identity", shapes={"INPUT0": (4,)}, warmup_s=0.1, window_s=0.2, duration_s=0.6,
            tls=ClientTls(ca_file=certs.ca, cert_file=certs.client_cert, key_file=certs.client_key),
        ),
        max_instances=1, kinds=("thread",), queue_delays_us=(0,), preferred=False, budget_s=60.0,
        concurrency=(2,), protocol=protocol,
    )  # fmt: skip
    report = run_tune(ModelUnderTune.from_serve(tls_server(certs, tls_client_ca=certs.ca), None), settings)
    assert report.trials and all(trial.evaluation.error is None for trial in report.trials)
    assert report.winner is not None and report.winner.evaluation.score > 10


def test_remote_serve_finds_the_remote_port_through_https(certs: Certificates) -> None:
    token = "a-test-token-" + "x" * 32
    with tls_server(certs, remote_port=0, remote_token=token) as serve:
        with RemoteServe(serve.url, token=token, tls=ClientTls(ca_file=certs.ca)) as remote:
            remote.bind("doubled", lambda requests: [{"OUTPUT0": r["INPUT0"] * 2} for r in requests],
                        [Tensor("INPUT0", np.float32, (-1,))], [Tensor("OUTPUT0", np.float32, (-1,))])  # fmt: skip
            remote.run()
            with ModelClient(serve.url, "doubled", tls=ClientTls(ca_file=certs.ca)) as client:
                assert client.infer_sample(INPUT0=np.ones(2, np.float32))["OUTPUT0"].tolist() == [2.0, 2.0]
        with pytest.raises(ServerError, match="CERTIFICATE_VERIFY_FAILED"):
            RemoteServe(serve.url, token=token).run()  # the system's authorities do not know the test CA
