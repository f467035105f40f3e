"""Triton Python-backend decoupled model: for IN = [n], sends n responses OUT = [0] ... [n - 1] from a thread, then
the final flag. A negative n is answered with an error response."""

import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(model_config):
            raise pb_utils.TritonModelException(f"model '{args['model_name']}' must be decoupled")
        self.threads = []

    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            thread = threading.Thread(target=self.respond, args=(sender, count), daemon=True)
            thread.start()
            self.threads.append(thread)
        return None

    def respond(self, sender, count):
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if count < 0:
            error = pb_utils.TritonError(f"count must be >= 0, got {count}", pb_utils.TritonError.INVALID_ARG)
            sender.send(pb_utils.InferenceResponse(error=error), flags=final)
            return
        for index in range(count):
            time.sleep(0.01)
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([index], np.int32))]))
        sender.send(flags=final)

    def finalize(self):
        for thread in self.threads:
            thread.join(timeout=5)
