"""Triton Python-backend BLS model: calls the model named by MODEL_NAME (an add_sub) with exec(), and the decoupled
'repeat' model with exec(decoupled=True); a failed call is answered with an error naming its code."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            target = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy().flat[0].decode()
            call = pb_utils.InferenceRequest(
                model_name=target,
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[
                    pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                    pb_utils.get_input_tensor_by_name(request, "INPUT1"),
                ],
            )
            answer = call.exec()
            if answer.has_error():
                error = answer.error()
                message = f"BLS call to '{target}' failed (code {error.code()}): {error.message()}"
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)))
                continue
            stream = pb_utils.InferenceRequest(
                model_name="repeat",
                requested_output_names=["OUT"],
                inputs=[pb_utils.Tensor("IN", np.array([3], np.int32))],
            ).exec(decoupled=True)
            streamed = []
            for response in stream:
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                streamed.append(int(pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()[0]))
            rows = len(answer.output_tensors()[0].as_numpy())
            outputs = [
                pb_utils.get_output_tensor_by_name(answer, "OUTPUT0"),
                pb_utils.get_output_tensor_by_name(answer, "OUTPUT1"),
                pb_utils.Tensor("STREAMED", np.tile(np.array(streamed, np.int32), (rows, 1))),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
