"""The committed protobuf / gRPC stubs match the .proto files, and the protocol matches Triton's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from tritonclient.grpc import model_config_pb2 as triton_model_config
from tritonclient.grpc import service_pb2 as triton_service

from pyserve.frontends.protocol import POOL, grpc_service_pb2, model_config_pb2

PROTOCOL = Path("pyserve") / "frontends" / "protocol"


def test_committed_stubs_match_a_fresh_generation(repo_root: Path, tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (test extras) regenerates the stubs")
    bash = shutil.which("bash")
    assert bash is not None
    run = subprocess.run(
        [bash, str(repo_root / "scripts" / "gen_protos.sh"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHON": sys.executable},  # the interpreter that has grpcio-tools
    )
    assert run.returncode == 0, run.stdout + run.stderr
    generated = sorted(p.relative_to(tmp_path) for p in (tmp_path / PROTOCOL).glob("*_pb2*"))
    committed = sorted(p.relative_to(repo_root) for p in (repo_root / PROTOCOL).glob("*_pb2*"))
    assert generated == committed
    for path in generated:
        fresh = (tmp_path / path).read_text()
        assert fresh == (repo_root / path).read_text(), f"{path} is stale: run scripts/gen_protos.sh"


def _fields(module: object) -> dict[str, object]:
    """Every message, field and enum value of a generated module's file: names, numbers, types, labels."""
    proto = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(proto)  # type: ignore[attr-defined]
    out: dict[str, object] = {}

    def walk(prefix: str, message: descriptor_pb2.DescriptorProto) -> None:
        for field in message.field:
            type_name = field.type_name.rsplit(".", 1)[-1]
            out[f"{prefix}{message.name}.{field.name}"] = (field.number, field.type, field.label, type_name)
        for nested in message.nested_type:
            walk(f"{prefix}{message.name}.", nested)
        for enum in message.enum_type:
            for value in enum.value:
                out[f"{prefix}{message.name}.{enum.name}.{value.name}"] = value.number

    for message in proto.message_type:
        walk("", message)
    for enum in proto.enum_type:
        for value in enum.value:
            out[f"{enum.name}.{value.name}"] = value.number
    for service in proto.service:
        for method in service.method:
            out[f"{service.name}/{method.name}"] = (
                method.input_type.rsplit(".", 1)[-1],
                method.output_type.rsplit(".", 1)[-1],
                method.client_streaming,
                method.server_streaming,
            )
    return out


@pytest.mark.parametrize(
    ("ours", "tritons"), [(grpc_service_pb2, triton_service), (model_config_pb2, triton_model_config)]
)
def test_the_protocol_is_tritons_field_for_field(ours: object, tritons: object) -> None:
    assert _fields(ours) == _fields(tritons)


def test_messages_live_in_pyserves_own_pool() -> None:
    # tritonclient registers the same names in protobuf's default pool; both load in one process.
    assert POOL.FindMessageTypeByName("inference.ModelInferRequest") is grpc_service_pb2.ModelInferRequest.DESCRIPTOR
    assert grpc_service_pb2.DESCRIPTOR.package == "inference"


@pytest.mark.parametrize("implementation", ["python", "upb"])
def test_pyserves_messages_and_tritonclients_share_a_process(implementation: str) -> None:
    # Either import order, under both protobuf implementations (the pure-Python one, which some libraries switch
    # on through the environment, registers generated messages in the default pool unless told otherwise).
    code = (
        "import sys\n"
        "first, second = sys.argv[1:]\n"
        "__import__(first); __import__(second)\n"
        "from google.protobuf.internal import api_implementation\n"
        "from pyserve.frontends.protocol import grpc_service_pb2 as ours\n"
        "from tritonclient.grpc import service_pb2 as theirs\n"
        "wire = ours.ModelInferRequest(model_name='m', id='1').SerializeToString()\n"
        "assert theirs.ModelInferRequest.FromString(wire).model_name == 'm'\n"
        "print(api_implementation.Type())\n"
    )
    env = {**os.environ, "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": implementation}
    modules = ["pyserve.frontends.protocol.grpc_service_pb2", "tritonclient.grpc"]
    for order in (modules, modules[::-1]):
        run = subprocess.run(
            [sys.executable, "-c", code, *order], capture_output=True, text=True, timeout=60, env=env, check=False
        )
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.strip() == implementation
