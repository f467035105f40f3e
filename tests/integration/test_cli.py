"""The ``pyserve`` command: options override one field each, errors in one line, functions and Quickstart modules.

Every test runs the command in a subprocess on free ports (``--http-port 0`` ...) and kills it in a finally.
"""

from __future__ import annotations

import http.client
import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest
import tritonclient.http as triton_http

from pyserve import Serve, ServeConfig
from pyserve.errors import ServerError

from .cli_process import FREE_PORTS, SERVING_LINE, RunningCommand, pyserve_command
from .repository_models import add_python_model

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "cli"
ADD_SUB_TENSORS = (
    *("--input", "INPUT0:FP32:-1", "--input", "INPUT1:fp32:-1"),
    *("--output", "OUTPUT0:float32:-1", "--output", "OUTPUT1:FP32:-1"),
)

SMALL_LIMIT_APP = """
import numpy as np
from pyserve import Serve, ServeConfig, Tensor

def identity(requests):
    return [{"OUTPUT0": request["INPUT0"]} for request in requests]

server = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0, max_request_bytes=1000))
server.bind("identity", identity, inputs=[Tensor("INPUT0", np.float32, (-1,))],
            outputs=[Tensor("OUTPUT0", np.float32, (-1,))])
"""


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return int(probe.getsockname()[1])


def post(port: int, path: str, body: bytes) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", path, body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def identity_request(values: int) -> bytes:
    doc = {"inputs": [{"name": "INPUT0", "shape": [values], "datatype": "FP32", "data": [1.0] * values}]}
    return orjson.dumps(doc)


