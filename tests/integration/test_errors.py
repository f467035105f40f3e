"""Errors reach tritonclient as InferenceServerException with Triton's status codes and pyserve's message."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.integration


def make_input(name: str, data: np.ndarray, datatype: str = "FP32") -> triton_http.InferInput:
    infer_input = triton_http.InferInput(name, list(data.shape), datatype)
    infer_input.set_data_from_numpy(data)
    return infer_input


ROW = np.array([[1.0, 2.0, 3.0]], np.float32)


def infer_error(
    client: triton_http.InferenceServerClient, model: str, inputs: list[triton_http.InferInput], **kwargs: object
) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        client.infer(model, inputs, **kwargs)
    return info.value


# unknown models and versions ---------------------------------------------------------------------------------


def test_unknown_model(client: triton_http.InferenceServerClient) -> None:
    error = infer_error(client, "no_such_model", [make_input("INPUT0", ROW)])
    assert error.status() == "404"
    assert "no_such_model" in error.message()
    for call in (client.get_model_metadata, client.get_model_config):
        with pytest.raises(InferenceServerException) as info:
            call("no_such_model")
        assert info.value.status() == "404"
        assert "no_such_model" in info.value.message()
    # Triton answers 400 (not 404) for statistics of an unknown model.
    with pytest.raises(InferenceServerException) as info:
        client.get_inference_statistics("no_such_model")
    assert info.value.status() == "400"
    assert "no_such_model" in info.value.message()


def test_unknown_version(client: triton_http.InferenceServerClient) -> None:
    error = infer_error(client, "identity_fp32", [make_input("INPUT0", ROW)], model_version="7")
    assert error.status() == "404"
    assert "7" in error.message()
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("identity_fp32", model_version="7")
    assert info.value.status() == "404"
    with pytest.raises(InferenceServerException) as info:
        client.get_model_config("identity_fp32", model_version="abc")
    assert info.value.status() == "404"


# inputs that do not match the model ---------------------------------------------------------------------------


def test_wrong_datatype(client: triton_http.InferenceServerClient) -> None:
    error = infer_error(client, "identity_fp32", [make_input("INPUT0", ROW.astype(np.int32), "INT32")])
    assert error.status() == "400"
    assert error.message() == "input 'INPUT0': expected datatype FP32, got INT32"


def test_wrong_shape_without_batching(client: triton_http.InferenceServerClient) -> None:
    error = infer_error(client, "no_batch", [make_input("INPUT0", np.zeros((3, 2), np.int32), "INT32")])
    assert error.status() == "400"
    assert "expected shape [2,3]" in error.message() and "[3, 2]" in error.message()
    ok = client.infer("no_batch", [make_input("INPUT0", np.arange(6, dtype=np.int32).reshape(2, 3), "INT32")])
    np.testing.assert_array_equal(ok.as_numpy("OUTPUT0"), np.arange(6).reshape(2, 3) * 10)


def test_missing_batch_dimension(client: triton_http.InferenceServerClient) -> None:
    error = infer_error(client, "identity_fp32", [make_input("INPUT0", ROW[0])])
    assert error.status() == "400"
    assert "batch dimension" in error.message()


def test_missing_input(client: triton_http.InferenceServerClient) -> None:
    error = infer_error(client, "add_sub", [make_input("INPUT0", ROW)])
    assert error.status() == "400"
    assert "missing required input(s) ['INPUT1']" in error.message()


def test_extra_input(client: triton_http.InferenceServerClient) -> None:
    inputs = [make_input("INPUT0", ROW), make_input("INPUT1", ROW), make_input("INPUT2", ROW)]
    error = infer_error(client, "add_sub", inputs)
    assert error.status() == "400"
    assert "unexpected inference input 'INPUT2'" in error.message()


def test_batch_larger_than_max_batch_size(client: triton_http.InferenceServerClient) -> None:
    error = infer_error(client, "identity_fp32", [make_input("INPUT0", np.zeros((17, 2), np.float32))])
    assert error.status() == "400"
    assert "batch size 17 exceeds max_batch_size 16" in error.message()
    ok = client.infer("identity_fp32", [make_input("INPUT0", np.ones((16, 2), np.float32))])
    assert ok.as_numpy("OUTPUT0").shape == (16, 2)


def test_batch_sizes_of_inputs_must_agree(client: triton_http.InferenceServerClient) -> None:
    inputs = [make_input("INPUT0", np.zeros((2, 3), np.float32)), make_input("INPUT1", np.zeros((3, 3), np.float32))]
    error = infer_error(client, "add_sub", inputs)
    assert error.status() == "400"
    assert "batch size" in error.message()


def test_optional_input(client: triton_http.InferenceServerClient) -> None:
    only_required = client.infer("optional", [make_input("INPUT0", ROW)])
    np.testing.assert_array_equal(only_required.as_numpy("OUTPUT0"), ROW)
    assert only_required.as_numpy("HAD_INPUT1").tolist() == [[False]]
    both = client.infer("optional", [make_input("INPUT0", ROW), make_input("INPUT1", ROW * 10)])
    np.testing.assert_array_equal(both.as_numpy("OUTPUT0"), ROW * 11)
    assert both.as_numpy("HAD_INPUT1").tolist() == [[True]]
    error = infer_error(client, "optional", [make_input("INPUT1", ROW)])
    assert error.status() == "400"
    assert "INPUT0" in error.message()


def test_reserved_triton_parameter(client: triton_http.InferenceServerClient) -> None:
    error = infer_error(client, "identity_fp32", [make_input("INPUT0", ROW)], parameters={"triton_secret": 1})
    assert error.status() == "400"
    assert "triton_secret" in error.message() and "reserved" in error.message()


# the model's own failures -------------------------------------------------------------------------------------


def test_model_exception_is_500_with_traceback_and_server_recovers(client: triton_http.InferenceServerClient) -> None:
    error = infer_error(client, "raises", [make_input("INPUT0", np.array([[1.0, -2.5]], np.float32))])
    assert error.status() == "500"
    assert "ValueError" in error.message()
    assert "negative input seen: -2.5" in error.message()
    assert "Traceback" in error.message()
    result = client.infer("raises", [make_input("INPUT0", ROW)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ROW)


def test_strict_model_wrong_output_dtype(client: triton_http.InferenceServerClient) -> None:
    error = infer_error(client, "strict_dtype", [make_input("INPUT0", ROW)])
    assert error.status() == "500"
    assert "output 'OUTPUT0'" in error.message()
    assert "float64" in error.message()


def test_strict_model_wrong_output_shape(client: triton_http.InferenceServerClient) -> None:
    error = infer_error(client, "strict_shape", [make_input("INPUT0", ROW)])
    assert error.status() == "500"
    assert "output 'OUTPUT0'" in error.message()
    assert "expected shape [-1, 3], got [1, 4]" in error.message()


def test_decoupled_model_over_http_infer_is_501(client: triton_http.InferenceServerClient) -> None:
    error = infer_error(client, "decoupled", [make_input("INPUT0", ROW)])
    assert error.status() == "501"
    assert "decoupled" in error.message()
    assert client.get_model_config("decoupled")["model_transaction_policy"] == {"decoupled": True}
