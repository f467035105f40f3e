"""Triton Python-backend model that is not decoupled but answers through its response senders (execute returns
None): one response with the final flag per request, OUTPUT0 = INPUT0 * 2."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            response = pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", values * 2)])
            request.get_response_sender().send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