def is_listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port another socket listens on."""
    with socket.create_server(("127.0.0.1", 0)) as holder:
        yield int(holder.getsockname()[1])


def run_until_serving(command: RunningCommand) -> tuple[int, int, int]:
    """The HTTP, gRPC and metrics ports of the address line the command prints once it serves."""
    http_port, grpc_port, metrics_port = (int(port) for port in command.wait_for(SERVING_LINE).groups())
    return http_port, grpc_port, metrics_port


# 1. options override only the fields they name ------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_port_option_keeps_the_rest_of_the_module_config(tmp_path: Path) -> None:
    (tmp_path / "small_limit.py").write_text(SMALL_LIMIT_APP)
    wanted = free_port()
    command_line = pyserve_command("serve", "small_limit:server", "--http-port", str(wanted))
    with RunningCommand(command_line, tmp_path) as command:
        http_port, grpc_port, metrics_port = run_until_serving(command)
        assert http_port == wanted
        # The module's grpc_port=0 and metrics_port=0 stand: not ServeConfig's 8001 and 8002.
        assert grpc_port not in (0, 8001) and metrics_port not in (0, 8002)
        assert post(http_port, "/v2/models/identity/infer", identity_request(4))[0] == 200
        status, body = post(http_port, "/v2/models/identity/infer", identity_request(500))
        assert status == 413, body
        command.terminate()
        assert command.finish() == 0


# 2. a port that cannot be bound: named in one line, no traceback ---------------------------------------------------


@pytest.mark.timeout(90)
@pytest.mark.parametrize("listener", ["HTTP", "gRPC", "metrics"])
def test_busy_port_is_one_line_naming_the_listener(listener: str, busy_port: int) -> None:
    option = {"HTTP": "--http-port", "gRPC": "--grpc-port", "metrics": "--metrics-port"}[listener]
    ports = {"--http-port": "0", "--grpc-port": "0", "--metrics-port": "0", option: str(busy_port)}
    command_line = pyserve_command("serve", "app:server", *(item for pair in ports.items() for item in pair))
    with RunningCommand(command_line, EXAMPLES) as command:
        assert command.finish(60) == 1
    expected = f"pyserve: error: cannot listen for {listener} on 127.0.0.1:{busy_port}: Address already in use"
    errors = [line for line in command.lines if line.startswith("pyserve: error:")]
    assert len(errors) == 1 and errors[0].startswith(expected), command.output
    assert f"({option}, ServeConfig." in errors[0]
    assert "Traceback" not in command.output, command.output


def test_serve_raises_server_error_naming_the_busy_grpc_port(busy_port: int) -> None:
    server = Serve(ServeConfig(http_port=0, grpc_port=busy_port, metrics_port=0))
    try:
        with pytest.raises(ServerError, match=rf"^cannot listen for gRPC on 127\.0\.0\.1:{busy_port}: Address already"):
            server.run()
        assert not server.is_running
    finally:
        server.stop()


def test_pyserve_errors_are_printed_without_a_traceback() -> None:
    with RunningCommand(
        pyserve_command("serve", "functions:add_sub", *ADD_SUB_TENSORS, "--max-batch-size", "-1"), EXAMPLES
    ) as command:
        assert command.finish() == 1
    assert command.lines == ["pyserve: error: max_batch_size must be >= 0, got -1"], command.output


# 5. what `pyserve serve` serves -------------------------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_function_decorated_with_batch_is_served_from_the_command_line() -> None:
    with RunningCommand(
        pyserve_command("serve", "functions:add_sub", *ADD_SUB_TENSORS, "--max-batch-size", "64", *FREE_PORTS),
        EXAMPLES,
    ) as command:
        http_port, _, _ = run_until_serving(command)
        client = triton_http.InferenceServerClient(f"127.0.0.1:{http_port}")
        a = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32)
        inputs = [triton_http.InferInput("INPUT0", [2, 3], "FP32"), triton_http.InferInput("INPUT1", [2, 3], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(a * 10)
        result = client.infer("add_sub", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 11)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a * -9)
        assert client.get_model_config("add_sub")["max_batch_size"] == 64
        client.close()
        command.terminate()
        assert command.finish() == 0


@pytest.mark.timeout(90)
def test_plain_function_is_served_under_the_model_name_given() -> None:
    tensors = ("--input", "NAME:BYTES:-1", "--output", "GREETING:bytes:-1", "--model-name", "hello")
    with RunningCommand(pyserve_command("serve", "functions:greet", *tensors, *FREE_PORTS), EXAMPLES) as command:
        http_port, _, _ = run_until_serving(command)
        doc = {"inputs": [{"name": "NAME", "shape": [2], "datatype": "BYTES", "data": ["ann", "bob"]}]}
        status, body = post(http_port, "/v2/models/hello/infer", orjson.dumps(doc))
        assert status == 200, body
        (output,) = orjson.loads(body)["outputs"]
        assert output["name"] == "GREETING" and output["data"] == ["hello ann", "hello bob"]
        command.terminate()
        assert command.finish() == 0


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (["functions:add_sub"], "functions:add_sub is a function, so pyserve needs its tensors, and no --input or "),
        (["functions:add_sub", "--input", "INPUT0:FP32"], "and no --output was given: pass --input NAME:DTYPE"),
        (["app:server", "--input", "x:FP32"], "--input: only for serving a function, but app:server is a Serve"),
        (["functions:nothing"], "module 'functions' has no attribute 'nothing'"),
        (["no_such_module"], "cannot import 'no_such_module'"),
        (["functions:np"], "functions:np is module <module 'numpy'"),
        (["functions:greet", "--input", "x:FP99", "--output", "y:FP32"], "unknown dtype 'FP99'; use a KServe name"),
        (["functions:greet", "--input", "x:FP32:3x4", "--output", "y:FP32"], "shape '3x4' must be comma-separated"),
    ],
)
def test_what_cannot_be_served_is_a_usage_error(arguments: list[str], expected: str) -> None:
    with RunningCommand(pyserve_command("serve", *arguments), EXAMPLES) as command:
        assert command.finish() == 2
    assert expected in command.output, command.output
    assert "Traceback" not in command.output, command.output


@pytest.mark.timeout(90)
def test_quickstart_module_serves_once_and_one_sigterm_ends_it() -> None:
    with RunningCommand(pyserve_command("serve", "quickstart", *FREE_PORTS), EXAMPLES) as command:
        http_port, grpc_port, _ = run_until_serving(command)
        client = triton_http.InferenceServerClient(f"127.0.0.1:{http_port}")
        assert client.is_server_ready()
        client.close()
        command.terminate()
        assert command.finish(10) == 0
    assert sum(1 for line in command.lines if SERVING_LINE.search(line)) == 1, command.output
    assert not is_listening(http_port) and not is_listening(grpc_port)


@pytest.mark.timeout(90)
def test_module_started_on_import_is_served_until_a_signal(tmp_path: Path) -> None:
    module = SMALL_LIMIT_APP + "server.run()\n"
    (tmp_path / "started.py").write_text(module)
    with RunningCommand(pyserve_command("serve", "started"), tmp_path) as command:
        http_port, _, _ = run_until_serving(command)
        assert post(http_port, "/v2/models/identity/infer", identity_request(4))[0] == 200
        command.terminate()
        assert command.finish(10) == 0
    assert sum(1 for line in command.lines if SERVING_LINE.search(line)) == 1, command.output
    assert not is_listening(http_port)


# 6. a model repository from the command line ---------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_model_repository_is_served_with_tritonservers_flags(tmp_path: Path) -> None:
    add_python_model(tmp_path, "plus_one", offset=1.0)
    add_python_model(tmp_path, "plus_two", offset=2.0)
    flags = ("--model-repository", str(tmp_path), "--model-control-mode", "explicit", "--load-model", "plus_one")
    with RunningCommand(pyserve_command("serve", *flags, *FREE_PORTS), EXAMPLES) as command:
        http_port, _, _ = run_until_serving(command)
        client = triton_http.InferenceServerClient(f"127.0.0.1:{http_port}")
        try:
            assert client.is_model_ready("plus_one") and not client.is_model_ready("plus_two")
            client.load_model("plus_two")
            x = np.array([[1.0, 2.0]], np.float32)
            tensor = triton_http.InferInput("INPUT0", [1, 2], "FP32")
            tensor.set_data_from_numpy(x)
            np.testing.assert_array_equal(client.infer("plus_two", [tensor]).as_numpy("OUTPUT0"), x + 2.0)
        finally:
            client.close()
        command.terminate()
        assert command.finish() == 0


def test_a_missing_model_repository_is_one_line() -> None:
    with RunningCommand(pyserve_command("serve", "--model-repository", "/no/such/dir", *FREE_PORTS), EXAMPLES) as cmd:
        assert cmd.finish() == 1
    assert "model repository '/no/such/dir' is not a directory" in cmd.output, cmd.output
    assert "Traceback" not in cmd.output, cmd.output


@pytest.mark.timeout(90)
def test_a_model_that_fails_to_load_fails_the_start_unless_exit_on_error_is_off(tmp_path: Path) -> None:
    add_python_model(tmp_path, "plus_one", offset=1.0)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.pbtxt").write_text('backend: "python"\n')
    flags = ("--model-repository", str(tmp_path), *FREE_PORTS)
    with RunningCommand(pyserve_command("serve", *flags), EXAMPLES) as cmd:
        assert cmd.finish() == 1
    assert "pyserve: error: not every model of the repository loaded at start" in cmd.output, cmd.output
    assert "failed to load 'broken'" in cmd.output and "Traceback" not in cmd.output, cmd.output
    off = ("--exit-on-error", "false", "--strict-readiness", "false")
    with RunningCommand(pyserve_command("serve", *flags, *off), EXAMPLES) as command:
        http_port, _, _ = run_until_serving(command)
        client = triton_http.InferenceServerClient(f"127.0.0.1:{http_port}")
        try:
            assert client.is_server_ready() and client.is_model_ready("plus_one")
        finally:
            client.close()
        command.terminate()
        assert command.finish() == 0


def test_header_forward_patterns_are_server_options() -> None:
    from pyserve.cli import _parser, _server_options

    args = _parser().parse_args(["serve", "app:server", "--http-header-forward-pattern", "x-.*"])
    assert _server_options(args)["http_header_forward_pattern"] == "x-.*"
    assert "grpc_header_forward_pattern" not in _server_options(args)
