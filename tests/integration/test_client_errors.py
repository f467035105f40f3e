"""The error's class crosses the wire beside Triton's error shape, and pyserve's client rebuilds exactly it."""

from __future__ import annotations

import grpc
import numpy as np
import orjson
import pytest
import tritonclient.grpc as triton_grpc

from pyserve import Serve
from pyserve.client import ModelClient
from pyserve.errors import ERROR_KIND_HEADER, ModelExecutionError, OutputMismatchError

from .conftest import RawHttp

pytestmark = pytest.mark.integration

WRONG_DTYPE_DOC = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}]}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_output_mismatch_is_not_taken_for_a_model_execution_error(server: Serve, protocol: str) -> None:
    # Both are 500 / INTERNAL, and the message has no words that tell them apart: only the named kind can.
    url = server.url if protocol == "http" else f"grpc://{server.grpc_address}"
    with ModelClient(url, "strict_dtype", init_timeout_s=30) as client, pytest.raises(ModelExecutionError) as info:
        client.infer_sample(np.ones(2, np.float32))
    assert type(info.value) is OutputMismatchError


def test_an_http_error_answer_names_its_kind_in_a_header(raw_http: RawHttp) -> None:
    response = raw_http.infer("strict_dtype", WRONG_DTYPE_DOC)
    assert response.status == 500 and "error" in response.json()
    assert response.headers[ERROR_KIND_HEADER] == "OutputMismatchError"
    not_found = raw_http.request("POST", "/v2/models/no_such_model/infer", orjson.dumps(WRONG_DTYPE_DOC))
    assert not_found.status == 404 and not_found.headers[ERROR_KIND_HEADER] == "ModelNotFoundError"


def test_a_grpc_error_names_its_kind_in_trailing_metadata(server: Serve) -> None:
    request = triton_grpc.service_pb2.ModelInferRequest(model_name="strict_dtype")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 2])
    request.raw_input_contents.append(np.ones(2, np.float32).tobytes())
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = triton_grpc.service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert (ERROR_KIND_HEADER, "OutputMismatchError") in tuple(info.value.trailing_metadata())
