"""Triton Python-backend model answering with errors: a negative input gets TritonError("bad"), an all-zero input
an INVALID_ARG error, an input over 100 makes execute() raise; anything else is echoed."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if (values < 0).any():
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("bad")))
            elif not values.any():
                error = pb_utils.TritonError("zero is not an argument", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
            elif (values > 100).any():
                raise pb_utils.TritonModelException(f"too large: {values.max()}")
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", values)]))
        return responses
