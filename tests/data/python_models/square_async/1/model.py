"""Triton Python-backend decoupled model with ``async def execute``: for IN = [n], asyncio tasks send OUT = [i * i]
for i in 0 .. n - 1, then the final flag."""

import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.tasks = set()

    async def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            task = asyncio.get_running_loop().create_task(self.respond(request.get_response_sender(), count))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return None

    async def respond(self, sender, count):
        for index in range(count):
            await asyncio.sleep(0.01)
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([index * index], np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
