"""Triton Python-backend model: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1.

The output datatypes come from the model configuration, read in initialize() as Triton models do.
"""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        for name in ("INPUT0", "INPUT1"):
            auto_complete_model_config.add_input({"name": name, "data_type": "TYPE_FP32", "dims": [-1]})
        auto_complete_model_config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]})
        auto_complete_model_config.add_output({"name": "OUTPUT1", "data_type": "TYPE_INT32", "dims": [-1]})
        auto_complete_model_config.set_max_batch_size(8)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def initialize(self, args):
        model_config = json.loads(args["model_config"])
        self.output_dtypes = {}
        for name in ("OUTPUT0", "OUTPUT1"):
            output_config = pb_utils.get_output_config_by_name(model_config, name)
            self.output_dtypes[name] = pb_utils.triton_string_to_numpy(output_config["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            total = pb_utils.Tensor("OUTPUT0", (in0 + in1).astype(self.output_dtypes["OUTPUT0"]))
            difference = pb_utils.Tensor("OUTPUT1", (in0 - in1).astype(self.output_dtypes["OUTPUT1"]))
            responses.append(pb_utils.InferenceResponse(output_tensors=[total, difference]))
        return responses

    def finalize(self):
        pb_utils.Logger.log_info("add_sub: finalize")
