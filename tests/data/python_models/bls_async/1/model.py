"""Triton Python-backend BLS model with ``async def execute``: three async_exec() calls in flight together, two to
add_sub (the second with its inputs swapped) and one streaming from the decoupled 'square_async'."""

import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            forward = pb_utils.InferenceRequest(
                model_name="add_sub", requested_output_names=["OUTPUT0"], inputs=[in0, in1]
            )
            swapped = pb_utils.InferenceRequest(
                model_name="add_sub",
                requested_output_names=["OUTPUT1"],
                inputs=[pb_utils.Tensor("INPUT0", in1.as_numpy()), pb_utils.Tensor("INPUT1", in0.as_numpy())],
            )
            squares = pb_utils.InferenceRequest(
                model_name="square_async",
                requested_output_names=["OUT"],
                inputs=[pb_utils.Tensor("IN", np.array([4], np.int32))],
            )
            total, difference, stream = await asyncio.gather(
                forward.async_exec(), swapped.async_exec(), squares.async_exec(decoupled=True)
            )
            for answer in (total, difference):
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
            values = [int(pb_utils.get_output_tensor_by_name(r, "OUT").as_numpy()[0]) for r in stream]
            rows = len(in0.as_numpy())
            outputs = [
                pb_utils.get_output_tensor_by_name(total, "OUTPUT0"),
                pb_utils.get_output_tensor_by_name(difference, "OUTPUT1"),
                pb_utils.Tensor("SQUARES", np.tile(np.array(values, np.int32), (rows, 1))),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
