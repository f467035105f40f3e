"""Triton Python-backend model that reports what it was given: initialize's args, and per request its id,
parameters, requested outputs and inputs (REPORT, JSON); OUTPUT0 is INPUT0 passed through DLPack. finalize() writes
the file named by the config parameter FINALIZE_MARKER."""

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = args
        model_config = json.loads(args["model_config"])
        self.marker = Path(model_config["parameters"]["FINALIZE_MARKER"]["string_value"])
        self.input_type = pb_utils.get_input_config_by_name(model_config, "INPUT0")["data_type"]
        pb_utils.Logger.log_info(f"initialized {args['model_name']}")

    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            report = {
                "args": {key: value for key, value in self.args.items() if key != "model_config"},
                "input_type": self.input_type,
                "request_id": request.request_id(),
                "parameters": json.loads(request.parameters()),
                "requested": request.requested_output_names(),
                "inputs": [tensor.name() for tensor in request.inputs()],
                "cancelled": request.is_cancelled(),
                "is_cpu": values.is_cpu(),
            }
            passed = pb_utils.Tensor.from_dlpack("OUTPUT0", values.to_dlpack())
            text = pb_utils.Tensor("REPORT", np.array([json.dumps(report).encode()], dtype=np.object_))
            responses.append(pb_utils.InferenceResponse(output_tensors=[passed, text]))
        return responses

    def finalize(self):
        self.marker.write_text("finalized")
